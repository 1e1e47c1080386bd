// A stream's memory kept in a file across a restart (sdqes/memory_file.hpp), on a backend that holds its state as
// bytes: saved from one stream and loaded into another it is the same bytes; the memory of the model's graph of the
// other precision is converted, fp16 <-> fp32; a file of another model or export, or one cut short, is refused, naming
// what is wrong, and the state is left as it was.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "sdqes/memory_file.hpp"
#include "sdqes/runtime.hpp"
#include "sdqes/step_backend.hpp"

namespace {

namespace fs = std::filesystem;

// Two state tensors of `streams` streams, each stream's rows `sizes[i]` elements of `element_bytes[i]` bytes.
class BytesStep : public sdqes::StepBackend {
 public:
  BytesStep(int streams, std::vector<size_t> element_bytes) : streams_(streams), element_bytes_(element_bytes) {
    for (size_t i = 0; i < element_bytes.size(); ++i) tensors_.emplace_back(streams * (i + 2) * element_bytes[i], 0);
  }
  const std::vector<float>& step(const std::vector<float>&) override { return none_; }
  void reset() override {}
  void keep_streams(const std::vector<int>&) override {}
  void reset_stream(int) override {}
  void warm_up() override {}
  std::vector<uint8_t> stream_state(int stream) const override {
    std::vector<uint8_t> bytes;
    for (const auto& tensor : tensors_) {
      const auto rows = sdqes::stream_bytes(tensor.size(), streams_, stream);
      bytes.insert(bytes.end(), tensor.begin() + rows.offset, tensor.begin() + rows.offset + rows.size);
    }
    return bytes;
  }
  void set_stream_state(int stream, const std::vector<uint8_t>& bytes) override {
    size_t at = 0;
    for (auto& tensor : tensors_) {
      const auto rows = sdqes::stream_bytes(tensor.size(), streams_, stream);
      std::copy(bytes.begin() + at, bytes.begin() + at + rows.size, tensor.begin() + rows.offset);
      at += rows.size;
    }
  }
  std::vector<size_t> state_element_bytes() const override { return element_bytes_; }

  // Every byte of every tensor numbered from `first`: each stream's state its own.
  void number_from(uint8_t first) {
    for (auto& tensor : tensors_) {
      std::iota(tensor.begin(), tensor.end(), first);
      first = static_cast<uint8_t>(first + tensor.size());
    }
  }

 private:
  int streams_;
  std::vector<size_t> element_bytes_;
  std::vector<std::vector<uint8_t>> tensors_;
  std::vector<float> none_;
};

sdqes::OpenedStep opened(int streams, std::vector<size_t> element_bytes, std::string identity = "model-a") {
  return {std::make_unique<BytesStep>(streams, std::move(element_bytes)), "bytes", std::move(identity),
          {"block00.adapter0.qrnn0_c", "block00.adapter0.qrnn0_x"}};
}

class MemoryFile : public ::testing::Test {
 protected:
  // Its own folder: ctest runs each test in a process of its own, side by side.
  fs::path folder = fs::temp_directory_path() / ("sdqes-memory-test-" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(folder); }
  void TearDown() override { fs::remove_all(folder); }

