// TensorRT backend (compiled only where CMake finds TensorRT and CUDA): two device state buffer sets,
// swapped every frame, so a state input and its output are never the same buffer.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "sdqes/runtime.hpp"

namespace sdqes {

// This GPU's compute capability (device 0) and the TensorRT this backend was compiled against: what an engine
// must have been built for (find_engine picks it by its sidecar).
EngineTarget current_engine_target();

class TensorRTStep {
 public:
  TensorRTStep(const std::filesystem::path& engine, const Bundle& bundle);
  ~TensorRTStep();
  TensorRTStep(const TensorRTStep&) = delete;
  TensorRTStep& operator=(const TensorRTStep&) = delete;

  // frame: [B, 3, R, R] floats; returns the embeddings [B, E]; the state stays on the device.
  const std::vector<float>& step(const std::vector<float>& frame);
  void reset();
  // Steps a blank frame through each state buffer set, then resets the state: TensorRT's first executions
  // carry one-off work that would otherwise land on the first real frame, the one an alert may hang on.
  void warm_up();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sdqes
