// What steps a bundle's step graph frame by frame, carrying its state: TensorRTStep on an NVIDIA GPU,
// OnnxRuntimeStep on the CPU. sdqes-run streams on either.
#pragma once

#include <stdexcept>
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

  // A step graph exported with --fuse-queries scores its queries itself: their embeddings go in with every frame
  // and their cosines come out. At most this many (fixed at export); 0: the caller scores the embedding.
  virtual int query_rows() const { return 0; }
  // The embeddings [n, E] (n <= query_rows()) of the queries the graph scores from the next step on; the rows past
  // them are zero, as the Python runtime pads them (runtime/queries.py's QueryBank.graph_input).
  virtual void set_queries(const std::vector<float>& /*embeddings*/) { not_fused(); }
  // The last step's cosines [B, query_rows()]: its first n columns are the queries set.
  virtual const std::vector<float>& cosines() const { not_fused(); }

 private:
  [[noreturn]] static void not_fused() {
    throw std::logic_error("the step graph leaves scoring to its caller (query_rows() is 0)");
  }
};

}  // namespace sdqes
