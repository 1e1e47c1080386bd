// What sdqes-run measures as it goes (sdqes/run_stats.hpp), as runtime/run_stats.py measures it: percentiles within a
// bin (1%) of the exact ones, in constant memory; the exact minimum and maximum; the last line's words.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "sdqes/run_stats.hpp"

TEST(LatencyHistogram, ReadsEachPercentileWithinOnePercentOfTheExactOne) {
  sdqes::LatencyHistogram latencies;
  for (int ms = 1; ms <= 1000; ++ms) latencies.add(ms * 0.1);  // 0.1 .. 100 ms
  EXPECT_EQ(latencies.count(), 1000);
  for (const double q : {1.0, 10.0, 50.0, 90.0, 99.0}) {
    const double exact = std::ceil(q * 10.0) * 0.1;  // the rank-th smallest, rank = ceil(q / 100 * count)
    EXPECT_NEAR(latencies.percentile(q), exact, 0.01 * exact) << "p" << q;
  }
  EXPECT_DOUBLE_EQ(latencies.percentile(100), 100.0);
  EXPECT_GE(latencies.percentile(0), 0.1);  // never under the exact minimum
  // What runtime/run_stats.py's LatencyHistogram reads of the same 1,000 latencies (its twin, bin for bin).
  const double python[] = {0.100462, 1.004616, 10.046158, 49.888449, 89.949758, 98.627949, 100.0};
  const double qs[] = {0, 1, 10, 50, 90, 99, 100};
  for (int i = 0; i < 7; ++i) EXPECT_NEAR(latencies.percentile(qs[i]), python[i], 1e-6) << "p" << qs[i];
}

TEST(LatencyHistogram, IsExactAtItsEndsAndOutsideItsBinsAndZeroWhenEmpty) {
  sdqes::LatencyHistogram empty;
  EXPECT_EQ(empty.percentile(50), 0.0);
  sdqes::LatencyHistogram one;
  one.add(7.3);
  EXPECT_DOUBLE_EQ(one.percentile(50), 7.3);
  EXPECT_DOUBLE_EQ(one.percentile(99), 7.3);
  sdqes::LatencyHistogram outside;  // under 1 us and over 1,000 s: past the bins, read as the exact extremes
  outside.add(1e-4);
  outside.add(2e6);
  EXPECT_DOUBLE_EQ(outside.percentile(50), 1e-4);
  EXPECT_DOUBLE_EQ(outside.percentile(99), 2e6);
}

TEST(RunWords, SayWhatSdqesEdgeRunSaysAndNoSpeedWithoutAFrame) {
  sdqes::LatencyHistogram latencies;
  latencies.add(10.0);
  EXPECT_EQ(sdqes::run_words(4, 1, 2.0, latencies), ", 1 alert, 2.0 frames/s, latency p50 10.0 ms p99 10.0 ms");
  EXPECT_EQ(sdqes::run_words(30, 2, 10.0, latencies, "step"),
            ", 2 alerts, 3.0 steps/s, latency p50 10.0 ms p99 10.0 ms");
  EXPECT_EQ(sdqes::run_words(0, 0, 0.0, sdqes::LatencyHistogram()), ", 0 alerts");
}

TEST(StatusWords, SayWhatSdqesEdgeRunTellsSystemdAndPrintsLessOftenInALog) {
  sdqes::LatencyHistogram latencies;
  latencies.add(21.2);
  EXPECT_EQ(sdqes::status_words(29.84, latencies, 0, 1),
            "29.8 frames/s, latency p50 21 ms, p99 21 ms, dropped 0, 1 alert");
  EXPECT_EQ(sdqes::live_report_seconds(true), 5.0);
  EXPECT_EQ(sdqes::live_report_seconds(false), 30.0);
}
