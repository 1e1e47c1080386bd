// What steps a bundle's step graph frame by frame, carrying its state: TensorRTStep on an NVIDIA GPU,
// OnnxRuntimeStep on the CPU. sdqes-run streams on either.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace sdqes {

struct Bundle;
struct QueryTable;

class StepBackend {
 public:
  StepBackend() = default;
  virtual ~StepBackend() = default;
  StepBackend(const StepBackend&) = delete;  // each holds its state buffers (on the device, or in a session)
  StepBackend& operator=(const StepBackend&) = delete;
  // frame: [B, 3, R, R] floats; returns the embeddings [B, E]; the state is carried to the next call.
  virtual const std::vector<float>& step(const std::vector<float>& frame) = 0;
  virtual void reset() = 0;
  // A graph exported for several streams (--batch B) steps them all at once, each its own rows of every state
  // tensor ([B*L, ...], stream-major). Called after a step: the streams in `idle` (0 <= b < B) had no frame, and get
  // back the state that step read, as if it had not run for them (the Python runtime's keep_streams).
  virtual void keep_streams(const std::vector<int>& idle) = 0;
  // One stream's state back to its initial value (a new scene on that camera) for the next step; the others kept.
  virtual void reset_stream(int stream) = 0;
  // One stream's memory: its rows of every state tensor as the next step reads them, one tensor after another in the
  // state spec's order, each in the graph's element type. What a memory file keeps (sdqes/memory_file.hpp).
  virtual std::vector<uint8_t> stream_state(int stream) const = 0;
  // Gives a stream back the memory stream_state gave (of this graph: the caller checks); the others' kept.
  virtual void set_stream_state(int stream, const std::vector<uint8_t>& bytes) = 0;
  // Each state tensor's element size in bytes (4: fp32, 2: fp16), in the spec's order.
  virtual std::vector<size_t> state_element_bytes() const = 0;
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

// The backend a run steps on unless told: TensorRT where this build has it (the GPU it is for), else ONNX Runtime.
const char* default_backend();
// The backends this build has, in order of preference ("tensorrt, onnxruntime"; "none" without either).
std::string built_backends();
// An Error, "<named_as> <backend> is not one of tensorrt, onnxruntime", unless it is one of them.
void check_backend(const std::string& backend, const std::string& named_as);
// The precision a run on `backend` steps unless told: fp16 on a GPU; on the CPU, where fp16 is emulated, fp32.
const char* default_precision(const std::string& backend);
// Why `precision`'s graph is the wrong one for `backend` and which to use (onnxruntime_backend.py's
// slow_precision_words, in its words; `bundle` as the user named it); "" where it fits. The fp16 graph on ONNX
// Runtime, which runs on the CPU here, is no faster than fp32.
std::string slow_precision_words(const std::string& backend, const std::string& precision, const std::string& bundle);

// The cores this process may run on (a container's or taskset's CPU set, not the host's), as the Python runtime
// counts them (runtime/cores.py).
int usable_cores();
// ONNX Runtime's threads for `threads` asked: more than the usable cores only take turns on them (and 100,000 of
// them exhausted the process's threads inside sdqes_step_open), so they are brought down to the cores; 0 stays 0
// (ONNX Runtime's one per core).
int threads_within_cores(int threads);

// A step graph opened, warmed and given its queries where it scores them itself, and what runs it in words
// ("ONNX Runtime 1.32.0 on the CPU, step.fp32.onnx"), for the line a run starts with.
struct OpenedStep {
  std::unique_ptr<StepBackend> backend;
  std::string words;
  std::string model_identity;            // the bundle's (sdqes::model_identity): what its memory files are tied to
  std::vector<std::string> state_names;  // its state tensors', in the spec's order
};

// The bundle's step graph for `precision` on `backend`: "tensorrt", the engine built for this GPU and TensorRT (by
// its sidecar); "onnxruntime", its ONNX graph on the CPU with `threads` (0: one per core). An Error where this
// build lacks that backend, or the bundle lacks what it needs (an engine for this GPU, a graph of that precision).
OpenedStep open_step(const Bundle& bundle, const QueryTable& queries, const std::string& backend,
                     const std::string& precision, int threads = 0);

// p = sigmoid(cos) of each query for `stream` of the step that gave `embedding` ([B, E]): the graph's own cosines
// where it scores the queries itself, else the stream's embedding against their embeddings.
std::vector<float> query_probabilities(const StepBackend& backend, const std::vector<float>& embedding,
                                       const QueryTable& queries, int stream = 0);

// One step of a graph's B streams, a frame given per stream: a stream without one idles, its frame zero (as the Python
// runtime's) and its state kept (StepBackend::keep_streams). sdqes-run and the C API both step through it.
class StreamBatch {
 public:
  StreamBatch(int streams, size_t frame_floats);
  // frames[b]: stream b's frame (frame_floats floats), or nullptr. -> the embeddings [B, E]; nullptr where every
  // stream is idle, and nothing is stepped.
  const std::vector<float>* step(StepBackend& backend, const float* const* frames);
  bool idle(int stream) const { return is_idle_[static_cast<size_t>(stream)] != 0; }  // in the last step
  int streams() const { return static_cast<int>(is_idle_.size()); }

 private:
  size_t frame_floats_;
  std::vector<float> batch_;  // [B, 3, R, R]
  std::vector<int> idle_;
  std::vector<char> is_idle_;
};

// Stream b's bytes of a state tensor of `streams` streams (stream-major: each stream one contiguous block). An
// Error where `stream` is not one of them.
struct StreamBytes {
  size_t offset, size;
};
StreamBytes stream_bytes(size_t tensor_bytes, int streams, int stream);

}  // namespace sdqes
