#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>

#include "sdqes/runtime.hpp"

namespace sdqes {
namespace {
// train_options.py's SYNTHETIC_TRAINING_DATA: the only data `sdqes-edge train` fits (tests/vectors/training_data.json).
constexpr const char* kSyntheticTrainingData =
    "synthetic scenes (coloured squares, rolling balls, a door and a lamp drawn by `sdqes-edge synth`)";
constexpr const char* kTrainingRecordName = "training_record.json";  // contract.py's TRAINING_RECORD_NAME
constexpr double kMaxRecordedStreams = 1e15;  // train_options.py's MAX_RECORDED_STREAMS
}  // namespace

std::string training_data_words(const nlohmann::json& record) {
  if (!record.is_object() || !record.contains("data") || !record["data"].is_object()) return "";
  const nlohmann::json& data = record["data"];
  if (!data.contains("train") || !data["train"].is_object()) return "";
  const nlohmann::json& train = data["train"];
  // A number from 0 up to train_options.py's MAX_RECORDED_STREAMS, cut to its whole part as Python's int() does.
  if (!train.contains("seeds") || !train.contains("streams") || !train["streams"].is_number()) return "";
  const double streams = train["streams"].get<double>();
  if (!(streams >= 0.0 && streams < kMaxRecordedStreams)) return "";  // NaN too
  return std::string(kSyntheticTrainingData) + ", " + std::to_string(static_cast<long long>(std::trunc(streams))) +
         " training streams";
}

std::string random_weights_words(const nlohmann::json& manifest) {
  if (!manifest.is_object() || !manifest.contains("random_weights")) return "";
  const nlohmann::json& weights = manifest["random_weights"];
  // Python's truth of the value: null, false, 0, "", [] and {} say nothing.
  const bool said = weights.is_boolean()  ? weights.get<bool>()
                    : weights.is_number() ? weights.get<double>() != 0.0
                    : weights.is_string() || weights.is_array() || weights.is_object() ? !weights.empty()
                                                                                        : false;
  if (!said) return "";
  if (weights.is_object() && weights.contains("preset") && weights["preset"].is_string() && weights.contains("seed") &&
      weights["seed"].is_number_integer()) {
    const std::string seed = weights["seed"].is_number_unsigned() ? std::to_string(weights["seed"].get<uint64_t>())
                                                                  : std::to_string(weights["seed"].get<int64_t>());
    return "random weights (exported from preset " + weights["preset"].get<std::string>() + ", seed " + seed +
           ", to measure speed)";
  }
  return "random weights";  // said otherwise (someone else's data): random all the same
}

std::string random_weights_warning(const std::string& words) {
  return "this bundle's model has " + words + ": its scores and alerts mean nothing; export a trained model to alert "
         "on (sdqes-edge export --checkpoint CHECKPOINT --out BUNDLE)";
}

std::string training_data_words(const Bundle& bundle) {
  const std::filesystem::path path = inside_bundle(bundle.root, kTrainingRecordName, /*named_by_manifest=*/false);
  if (!std::filesystem::is_regular_file(path)) return "";
  std::ifstream in(path);
  const nlohmann::json record = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return record.is_discarded() ? "" : training_data_words(record);
}

}  // namespace sdqes
