// A video file read on a thread of its own, a frame ahead of the loop: the twin of runtime/frame_source.py's reader
// thread for a file.
//
// Read on the thread that steps the engine, a file's frame took its decoding, its preprocessing and its step one
// after another. Read here, the next frame is decoded and preprocessed while the engine steps this one (on a GPU the
// loop's thread only waits for the engine meanwhile), so a frame takes the longer of the two, not their sum. Every
// sample time is stepped: the reader waits for the loop (LatestFrame::put_waiting), never dropping a frame.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>

#include <opencv2/core.hpp>

#include "sdqes/live_reader.hpp"

namespace sdqes {

// What the reader reads a video file through (sdqes-run: a cv::VideoCapture; the tests: a scripted video).
struct FileCapture {
  std::function<bool()> grab;              // the next frame, not yet decoded -> false: the file has ended
  std::function<double()> stamp_s;         // the grabbed frame's time in the file, seconds (CAP_PROP_POS_MSEC)
  std::function<bool(cv::Mat&)> retrieve;  // the grabbed frame decoded: only a sampled frame is
  // stated_end_time of the container's frame count and rate (infinity: not stated)
  double end_time_s = std::numeric_limits<double>::infinity();
  PrepareFrame prepare;                    // optional: each sampled frame prepared on the reader's thread
};

// The file's frames at sample times k * period (k >= start: a run resumed from --state goes on at sample `start`,
// the samples before it read to keep the timeline, never decoded), each by the first frame at or after it, as
// runtime/sampling.py serves them; a frame serving several sample times (a video slower than the bundle) is handed
// over once with Frame::serves. Ends with frames.finish at the file's end, a frame that would not decode, or when
// the loop closes the frames.
void read_file(FileCapture& capture, double period, int64_t start, LatestFrame& frames);

// read_file on a thread of its own.
class FileReader : public FrameReader {
 public:
  FileReader(std::shared_ptr<FileCapture> capture, double period, int64_t start);
};

}  // namespace sdqes
