// What a bundle's model was trained on (sdqes/runtime.hpp's training_data_words) and what its manifest says of a
// preset's random weights, in the words the Python runtime gives of each case of tests/vectors/training_data.json and
// random_weights.json; nothing where a bundle's record is damaged.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "sdqes/runtime.hpp"
#include "sdqes/sdqes.h"
#include "vectors.hpp"

using sdqes_test::kVectors;

namespace {
// Each case of a vectors file: what `words` says of its `input` is what the Python runtime said ("" for its None).
template <typename Words>
void expect_python_words(const std::string& file, const std::string& input, Words words) {
  const nlohmann::json cases = sdqes_test::read_json(kVectors / file);
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    const std::string expected = c.at("expected").is_null() ? "" : c.at("expected").get<std::string>();
    EXPECT_EQ(words(c.at(input)), expected) << c.at("name");
  }
}
}  // namespace

TEST(TrainingRecord, SaysWhatThePythonRuntimeSaysOfEachRecord) {
  expect_python_words("training_data.json", "record",
                      [](const nlohmann::json& record) { return sdqes::training_data_words(record); });
}

TEST(TrainingRecord, IsReadFromTheBundleAndADamagedOneSaysNothing) {
  const std::filesystem::path bundle = std::filesystem::temp_directory_path() /
                                       ("sdqes-native-record-" + std::to_string(::testing::UnitTest::GetInstance()
                                                                                    ->random_seed()));
  std::filesystem::remove_all(bundle);
  std::filesystem::copy(kVectors / "bundle", bundle, std::filesystem::copy_options::recursive);
  const sdqes::Bundle loaded = sdqes::load_bundle(bundle);
  EXPECT_EQ(sdqes::training_data_words(loaded), "");  // none: a model of the user's own
  std::ofstream(bundle / "training_record.json") << R"({"data": {"train": {"seeds": [0, 2], "streams": 3}}})";
  EXPECT_EQ(sdqes::training_data_words(loaded).substr(0, 17), "synthetic scenes ");
  char error[512] = {0};  // a C caller's words, read as the bundle opens
  sdqes_bundle* opened = sdqes_bundle_open(bundle.c_str(), error, sizeof error);
  ASSERT_NE(opened, nullptr) << error;
  EXPECT_EQ(std::string(sdqes_bundle_training_data(opened)), sdqes::training_data_words(loaded));
  sdqes_bundle_close(opened);
  EXPECT_STREQ(sdqes_bundle_training_data(nullptr), "");
  std::ofstream(bundle / "training_record.json") << R"({"data": {"train": )";  // a copy cut short
  EXPECT_EQ(sdqes::training_data_words(loaded), "");
  std::filesystem::remove_all(bundle);
}

TEST(RandomWeights, SaysWhatThePythonRuntimeSaysOfEachManifest) {
  expect_python_words("random_weights.json", "manifest", sdqes::random_weights_words);
}
