// TensorRT backend (compiled only where CMake finds TensorRT and CUDA): two device state buffer sets,
// swapped every frame, so a state input and its output are never the same buffer.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "sdqes/runtime.hpp"
#include "sdqes/step_backend.hpp"

namespace sdqes {

// This GPU's compute capability (device 0) and the TensorRT this backend was compiled against: what an engine
// must have been built for (find_engine picks it by its sidecar).
EngineTarget current_engine_target();

class TensorRTStep : public StepBackend {
 public:
  TensorRTStep(const std::filesystem::path& engine, const Bundle& bundle);
  ~TensorRTStep() override;

  // The embeddings on the host; the state stays on the device.
  const std::vector<float>& step(const std::vector<float>& frame) override;
  void reset() override;
  // Device-to-device copies of the idle streams' rows, queued before the next step on the same CUDA stream.
  void keep_streams(const std::vector<int>& idle) override;
  void reset_stream(int stream) override;
  // Copied from and to the device, after the queued work is done.
  std::vector<uint8_t> stream_state(int stream) const override;
  void set_stream_state(int stream, const std::vector<uint8_t>& bytes) override;
  std::vector<size_t> state_element_bytes() const override;
  void warm_up() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sdqes
