// The model's memory of one stream kept across a restart (sdqes/memory_file.hpp).
#include "sdqes/memory_file.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

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

// The element size every state tensor of `tensors` (a header's) has, or 0 where they differ or it is not a number.
size_t uniform_element_bytes(const json& tensors) {
  size_t bytes = 0;
  for (const json& tensor : tensors) {
    const json& size = tensor.is_object() ? tensor.value("element_bytes", json()) : json();
    if (!size.is_number_unsigned() || (bytes != 0 && size.get<size_t>() != bytes)) return 0;
    bytes = size.get<size_t>();
  }
  return bytes;
}

// Whether `saved` is the memory of the same state tensors kept by the graph of the other precision (fp16 for an fp32
// step graph, or fp32 for an fp16 one): the same names, every element of one size, as many elements.
bool of_the_other_precision(const json& saved, const json& wanted) {
  const json& have = saved.value("tensors", json::array());
  const json& want = wanted["tensors"];
  if (!have.is_array() || have.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!have[i].is_object() || have[i].value("name", json()) != want[i]["name"]) return false;
  }
  const size_t from = uniform_element_bytes(have), to = uniform_element_bytes(want);
  const json& bytes = saved.value("bytes", json());
  return ((from == 2 && to == 4) || (from == 4 && to == 2)) && bytes.is_number_unsigned() &&
         bytes.get<size_t>() % from == 0 && bytes.get<size_t>() / from == wanted["bytes"].get<size_t>() / to;
}

// fp16 <-> fp32, element for element (rounded to the nearest fp16, as numpy's astype and a CUDA cast round). A value
// past fp16's largest (65504) would become infinite and poison every later step: refused.
std::vector<uint8_t> converted(const std::vector<uint8_t>& state, size_t from, const std::filesystem::path& path) {
  const int elements = static_cast<int>(state.size() / from);
  const cv::Mat have(1, elements, from == 2 ? CV_16F : CV_32F, const_cast<uint8_t*>(state.data()));
  if (from == 4) {
    const double largest = cv::norm(have, cv::NORM_INF);
    if (!(largest <= 65504.0)) {
      std::ostringstream words;
      words << "holds values past fp16's range (|x| up to " << largest << ") for this fp16 step graph";
      throw UnusableMemory(path, words.str());
    }
  }
  cv::Mat want;
  have.convertTo(want, from == 2 ? CV_32F : CV_16F);
  return std::vector<uint8_t>(want.data, want.data + want.total() * want.elemSize());
}

}  // namespace

MemoryContents memory_contents(const OpenedStep& step, int stream) {
  MemoryContents contents{"", step.backend->stream_state(stream)};
  contents.header = kFormatLine + "\n" + header_of(step, contents.state.size()).dump() + "\n";
  return contents;
}

void write_memory(const std::filesystem::path& path, const MemoryContents& contents) {
  const std::string_view state(reinterpret_cast<const char*>(contents.state.data()), contents.state.size());
  try {
    write_atomically(path, {contents.header, state});
  } catch (const Error& e) {
    throw Error("cannot write " + path.string() + ": " + e.what() + " (the file there, if any, is unchanged)");
  }
}

void save_memory(const std::filesystem::path& path, const OpenedStep& step, int stream) {
  write_memory(path, memory_contents(step, stream));
}

UnusableMemory::UnusableMemory(const std::filesystem::path& path, const std::string& problem_words)
    : Error(path.string() + " " + problem_words + "; remove it, and the stream starts fresh"), problem(problem_words) {}

std::string load_memory(const std::filesystem::path& path, OpenedStep& step, int stream) {
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
  const bool convert = of_the_other_precision(header, wanted);
  if (const auto difference = layout_difference(header, wanted); !difference.empty() && !convert) {
    throw UnusableMemory(path, difference);
  }
  const json& expected = convert ? header["bytes"] : wanted["bytes"];
  const std::vector<uint8_t> state((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (state.size() != expected.get<size_t>()) {
    throw UnusableMemory(path, "is damaged (" + std::to_string(state.size()) + " bytes of state where its header "
                               "says " + expected.dump() + ": cut short?)");
  }
  if (!convert) {
    step.backend->set_stream_state(stream, state);
    return "";
  }
  const size_t from = uniform_element_bytes(header["tensors"]);
  step.backend->set_stream_state(stream, converted(state, from, path));
  return from == 2 ? "fp16" : "fp32";
}

}  // namespace sdqes
