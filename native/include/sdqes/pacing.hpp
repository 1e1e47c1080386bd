// Whether a stream's frame times come at the rate its model steps at: runtime/pacing.py's StreamPace, for the C API's
// callers, who give each frame's time to sdqes_alert_update. A QRNN trained on frames 0.2 s apart and given every
// frame of a 30-fps camera (a ROS 2 node stepping each image it is sent) sees time run 6x fast; a time in
// milliseconds (a headset's clock) makes a 10 s cooldown pass in 10 ms. Neither was said. The same rule and the same
// numbers as the Python runtime; tests/vectors/pacing.json holds both to it.
#pragma once

#include <deque>
#include <string>

namespace sdqes {

class StreamPace {
 public:
  static constexpr int kWindow = 8;                // PACE_WINDOW: intervals whose mean is compared with the period
  static constexpr double kTooFastFraction = 0.8;  // TOO_FAST_FRACTION: a mean interval under this much of it
  static constexpr double kTooSlowFactor = 100.0;  // TOO_SLOW_FACTOR: every recent interval over this many periods

  enum class Problem { kNone, kTooFast, kStill, kTooSlow };

  explicit StreamPace(double period_s);
  // The stream's next frame time (seconds, never going back: sdqes_alert_update refuses one that does). The first
  // problem found is kept and said by `said()`; after it nothing more is looked for (a pipeline that steps too fast
  // does so every frame).
  Problem observe(double time);
  // A new stream (sdqes_alert_reset): its times may start again from 0. What was found stays found.
  void restart() { times_.clear(); }
  Problem problem() const { return problem_; }
  // The problem in one line (the Python warning's words, with the C API's fix); "" while there is none.
  const std::string& said() const { return said_; }

 private:
  double shortest_interval() const;

  double period_;
  std::deque<double> times_;  // the last kWindow + 1 frames' times
  Problem problem_ = Problem::kNone;
  std::string said_;
};

}  // namespace sdqes
