#include <cmath>
#include <fstream>
#include <string>

#include "sdqes/runtime.hpp"

namespace sdqes {
namespace {
// train_options.py's SYNTHETIC_TRAINING_DATA: the only data `sdqes-edge train` fits (tests/vectors/training_data.json).
constexpr const char* kSyntheticTrainingData =
    "synthetic scenes (coloured squares, rolling balls, a door and a lamp drawn by `sdqes-edge synth`)";
constexpr const char* kTrainingRecordName = "training_record.json";  // contract.py's TRAINING_RECORD_NAME
}  // namespace

std::string training_data_words(const nlohmann::json& record) {
  if (!record.is_object() || !record.contains("data") || !record["data"].is_object()) return "";
  const nlohmann::json& data = record["data"];
  if (!data.contains("train") || !data["train"].is_object()) return "";
  const nlohmann::json& train = data["train"];
  // As Python's int() takes it: a whole number, or a finite one cut to its whole part; nothing else.
  if (!train.contains("seeds") || !train.contains("streams") || !train["streams"].is_number()) return "";
  const double streams = train["streams"].get<double>();
  if (!std::isfinite(streams)) return "";
  return std::string(kSyntheticTrainingData) + ", " + std::to_string(static_cast<long long>(std::trunc(streams))) +
         " training streams";
}

std::string training_data_words(const Bundle& bundle) {
  const std::filesystem::path path = inside_bundle(bundle.root, kTrainingRecordName, /*named_by_manifest=*/false);
  if (!std::filesystem::is_regular_file(path)) return "";
  std::ifstream in(path);
  const nlohmann::json record = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return record.is_discarded() ? "" : training_data_words(record);
}

}  // namespace sdqes