  // What load_memory said, or "" where it loaded.
  static std::string refusal(const fs::path& path, sdqes::OpenedStep& step, int stream) {
    try {
      sdqes::load_memory(path, step, stream);
      return "";
    } catch (const sdqes::UnusableMemory& e) {
      return e.problem;
    }
  }
};

TEST_F(MemoryFile, SavedFromOneStreamAndLoadedIntoAnotherIsTheSameBytes) {
  auto first = opened(3, {4, 2});
  static_cast<BytesStep&>(*first.backend).number_from(7);
  sdqes::save_memory(folder / "camera.memory", first, 1);
  auto second = opened(3, {4, 2});
  sdqes::load_memory(folder / "camera.memory", second, 2);
  EXPECT_EQ(second.backend->stream_state(2), first.backend->stream_state(1));
  EXPECT_NE(second.backend->stream_state(1), first.backend->stream_state(1));  // the others' kept as they were
}

TEST_F(MemoryFile, OfAnotherModelPrecisionOrExportOrCutShortIsRefusedAndTheStateLeftAsItWas) {
  auto saved = opened(1, {4, 4});
  static_cast<BytesStep&>(*saved.backend).number_from(1);
  const fs::path path = folder / "state.memory";
  sdqes::save_memory(path, saved, 0);
  auto other_model = opened(1, {4, 4}, "model-b");
  EXPECT_EQ(refusal(path, other_model, 0), "holds the memory of another model (not this bundle's: another export?)");
  auto mixed = opened(1, {4, 2});  // another export: not one precision for another, so not converted
  EXPECT_NE(refusal(path, mixed, 0).find("(another precision, or another export of the model)"), std::string::npos);
  EXPECT_EQ(mixed.backend->stream_state(0), std::vector<uint8_t>(mixed.backend->stream_state(0).size(), 0));
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 3);
  auto same = opened(1, {4, 4});
  EXPECT_EQ(refusal(path, same, 0), "is damaged (17 bytes of state where its header says 20: cut short?)");
  std::ofstream(path, std::ios::trunc) << "{\"format\": \"sdqes-run alert states\"}\n";
  EXPECT_EQ(refusal(path, same, 0), "is not a model memory file (sdqes-run --state or sdqes_step_save_memory "
                                    "writes them)");
  EXPECT_THROW(sdqes::save_memory(folder / "no-such-folder" / "state.memory", saved, 0), sdqes::Error);
}

// The bytes of `values` as a float32 state.
std::vector<uint8_t> float_bytes(const std::vector<float>& values) {
  const auto* first = reinterpret_cast<const uint8_t*>(values.data());
  return {first, first + values.size() * sizeof(float)};
}

TEST_F(MemoryFile, KeptByTheGraphOfTheOtherPrecisionIsConvertedElementForElement) {
  auto fp32 = opened(2, {4, 4});  // two tensors of 2 and 3 elements a stream: 5 floats
  fp32.backend->set_stream_state(1, float_bytes({1.0f, -2.0f, 0.5f, 65504.0f, 0.1f}));
  sdqes::save_memory(folder / "fp32.memory", fp32, 1);
  auto fp16 = opened(2, {2, 2});  // the same model's fp16 graph, a camera moved to it
  EXPECT_EQ(sdqes::load_memory(folder / "fp32.memory", fp16, 0), "fp32");
  // IEEE half-precision bits, little-endian: 1, -2, 0.5, the largest half, and 0.1 rounded to the nearest half
  EXPECT_EQ(fp16.backend->stream_state(0),
            (std::vector<uint8_t>{0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0xff, 0x7b, 0x66, 0x2e}));
  sdqes::save_memory(folder / "fp16.memory", fp16, 0);
  auto back = opened(2, {4, 4});
  EXPECT_EQ(sdqes::load_memory(folder / "fp16.memory", back, 1), "fp16");
  EXPECT_EQ(back.backend->stream_state(1), float_bytes({1.0f, -2.0f, 0.5f, 65504.0f, 0.0999755859375f}));
  EXPECT_EQ(sdqes::load_memory(folder / "fp16.memory", fp16, 1), "");  // its own graph's: as it was
  fp32.backend->set_stream_state(1, float_bytes({1.0f, 70000.0f, 0.0f, 0.0f, 0.0f}));  // past the largest half
  sdqes::save_memory(folder / "fp32.memory", fp32, 1);
  EXPECT_EQ(refusal(folder / "fp32.memory", fp16, 0),
            "holds values past fp16's range (|x| up to 70000) for this fp16 step graph");
  EXPECT_EQ(fp16.backend->stream_state(0)[0], 0x00);  // left as it was
  EXPECT_EQ(fp16.backend->stream_state(0)[1], 0x3c);
}

}  // namespace
