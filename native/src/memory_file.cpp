// The model's memory of one stream kept across a restart (sdqes/memory_file.hpp).
#include "sdqes/memory_file.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sdqes/runtime.hpp"
#include "sdqes/saved_files.hpp"

namespace sdqes {

namespace {

using nlohmann::json;

const std::string kFormatLine = "sdqes model memory, version 1";
const std::string kWrittenBy = "sdqes-run --state or sdqes_step_save_memory";

// What a stream's memory of `state_bytes` is, for this step: the file's header line.
json header_of(const OpenedStep& step, size_t state_bytes) {
  const auto element_bytes = step.backend->state_element_bytes();
  json tensors = json::array();
  for (size_t i = 0; i < step.state_names.size(); ++i) {
    tensors.push_back({{"name", step.state_names[i]}, {"element_bytes", element_bytes[i]}});
  }
  return {{"model_identity", step.model_identity}, {"tensors", tensors}, {"bytes", state_bytes}};
}

// What differs between the memory's state and the step's, in words; "" where nothing does.
std::string layout_difference(const json& saved, const json& wanted) {
  const json& have = saved.value("tensors", json::array());
  const json& want = wanted["tensors"];
  if (!have.is_array() || have.size() != want.size()) {
    return "holds " + std::to_string(have.is_array() ? have.size() : 0) + " state tensors where this step graph "
           "carries " + std::to_string(want.size());
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (have[i] != want[i]) {
      return "holds " + have[i].dump() + " where this step graph carries " + want[i].dump() + " (another precision, "
             "or another export of the model)";
    }
  }
  if (saved.value("bytes", json()) != wanted["bytes"]) {
    return "holds a stream's state of " + saved.value("bytes", json()).dump() + " bytes where this step graph's is " +
           wanted["bytes"].dump() + " (another export of the model)";
  }
  return "";
}

}  // namespace

void save_memory(const std::filesystem::path& path, const OpenedStep& step, int stream) {
  const auto state = step.backend->stream_state(stream);
  std::string data = kFormatLine + "\n" + header_of(step, state.size()).dump() + "\n";
  data.append(reinterpret_cast<const char*>(state.data()), state.size());
  try {
    write_atomically(path, data);
  } catch (const Error& e) {
    throw Error("cannot write " + path.string() + ": " + e.what() + " (the file there, if any, is unchanged)");
  }
}

UnusableMemory::UnusableMemory(const std::filesystem::path& path, const std::string& problem_words)
    : Error(path.string() + " " + problem_words + "; remove it, and the stream starts fresh"), problem(problem_words) {}

void load_memory(const std::filesystem::path& path, OpenedStep& step, int stream) {
  const json wanted = header_of(step, step.backend->stream_state(stream).size());  // (checks the stream)
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(path.string() + " cannot be read (" + std::strerror(errno) + "); give a file " + kWrittenBy +
                " wrote");
  }
  std::string format, header_line;
  if (!std::getline(in, format) || format != kFormatLine) {
    throw UnusableMemory(path, "is not a model memory file (" + kWrittenBy + " writes them)");
  }
  json header;
  try {
    std::getline(in, header_line);
    header = json::parse(header_line);
  } catch (const json::exception&) {
    throw UnusableMemory(path, "is damaged (its header is not JSON)");
  }
  if (!header.is_object() || header.value("model_identity", json()) != step.model_identity) {
    throw UnusableMemory(path, "holds the memory of another model (not this bundle's: another export?)");
  }
  if (const auto difference = layout_difference(header, wanted); !difference.empty()) {
    throw UnusableMemory(path, difference);
  }
  const std::vector<uint8_t> state((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (state.size() != wanted["bytes"].get<size_t>()) {
    throw UnusableMemory(path, "is damaged (" + std::to_string(state.size()) + " bytes of state where its header "
                               "says " + wanted["bytes"].dump() + ": cut short?)");
  }
  step.backend->set_stream_state(stream, state);
}

}  // namespace sdqes
