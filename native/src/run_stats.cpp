// What a run measures as it goes, in constant memory (sdqes/run_stats.hpp).
#include "sdqes/run_stats.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

namespace sdqes {

LatencyHistogram::LatencyHistogram() {
  const int bins = static_cast<int>(std::log10(kHighestMs / kLowestMs) * kBinsPerDecade);
  for (int i = 0; i <= bins; ++i) edges_.push_back(kLowestMs * std::pow(10.0, static_cast<double>(i) / kBinsPerDecade));
  counts_.assign(edges_.size() + 1, 0);
}

void LatencyHistogram::add(double ms) {
  // numpy's searchsorted(edges, ms, side="right"): the edges at or below it
  ++counts_[static_cast<size_t>(std::upper_bound(edges_.begin(), edges_.end(), ms) - edges_.begin())];
  ++count_;
  min_ms_ = std::min(min_ms_, ms);
  max_ms_ = std::max(max_ms_, ms);
}

double LatencyHistogram::percentile(double q) const {
  if (count_ == 0) return 0.0;
  if (q >= 100.0) return max_ms_;
  const auto rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q / 100.0 * static_cast<double>(count_))));
  size_t slot = 0;  // the first slot whose running count reaches the rank
  for (int64_t seen = counts_[0]; seen < rank; seen += counts_[++slot]) {
  }
  if (slot == 0 || slot == counts_.size() - 1) return slot == 0 ? min_ms_ : max_ms_;  // outside the binned range
  return std::clamp(std::sqrt(edges_[slot - 1] * edges_[slot]), min_ms_, max_ms_);
}

std::string run_words(int64_t frames, int64_t alerts, double seconds, const LatencyHistogram& latencies,
                      const std::string& unit) {
  std::ostringstream words;
  words << ", " << alerts << (alerts == 1 ? " alert" : " alerts");
  if (frames == 0) return words.str();
  words << std::fixed << std::setprecision(1) << ", " << frames / std::max(seconds, 1e-9) << " " << unit
        << "s/s, latency p50 " << latencies.percentile(50) << " ms p99 " << latencies.percentile(99) << " ms";
  return words.str();
}

std::string status_words(double frames_per_s, const LatencyHistogram& latencies, int64_t dropped, int64_t alerts) {
  std::ostringstream words;
  words << std::fixed << std::setprecision(1) << frames_per_s << " frames/s, latency p50 " << std::setprecision(0)
        << latencies.percentile(50) << " ms, p99 " << latencies.percentile(99) << " ms, dropped " << dropped << ", "
        << alerts << (alerts == 1 ? " alert" : " alerts");
  return words.str();
}

double live_report_seconds(bool on_a_terminal) { return on_a_terminal ? kLiveReportSeconds : kLogLineSeconds; }

}  // namespace sdqes
