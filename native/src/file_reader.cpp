// A video file read on a thread of its own, a frame ahead of the loop (sdqes/file_reader.hpp).
#include "sdqes/file_reader.hpp"

#include <algorithm>
#include <utility>

#include "sdqes/runtime.hpp"

namespace sdqes {

void read_file(FileCapture& capture, double period, int64_t start, LatestFrame& frames) {
  int64_t next_sample = 0;  // the first sample time k * period not yet served
  std::exception_ptr error;
  try {
    while (!frames.closed() && capture.grab()) {
      LatestFrame::Frame frame;
      frame.serves = samples_served(capture.stamp_s(), next_sample, period, capture.end_time_s);
      const int64_t before_start = std::min(frame.serves, std::max<int64_t>(0, start - next_sample));
      next_sample += frame.serves;
      frame.serves -= before_start;
      if (frame.serves == 0) continue;  // between two sample times, or before the start: not decoded
      if (!capture.retrieve(frame.image) || frame.image.empty()) break;  // would not decode: the stream ends here
      prepare_on_this_thread(capture.prepare, frame);
      if (!frames.put_waiting(std::move(frame))) break;
    }
  } catch (...) {  // a thread's exception would end the process: the loop raises it instead
    error = std::current_exception();
  }
  frames.finish(false, error);
}

FileReader::FileReader(std::shared_ptr<FileCapture> capture, double period, int64_t start)
    : FrameReader([capture = std::move(capture), period, start](LatestFrame& frames) {
        read_file(*capture, period, start, frames);
      }) {}

}  // namespace sdqes
