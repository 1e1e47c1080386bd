// A live source read on its own thread, newest frame wins (sdqes/live_reader.hpp).
#include "sdqes/live_reader.hpp"

#include <utility>

namespace sdqes {

void Arrivals::notify() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++count_;
  }
  changed_.notify_all();
}

uint64_t Arrivals::count() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

bool Arrivals::wait_after(uint64_t seen, std::chrono::steady_clock::time_point until) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_until(lock, until, [&] { return count_ != seen; });
}

void LatestFrame::handed_over() {
  changed_.notify_all();
  std::shared_ptr<Arrivals> arrivals;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    arrivals = arrivals_;
  }
  if (arrivals) arrivals->notify();
}

void LatestFrame::notify_also(std::shared_ptr<Arrivals> arrivals) {
  const std::lock_guard<std::mutex> lock(mutex_);
  arrivals_ = std::move(arrivals);
}

bool LatestFrame::ready() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return pending_.has_value() || finished_;
}

void LatestFrame::put(Frame frame) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (pending_) ++dropped_;  // the loop was still stepping on an older one: this one is newer
    pending_ = std::move(frame);
  }
  handed_over();
}

bool LatestFrame::put_waiting(Frame frame) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return !pending_ || closed_; });
    if (closed_) return false;
    pending_ = std::move(frame);
  }
  handed_over();
  return true;
}

void LatestFrame::finish(bool lost, std::exception_ptr error) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    lost_ = lost;
    error_ = std::move(error);
  }
  handed_over();
}

bool LatestFrame::closed() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

bool LatestFrame::wait_unless_closed(double seconds) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return !changed_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return closed_; });
}

bool LatestFrame::take(Frame& frame, const std::function<bool()>& stopped) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!pending_ && !finished_) {
    if (stopped()) return false;
    changed_.wait_for(lock, std::chrono::milliseconds(50));
  }
  if (pending_) {
    frame = std::move(*pending_);
    pending_.reset();
    lock.unlock();
    changed_.notify_all();  // a file's reader waits for the room
    return true;
  }
  if (error_) std::rethrow_exception(error_);
  return false;
}

void LatestFrame::close() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
}

bool LatestFrame::lost() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return lost_;
}

void LatestFrame::set_reconnection(Reconnection now) {
  const std::lock_guard<std::mutex> lock(mutex_);
  reconnection_ = now;
}

LatestFrame::Reconnection LatestFrame::reconnection() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return reconnection_;
}

int64_t LatestFrame::dropped() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

void read_live(LiveCapture& capture, const std::string& name, double period, LatestFrame& frames,
               const std::function<void(const std::string&)>& log, std::chrono::steady_clock::time_point start,
               const std::vector<double>& delays, const std::shared_ptr<Cameras>& cameras, size_t camera) {
  const auto wait = [&frames](double seconds) { return frames.wait_unless_closed(seconds); };
  int64_t next_sample = 0;  // the first sample time k * period not yet served
  bool lost = false;
  std::exception_ptr error;
  try {
    while (!frames.closed()) {
      if (capture.grab()) {
        LatestFrame::Frame frame;
        frame.stamp = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const int64_t served = samples_served(frame.stamp, next_sample, period);
        if (served == 0) continue;  // between two sample times: not decoded
        next_sample += served;      // the sample times a stall missed are skipped, never stepped on a stale frame
        if (capture.retrieve(frame.image) && !frame.image.empty()) {
          prepare_on_this_thread(capture.prepare, frame);
          frames.put(std::move(frame));
          continue;
        }
      }
      // No frame (a camera unplugged, a stream's server gone, a frame that would not decode): reopen with back-off.
      frames.set_reconnection({true, false});
      std::function<bool()> keep_trying;  // none: given up once the back-off is spent
      if (cameras) keep_trying = [&cameras] { return !cameras->all_lost(); };
      const auto spent = [&] {
        frames.set_reconnection({true, true});
        if (cameras) cameras->lost(camera);
      };
      if (reconnect(name, capture.reopen, wait, log, delays, keep_trying, spent) == 0) {
        lost = !frames.closed();  // not lost when the loop closed it while it waited
        break;
      }
      frames.set_reconnection({});
      if (cameras) cameras->found(camera);
    }
  } catch (...) {  // a thread's exception would end the process: the loop raises it instead
    error = std::current_exception();
  }
  frames.finish(lost, error);
}

void Cameras::lost(size_t camera) {
  const std::lock_guard<std::mutex> lock(mutex_);
  lost_.insert(camera);
}

void Cameras::found(size_t camera) {
  const std::lock_guard<std::mutex> lock(mutex_);
  lost_.erase(camera);
}

bool Cameras::all_lost() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return lost_.size() >= count_;
}

void prepare_on_this_thread(const PrepareFrame& prepare, LatestFrame::Frame& frame) {
  if (!prepare) return;
  frame.prepared = prepare(frame.image);
  frame.image.release();  // what the step takes is made: the decoded frame is not needed again
}

FrameReader::FrameReader(std::function<void(LatestFrame&)> read) : frames_(std::make_shared<LatestFrame>()) {
  std::promise<void> ended;
  ended_ = ended.get_future();
  // The thread holds what it uses: one left inside a read past kReaderStopTimeoutS outlives this object.
  thread_ = std::thread([read = std::move(read), frames = frames_, ended = std::move(ended)]() mutable {
    read(*frames);
    ended.set_value();
  });
}

LiveReader::LiveReader(std::shared_ptr<LiveCapture> capture, std::string name, double period,
                       std::function<void(const std::string&)> log, std::vector<double> delays,
                       std::shared_ptr<Cameras> cameras, size_t camera)
    : FrameReader([capture = std::move(capture), name = std::move(name), period, log = std::move(log),
                   delays = std::move(delays), cameras = std::move(cameras), camera,
                   start = std::chrono::steady_clock::now()](LatestFrame& frames) {
        read_live(*capture, name, period, frames, log, start, delays, cameras, camera);
      }) {}

FrameReader::~FrameReader() {
  frames_->close();
  if (ended_.wait_for(std::chrono::duration<double>(kReaderStopTimeoutS)) == std::future_status::ready) {
    thread_.join();
  } else {
    thread_.detach();  // still inside OpenCV's read (a stalled stream): the process ends without waiting for it
  }
}

}  // namespace sdqes
