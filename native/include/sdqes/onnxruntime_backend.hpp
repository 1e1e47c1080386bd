// ONNX Runtime backend (compiled only where CMake finds ONNX Runtime's C/C++ API: ONNXRUNTIME_ROOT), on the CPU:
// sdqes-run on a machine without an NVIDIA GPU (a Raspberry Pi, an x86 robot), on the bundle's own step graph. Two
// state buffer sets, swapped every frame as TensorRTStep swaps its device buffers, so a state input and its output
// are never the same buffer, and nothing is allocated per frame.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "sdqes/runtime.hpp"
#include "sdqes/step_backend.hpp"

namespace sdqes {

// The ONNX Runtime this backend runs on ("1.32.0"), as its library reports it.
std::string onnxruntime_version();

class OnnxRuntimeStep : public StepBackend {
 public:
  // `graph`: one of the bundle's step graphs (Bundle::step_graph). `threads`: ONNX Runtime's intra-op threads (0:
  // its default, one per core). An Error names a graph ONNX Runtime cannot load or one that is not this bundle's.
  OnnxRuntimeStep(const std::filesystem::path& graph, const Bundle& bundle, int threads = 0);
  ~OnnxRuntimeStep() override;

  const std::vector<float>& step(const std::vector<float>& frame) override;
  void reset() override;
  void keep_streams(const std::vector<int>& idle) override;
  void reset_stream(int stream) override;
  std::vector<uint8_t> stream_state(int stream) const override;
  void set_stream_state(int stream, const std::vector<uint8_t>& bytes) override;
  std::vector<size_t> state_element_bytes() const override;
  void warm_up() override;
  // A graph exported with --fuse-queries: the queries' embeddings fed with every frame, their cosines read back.
  int query_rows() const override;
  void set_queries(const std::vector<float>& embeddings) override;
  const std::vector<float>& cosines() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sdqes
