#include "sdqes/pacing.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

namespace sdqes {
namespace {
template <typename... Args>
std::string formatted(const char* format, Args... args) {
  char line[640];
  std::snprintf(line, sizeof line, format, args...);
  return line;
}
}  // namespace

StreamPace::StreamPace(double period_s) : period_(period_s) {}

StreamPace::Problem StreamPace::observe(double time) {
  if (problem_ != Problem::kNone) return Problem::kNone;
  times_.push_back(time);
  if (static_cast<int>(times_.size()) > kWindow + 1) times_.pop_front();
  if (static_cast<int>(times_.size()) <= kWindow) return Problem::kNone;
  const double interval = (times_.back() - times_.front()) / kWindow;  // the mean of the last kWindow intervals
  if (interval == 0) {
    problem_ = Problem::kStill;
    said_ = formatted("frames keep the same time (%g s); a frame's time is seconds since its stream started, and "
                      "alerts, cooldowns and this check of the model's rate are timed by it: give each frame its own "
                      "(index / sdqes_bundle_fps for frames at the bundle's rate)", time);
  } else if (interval < kTooFastFraction * period_) {
    problem_ = Problem::kTooFast;
    said_ = formatted("frames come %.3g s apart (%.3g per second), but this bundle's model steps at %g frames per "
                      "second: its temporal adapters see time run %.3gx fast, and its scores are not what it was "
                      "trained to give; step one frame per %g s (keep a frame when its time reaches the next "
                      "k / sdqes_bundle_fps)", interval, 1 / interval, 1 / period_, period_ / interval, period_);
  } else if (interval > kTooSlowFactor * period_ && shortest_interval() > kTooSlowFactor * period_) {
    problem_ = Problem::kTooSlow;
    said_ = formatted("frames come %.4g s apart, %.0fx the %g s between this bundle's frames: a frame's time is "
                      "seconds since its stream started (a time in milliseconds reads as 1000x slow), and alerts and "
                      "their cooldowns go by it; give each frame its time in seconds (frames truly this far apart are "
                      "too far for the model's memory of recent frames)", interval, interval / period_, period_);
  }
  return problem_;
}

double StreamPace::shortest_interval() const {
  double shortest = times_.back() - times_.front();
  for (size_t k = 1; k < times_.size(); ++k) shortest = std::min(shortest, times_[k] - times_[k - 1]);
  return shortest;
}

}  // namespace sdqes
