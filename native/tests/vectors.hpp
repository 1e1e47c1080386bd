// The shared test vectors the Python runtime wrote (tests/native_vectors.py), as the GoogleTest suite reads them.
#pragma once

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace sdqes_test {

inline const std::filesystem::path kVectors = SDQES_VECTORS_DIR;

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace sdqes_test
