// A live source read on its own thread, newest frame wins: the twin of runtime/frame_source.py's reader thread.
//
// A camera or stream keeps sending frames at its own pace whatever the engine does. Read on the thread that steps
// the engine, a step slower than the frame period leaves frames piling up in the capture's buffer (FFmpeg's, V4L2's),
// and every alert comes later than the one before. Read here, the loop always steps on the newest sampled frame, and
// the ones it had no time for are counted as dropped, as `sdqes-edge run` counts them. Each sampled frame is also
// preprocessed here (LiveCapture::prepare), so the loop's thread only steps. A video file is read on a thread of its
// own too, none dropped (sdqes/file_reader.hpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <opencv2/core.hpp>

#include "sdqes/runtime.hpp"

namespace sdqes {

// How long a reader thread may take to end once asked (it may be inside a read OpenCV blocks on, a stalled RTSP
// stream for up to FFmpeg's 30 s): past it the run ends without it (runtime/frame_source.py's READER_STOP_TIMEOUT_S).
inline constexpr double kReaderStopTimeoutS = 2.0;

// Wakes the one loop that waits for whichever of several sources hands a frame over first (sdqes/step_gathering.hpp).
// A count, not a flag: the loop reads it, looks at each source, then waits for it to change, so that a frame handed
// over between the look and the wait is not missed.
class Arrivals {
 public:
  void notify();  // a frame, or a source's end, was handed over
  uint64_t count() const;
  // Waits until the count differs from `seen`, or until `until` -> whether it does.
  bool wait_after(uint64_t seen, std::chrono::steady_clock::time_point until) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  uint64_t count_ = 0;
};

// The newest sampled frame of a live source, from the thread that reads it to the loop that steps on it: a queue of
// one. A frame not yet taken when the next arrives is replaced and counted as dropped.
class LatestFrame {
 public:
  struct Frame {
    cv::Mat image;                // BGR, as OpenCV decoded it (released once prepared)
    std::vector<float> prepared;  // the frame as the step takes it, made on the reader's thread; empty: not made
    double stamp = 0.0;           // a live frame: seconds since the run started reading, by the wall clock
    int64_t serves = 1;           // a file's frame: the sample times it serves (more where the video is slower)
  };

  // The reader's side.
  void put(Frame frame);   // replaces the frame not yet taken, counting it in dropped()
  // Waits until the frame not yet taken has been (a file's frames are never dropped) -> false, and `frame` not
  // handed over, where the loop closed meanwhile.
  bool put_waiting(Frame frame);
  // No frames after this; one not yet taken is still handed over first. lost: the source went away for good;
  // error: what the reader threw (OpenCV's exceptions), raised by take() in the loop.
  void finish(bool lost, std::exception_ptr error = nullptr);
  bool closed() const;     // the loop takes no more: the reader should end
  // Sleeps `seconds` unless the loop closes meanwhile -> false when it did (a reconnection's back-off cut short).
  bool wait_unless_closed(double seconds) const;

  // The loop's side. The next frame, waiting for it -> false once the reader finished with nothing left to hand
  // over (raising what it threw, if it did), or when `stopped()` (asked every 50 ms: a signal cannot wake a
  // condition variable).
  bool take(Frame& frame, const std::function<bool()>& stopped);
  bool ready() const;      // take() would not wait: a frame is there, or the reader has finished
  void notify_also(std::shared_ptr<Arrivals> arrivals);  // told of every frame put and of the finish
  void close();            // takes no more; wakes a reader waiting to reconnect
  bool lost() const;       // the reader ended because the source stopped sending frames and did not come back
  int64_t dropped() const;

  // A live source being reconnected (no frame since it dropped, or never opened), and whether its back-off was
  // spent in vain meanwhile while it kept trying (a camera of several): what the run's end says of one not back.
  struct Reconnection {
    bool under_way = false;
    bool back_off_spent = false;
  };
  void set_reconnection(Reconnection now);  // the reader's side
  Reconnection reconnection() const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::optional<Frame> pending_;
  bool finished_ = false;
  bool lost_ = false;
  bool closed_ = false;
  int64_t dropped_ = 0;
  Reconnection reconnection_;
  std::exception_ptr error_;
  std::shared_ptr<Arrivals> arrivals_;

  void handed_over();  // after a put or the finish, the lock released: wakes the loop
};

// The cameras of one run that keep trying when lost (sdqes-run: several cameras; runtime/live_source.py's Cameras),
// rather than give up: each goes on while another still sends. Once every one is lost they give up together and the
// run ends (exit 1), for a clean restart: stepping nothing, systemd's watchdog would kill it, outputs unfinished.
class Cameras {
 public:
  explicit Cameras(size_t count) : count_(count) {}
  void lost(size_t camera);   // its back-off spent in vain
  void found(size_t camera);  // reconnected
  bool all_lost() const;

 private:
  mutable std::mutex mutex_;
  size_t count_;
  std::set<size_t> lost_;
};

// A decoded frame made ready for the step (sdqes-run: sdqes::preprocess for the bundle), on the reader's thread.
using PrepareFrame = std::function<std::vector<float>(const cv::Mat&)>;
// frame.prepared made from frame.image by `prepare` (where there is one), the image then released.
void prepare_on_this_thread(const PrepareFrame& prepare, LatestFrame::Frame& frame);

// What the reader reads a live source through (sdqes-run: a cv::VideoCapture; the tests: a scripted camera).
struct LiveCapture {
  std::function<bool()> grab;              // the next frame, not yet decoded -> false: the source gave none
  std::function<bool(cv::Mat&)> retrieve;  // the grabbed frame decoded: only a sampled frame is
  std::function<bool()> reopen;            // release and open again -> whether it opened
  PrepareFrame prepare;                    // optional: each sampled frame prepared on the reader's thread
};

// Reads `capture` until the source is lost for good or `frames` is closed: each frame stamped by the time since
// `start`, sampled every `period` seconds as samples_served decides (a live frame serves one sample; the sample
// times a stall left without a frame are skipped), and put in `frames`. A source that stops sending is reopened
// after each of `delays` (reconnect; with `cameras`, then every last delay while another sends), each attempt said
// through `log`. Ends with frames.finish. What a LiveReader's thread runs. `cameras`: the run's cameras, this one
// `camera` among them, where it keeps trying when lost while another sends (null: it gives up).
void read_live(LiveCapture& capture, const std::string& name, double period, LatestFrame& frames,
               const std::function<void(const std::string&)>& log, std::chrono::steady_clock::time_point start,
               const std::vector<double>& delays, const std::shared_ptr<Cameras>& cameras = nullptr,
               size_t camera = 0);

// `read` (a source's reading, ending with frames.finish) on a thread of its own, started at construction, handing
// its frames over through frames(). Its destructor closes the frames and joins the thread; a thread still inside a
// read after kReaderStopTimeoutS is left to end with the process (`read` must hold what it uses).
class FrameReader {
 public:
  explicit FrameReader(std::function<void(LatestFrame&)> read);
  virtual ~FrameReader();
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;
  LatestFrame& frames() { return *frames_; }

 private:
  std::shared_ptr<LatestFrame> frames_;
  std::future<void> ended_;
  std::thread thread_;
};

// read_live on a thread of its own.
class LiveReader : public FrameReader {
 public:
  LiveReader(std::shared_ptr<LiveCapture> capture, std::string name, double period,
             std::function<void(const std::string&)> log, std::vector<double> delays = reconnect_delays_s(),
             std::shared_ptr<Cameras> cameras = nullptr, size_t camera = 0);
};

}  // namespace sdqes
