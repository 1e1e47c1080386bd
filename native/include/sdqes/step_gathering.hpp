// One step's frames from several sources, a stream each: the twin of runtime/frame_gathering.py's gather_frames.
//
// A step takes every file's next frame, waited for as long as decoding takes, and every live source's next frame,
// waited for until a patience of one sample period after the step's first frame came: a source that keeps pace
// sends one within a period of any other's, each being sampled at the bundle's rate. A live source that missed
// that wait is late, and until it hands a frame over again no step waits for it. A camera that stalls (a network
// stream's read blocks for up to kStreamTimeoutS, 10 s, before the reconnection attempts) then idles its stream, memory
// kept, while the others go on, instead of holding every stream's alerts for as long.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "sdqes/live_reader.hpp"

namespace sdqes {

// The patience, in sample periods (runtime/frame_gathering.py's LIVE_PATIENCE_PERIODS).
inline constexpr double kLivePatiencePeriods = 1.0;
// A late camera is named once it has sent nothing for this long, and again when it sends (STALL_NOTICE_S): a
// moment's lateness is the network's; seconds are a stall.
inline constexpr double kStallNoticeS = 5.0;

// What the gathering asks of one source (sdqes-run: a --source as its loop steps it).
class GatheredSource {
 public:
  virtual ~GatheredSource() = default;
  virtual const std::string& name() const = 0;
  virtual bool live() const = 0;
  virtual bool ended() const = 0;
  virtual bool ready() const = 0;  // next() would not wait
  // The next frame taken into the source's hands -> false where the source has ended, or `stopped()` came first.
  virtual bool next(const std::function<bool()>& stopped) = 0;
};

// The live sources a step stopped waiting for, kept by the caller from step to step (runtime/frame_gathering.py's
// LateSources): since when each has been late, and which were said to have stalled.
struct LateSources {
  explicit LateSources(size_t sources, double notice_after = kStallNoticeS)
      : since(sources), said(sources, false), notice_after_s(notice_after) {}
  bool late(size_t source) const { return since[source].has_value(); }

  std::vector<std::optional<std::chrono::steady_clock::time_point>> since;
  std::vector<bool> said;
  double notice_after_s;
};

// Which of `sources` have a frame in hand this step (each source's next() called at most once). `late` marks the
// live sources that missed a step's wait; one late for `late.notice_after_s` is named through `say`, once, and
// again when it sends. `arrivals` is notified by every live source's frames (LatestFrame::notify_also; a file's
// next() waits for its own). Waits for a first frame as long as it takes, asking `stopped()` every 50 ms; none
// taken: every source has ended, or `stopped()`.
std::vector<bool> gather_step(const std::vector<GatheredSource*>& sources, const Arrivals& arrivals,
                              double patience_s, LateSources& late, const std::function<bool()>& stopped,
                              const std::function<void(const std::string&)>& say);

// Runs `say` once, on a thread of its own, unless destroyed within `after_s` seconds. sdqes-run names a source still
// opening after kStallNoticeS with it, as a camera that stalls is named: OpenCV's open of a stream that answers but
// sends nothing blocks for kStreamTimeoutS (FFmpeg's own: 30 s), and the run was silent meanwhile
// (runtime/source_opening.py's notice).
class NoticeIfSlow {
 public:
  NoticeIfSlow(double after_s, std::function<void()> say);
  ~NoticeIfSlow();  // at once where nothing was said yet (the notice cancelled); after `say` where it is under way
  NoticeIfSlow(const NoticeIfSlow&) = delete;
  NoticeIfSlow& operator=(const NoticeIfSlow&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable finished_;
  bool done_ = false;
  std::thread watcher_;  // last: started once what it uses exists
};

}  // namespace sdqes
