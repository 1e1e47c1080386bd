// What a run measures as it goes, in constant memory: runtime/run_stats.py's twin, so that sdqes-run ends with the
// line `sdqes-edge run` ends with ("done: 1200 frames, 3 alerts, 29.8 frames/s, latency p50 21.4 ms p99 35.0 ms").
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace sdqes {

// Per-step latencies in constant memory, for a service that runs for months: log-spaced bins, kBinsPerDecade per
// factor of ten from kLowestMs to kHighestMs, as runtime/run_stats.py's LatencyHistogram. A percentile is read to
// within one bin (under 1% relative) however many steps were added; the count, minimum and maximum are exact.
class LatencyHistogram {
 public:
  static constexpr double kLowestMs = 1e-3, kHighestMs = 1e6;
  static constexpr int kBinsPerDecade = 250;

  LatencyHistogram();
  void add(double ms);
  // The q-th percentile (0-100): the geometric middle of its bin, clamped to the exact minimum and maximum; 0 where
  // nothing was added.
  double percentile(double q) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> edges_;
  std::vector<int64_t> counts_;  // [under the lowest edge, a bin per pair of edges..., over the highest]
  int64_t count_ = 0;
  double min_ms_ = std::numeric_limits<double>::infinity();
  double max_ms_ = 0.0;
};

// ", 3 alerts, 29.8 frames/s, latency p50 21.4 ms p99 35.0 ms": what the last line says after its frame count, as
// `sdqes-edge run` says it (`unit`: "frame", or "step" where a step takes a frame of several sources). Without a
// frame, the alerts alone: a speed of nothing is no measurement.
std::string run_words(int64_t frames, int64_t alerts, double seconds, const LatencyHistogram& latencies,
                      const std::string& unit = "frame");

// "29.8 frames/s, latency p50 21 ms, p99 35 ms, dropped 0, 1 alert": a live run's status line, as `sdqes-edge run`
// gives it to systemd (`systemctl status`) and prints it now and then.
std::string status_words(double frames_per_s, const LatencyHistogram& latencies, int64_t dropped, int64_t alerts);

// How often a live run prints its status line: every few seconds on a terminal; in a log (journald, docker) once
// in kLogLineSeconds, not 17,000 lines a day from a service that runs for weeks (sdqes-edge run's intervals).
inline constexpr double kLiveReportSeconds = 5.0, kLogLineSeconds = 30.0;
double live_report_seconds(bool on_a_terminal);

}  // namespace sdqes
