// What steps a bundle's step graph frame by frame, carrying its state: TensorRTStep on an NVIDIA GPU,
// OnnxRuntimeStep on the CPU. sdqes-run streams on either.
#pragma once

#include <vector>

namespace sdqes {

class StepBackend {
 public:
  StepBackend() = default;
  virtual ~StepBackend() = default;
  StepBackend(const StepBackend&) = delete;  // each holds its state buffers (on the device, or in a session)
  StepBackend& operator=(const StepBackend&) = delete;
  // frame: [B, 3, R, R] floats; returns the embeddings [B, E]; the state is carried to the next call.
  virtual const std::vector<float>& step(const std::vector<float>& frame) = 0;
  virtual void reset() = 0;
  // Steps a blank frame through each state buffer set, then resets the state: the first runs' one-off work
  // (TensorRT's, ONNX Runtime's allocations) does not land on the first real frame, the one an alert may hang on.
  virtual void warm_up() = 0;
};

}  // namespace sdqes
