// Frame times against the model's rate (sdqes/pacing.hpp), as runtime/pacing.py finds them: the same frame and the
// same words for each case of tests/vectors/pacing.json; and through the C API, where a program gives
// sdqes_alert_update the times of its own frames.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sdqes/pacing.hpp"
#include "sdqes/sdqes.h"
#include "vectors.hpp"

namespace {
using sdqes_test::kVectors;

// The index of the first time at which `pace` finds a problem; -1 where it finds none.
int first_problem(sdqes::StreamPace& pace, const std::vector<double>& times) {
  for (size_t k = 0; k < times.size(); ++k) {
    if (pace.observe(times[k]) != sdqes::StreamPace::Problem::kNone) return static_cast<int>(k);
  }
  return -1;
}
}  // namespace

TEST(StreamPace, FindsWhatThePythonRuntimeFindsAtTheSameFrameInItsWords) {
  const nlohmann::json cases = sdqes_test::read_json(kVectors / "pacing.json");
  ASSERT_GE(cases.size(), 8u);
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    sdqes::StreamPace pace(1.0 / c.at("fps").get<double>());
    const int found = first_problem(pace, c.at("times").get<std::vector<double>>());
    if (c.at("expected").is_null()) {
      EXPECT_EQ(found, -1) << name << ": " << pace.said();
      EXPECT_EQ(pace.said(), "") << name;
      continue;
    }
    EXPECT_EQ(found, c.at("expected").at("frame").get<int>()) << name;
    const std::string words = c.at("expected").at("words");
    EXPECT_EQ(pace.said().rfind(words, 0), 0u) << name << ": " << pace.said() << "\nnot: " << words;
  }
}

TEST(StreamPace, SaysItsProblemOnceAndKeepsItThroughARestart) {
  sdqes::StreamPace pace(0.2);
  EXPECT_EQ(first_problem(pace, std::vector<double>(9, 1.0)), 8);
  EXPECT_EQ(pace.problem(), sdqes::StreamPace::Problem::kStill);
  const std::string said = pace.said();
  EXPECT_EQ(pace.observe(1.0), sdqes::StreamPace::Problem::kNone);  // found once: a pipeline's fault stays
  pace.restart();
  EXPECT_EQ(pace.said(), said);
}

TEST(CApi, AnAlertForABundleSaysWhenItsTimesComeFasterThanTheModelWasTrainedOnAndNeverForItsOwnRate) {
  // A ROS 2 node stepping every image of a 30-fps camera into a model trained at 1 fps: its scores were those of a
  // model that sees time run 30x fast, and nothing said so.
  char error[512] = {0};
  sdqes_bundle* b = sdqes_bundle_open((kVectors / "bundle").c_str(), error, sizeof error);
  ASSERT_NE(b, nullptr) << error;
  const double fps = sdqes_bundle_fps(b);
  sdqes_alert* camera = sdqes_alert_for_label(b, nullptr, error, sizeof error);
  sdqes_alert* sampled = sdqes_alert_for_label(b, nullptr, error, sizeof error);
  sdqes_alert* unbound = sdqes_alert_new(0.6, -1, 0, 0, error, sizeof error);
  ASSERT_TRUE(camera && sampled && unbound) << error;
  for (int k = 0; k < 40; ++k) {
    EXPECT_GE(sdqes_alert_update(camera, 0.5, k * fps / 30.0), 0);
    EXPECT_GE(sdqes_alert_update(sampled, 0.5, k / fps), 0);
    EXPECT_GE(sdqes_alert_update(unbound, 0.5, k * fps / 30.0), 0);  // it knows no rate to hold them to
  }
  const std::string said = sdqes_alert_pace_problem(camera);
  EXPECT_EQ(said.rfind("frames come 0.0333 s apart (30 per second), but this bundle's model steps at 1 frames per "
                       "second: its temporal adapters see time run 30x fast",
                       0),
            0u)
      << said;
  EXPECT_STREQ(sdqes_alert_pace_problem(sampled), "");
  EXPECT_STREQ(sdqes_alert_pace_problem(unbound), "");
  EXPECT_STREQ(sdqes_alert_pace_problem(nullptr), "");
  EXPECT_EQ(sdqes_alert_reset(camera), 0);  // a new stream: the times start again, what was found stays said
  EXPECT_EQ(sdqes_alert_update(camera, 0.5, 0.0), 0);
  EXPECT_EQ(said, sdqes_alert_pace_problem(camera));
  for (sdqes_alert* a : {camera, sampled, unbound}) sdqes_alert_free(a);
  sdqes_bundle_close(b);
}
