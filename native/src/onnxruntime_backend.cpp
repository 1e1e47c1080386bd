// ONNX Runtime backend for sdqes-run (sdqes/onnxruntime_backend.hpp).
#include "sdqes/onnxruntime_backend.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <cstring>
#include <numeric>

// The API is looked up when the first step is made, not by a static initializer: an ONNX Runtime older than these
// headers has no such API version, and is then named in an Error instead of crashing at start-up.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

namespace sdqes {

namespace {

constexpr const char* kFrameInput = "frame";
constexpr const char* kEmbeddingOutput = "embedding";

size_t element_bytes(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return 2;
    default: return 0;
  }
}

struct TensorInfo {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;  // as the graph declares it (-1: a dimension it leaves open)
};

// name -> what each input (or output) of the session is.
std::map<std::string, TensorInfo> tensor_infos(const Ort::Session& session, bool inputs) {
  Ort::AllocatorWithDefaultOptions allocator;
  std::map<std::string, TensorInfo> infos;
  const size_t count = inputs ? session.GetInputCount() : session.GetOutputCount();
  for (size_t i = 0; i < count; ++i) {
    const auto name =
        inputs ? session.GetInputNameAllocated(i, allocator) : session.GetOutputNameAllocated(i, allocator);
    const auto info = inputs ? session.GetInputTypeInfo(i) : session.GetOutputTypeInfo(i);
    if (info.GetONNXType() != ONNX_TYPE_TENSOR) continue;
    const auto tensor = info.GetTensorTypeAndShapeInfo();
    infos[name.get()] = {tensor.GetElementType(), tensor.GetShape()};
  }
  return infos;
}

// The shape a state tensor is given to the graph in: the graph's own where it fixes every dimension (a batch-1
// graph may leave the batch out of a state it carries), else the manifest's; an Error where their sizes differ.
std::vector<int64_t> state_shape(const TensorInfo& graph, const StateTensor& spec, const std::string& where) {
  if (std::any_of(graph.shape.begin(), graph.shape.end(), [](int64_t d) { return d < 0; })) return spec.shape;
  const int64_t elements = std::accumulate(graph.shape.begin(), graph.shape.end(), int64_t{1}, std::multiplies<>());
  if (elements != spec.elements()) {
    throw Error(where + " holds " + std::to_string(elements) + " numbers where the manifest's state spec says " +
                std::to_string(spec.elements()) + ", so the graph is not this bundle's step graph; re-export it");
  }
  return graph.shape;
}

// A state tensor's bytes, every element `value` in its type.
void fill(std::vector<uint8_t>& bytes, ONNXTensorElementDataType type, float value) {
  if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    for (size_t i = 0; i < bytes.size(); i += sizeof(float)) std::memcpy(&bytes[i], &value, sizeof(float));
  } else {
    const uint16_t half = Ort::Float16_t(value).val;
    for (size_t i = 0; i < bytes.size(); i += sizeof(half)) std::memcpy(&bytes[i], &half, sizeof(half));
  }
}

}  // namespace

std::string onnxruntime_version() { return Ort::GetVersionString(); }

namespace {

void init_api() {
  const OrtApi* api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    throw Error("ONNX Runtime " + onnxruntime_version() + " is older than the release sdqes-run was built against "
                "(its C API version " + std::to_string(ORT_API_VERSION) + "); run it with that ONNX Runtime or "
                "newer, or build sdqes-run against this one's headers");
  }
  Ort::InitApi(api);
}

}  // namespace

struct OnnxRuntimeStep::Impl {
  bool api_ready = (init_api(), true);  // first: the members below call into the API as they are made
  Ort::Env env{ORT_LOGGING_LEVEL_ERROR, "sdqes-run"};
  Ort::Session session{nullptr};
  Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  // frame[, query_embeddings], state_in.*; embedding[, logits], state_out.*
  std::vector<std::string> input_names, output_names;
  std::vector<const char*> inputs_named, outputs_named;
  std::vector<float> frame, embedding;
  int query_rows = 0;  // a graph exported with --fuse-queries: the queries it scores at most (Q); else 0
  std::vector<float> queries, cosines;  // its query input [Q, E] (rows past the queries set: zero); logits [B, Q]
  std::vector<StateTensor> spec;
  std::vector<ONNXTensorElementDataType> types;  // each state tensor's
  std::vector<std::vector<int64_t>> shapes;      // each state tensor's, as the graph takes it
  std::array<std::vector<std::vector<uint8_t>>, 2> state;  // two sets: one read, the other written
  // Per set s: inputs (the frame, set s) and outputs (the embedding, set 1 - s), made once over the buffers above.
  std::array<std::vector<Ort::Value>, 2> in, out;
  int current = 0;  // the set the next step reads
  int streams = 1;  // B: the streams each step steps, each its own rows of every state tensor

  Ort::Value over(void* data, size_t bytes, const std::vector<int64_t>& shape, ONNXTensorElementDataType type) {
    return Ort::Value::CreateTensor(memory, data, bytes, shape.data(), shape.size(), type);
  }
};

OnnxRuntimeStep::OnnxRuntimeStep(const std::filesystem::path& graph, const Bundle& bundle, int threads)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  Ort::SessionOptions options;
  if (threads > 0) options.SetIntraOpNumThreads(threads);
  options.AddConfigEntry("session.intra_op.allow_spinning", "0");  // the reader thread needs its core between steps
  try {
    m.session = Ort::Session(m.env, graph.c_str(), options);
  } catch (const Ort::Exception& e) {
    throw Error("ONNX Runtime " + onnxruntime_version() + " cannot load " + graph.string() + " (" +
                std::string(e.what()).substr(0, std::string(e.what()).find('\n')) +
                "); re-export the bundle, or build sdqes-run on a newer ONNX Runtime");
  }
  const auto inputs = tensor_infos(m.session, true);
  const auto outputs = tensor_infos(m.session, false);
  const std::string not_ours = " is not this bundle's step graph; re-export the bundle";
  const auto expect = [&](const std::map<std::string, TensorInfo>& have, const std::string& name) {
    const auto it = have.find(name);
    if (it == have.end() || element_bytes(it->second.type) == 0) {
      throw Error(graph.string() + " has no float tensor " + name + ", so it" + not_ours);
    }
    return it->second;
  };
  if (expect(inputs, kFrameInput).type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ||
      expect(outputs, kEmbeddingOutput).type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    throw Error(graph.string() + "'s frame or embedding is not fp32, so it" + not_ours);
  }
  m.spec = bundle.state;
  m.streams = static_cast<int>(bundle.batch);
  m.input_names = {kFrameInput};
  m.output_names = {kEmbeddingOutput};
  if (const auto fused = inputs.find(kQueryInput); fused != inputs.end()) {
    // --fuse-queries: the queries' embeddings [Q, E] in (Q fixed at export), their cosines [B, Q] out.
    const auto& shape = fused->second.shape;
    const TensorInfo logits = expect(outputs, kLogitsOutput);
    if (fused->second.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || shape.size() != 2 || shape[0] <= 0 ||
        shape[1] != bundle.embed_dim || logits.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ||
        logits.shape.size() != 2 || logits.shape[1] != shape[0]) {
      throw Error(graph.string() + "'s " + kQueryInput + " is not fp32 [Q, " + std::to_string(bundle.embed_dim) +
                  "] with its " + kLogitsOutput + " fp32 [B, Q], so it" + not_ours);
    }
    m.query_rows = static_cast<int>(shape[0]);
    m.input_names.push_back(kQueryInput);
    m.output_names.push_back(kLogitsOutput);
  }
  for (const StateTensor& t : m.spec) {
    const TensorInfo in = expect(inputs, t.input_name());
    const auto type = in.type;
    if (expect(outputs, t.output_name()).type != type) {
      throw Error(graph.string() + "'s " + t.input_name() + " and " + t.output_name() + " differ in type, so it" +
                  not_ours);
    }
    m.types.push_back(type);
    m.shapes.push_back(state_shape(in, t, graph.string() + "'s " + t.input_name()));
    m.input_names.push_back(t.input_name());
    m.output_names.push_back(t.output_name());
  }
  // Inputs this backend does not give, which ONNX Runtime would refuse the first step without.
  std::string unfed;
  for (const auto& [name, info] : inputs) {
    if (std::find(m.input_names.begin(), m.input_names.end(), name) == m.input_names.end()) {
      unfed += (unfed.empty() ? "" : ", ") + name;
    }
  }
  if (!unfed.empty()) {
    throw Error(graph.string() + " takes " + unfed + ", which sdqes-run does not give, so it" + not_ours);
  }
  for (const auto& n : m.input_names) m.inputs_named.push_back(n.c_str());
  for (const auto& n : m.output_names) m.outputs_named.push_back(n.c_str());
  const int64_t r = bundle.image_size;
  const std::vector<int64_t> frame_shape{bundle.batch, 3, r, r};
  const std::vector<int64_t> embedding_shape{bundle.batch, bundle.embed_dim};
  m.frame.resize(static_cast<size_t>(bundle.batch) * 3 * r * r);
  m.embedding.resize(static_cast<size_t>(bundle.batch) * bundle.embed_dim);
  m.queries.assign(static_cast<size_t>(m.query_rows) * bundle.embed_dim, 0.0f);
  m.cosines.resize(static_cast<size_t>(bundle.batch) * m.query_rows);
  for (auto& set : m.state) {
    for (size_t i = 0; i < m.spec.size(); ++i) set.emplace_back(m.spec[i].elements() * element_bytes(m.types[i]));
  }
  for (int s = 0; s < 2; ++s) {
    m.in[s].push_back(m.over(m.frame.data(), m.frame.size() * sizeof(float), frame_shape,
                             ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
    m.out[s].push_back(m.over(m.embedding.data(), m.embedding.size() * sizeof(float), embedding_shape,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
    if (m.query_rows > 0) {  // in the order of the names: after the frame and the embedding, before the state
      m.in[s].push_back(m.over(m.queries.data(), m.queries.size() * sizeof(float), {m.query_rows, bundle.embed_dim},
                               ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
      m.out[s].push_back(m.over(m.cosines.data(), m.cosines.size() * sizeof(float), {bundle.batch, m.query_rows},
                                ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
    }
    for (size_t i = 0; i < m.spec.size(); ++i) {
      m.in[s].push_back(m.over(m.state[s][i].data(), m.state[s][i].size(), m.shapes[i], m.types[i]));
      m.out[s].push_back(m.over(m.state[1 - s][i].data(), m.state[1 - s][i].size(), m.shapes[i], m.types[i]));
    }
  }
  reset();
}

OnnxRuntimeStep::~OnnxRuntimeStep() = default;

const std::vector<float>& OnnxRuntimeStep::step(const std::vector<float>& frame) {
  Impl& m = *impl_;
  if (frame.size() != m.frame.size()) {
    throw Error("a frame of " + std::to_string(frame.size()) + " floats for a step graph that takes " +
                std::to_string(m.frame.size()));
  }
  std::copy(frame.begin(), frame.end(), m.frame.begin());
  const int s = m.current;
  try {
    m.session.Run(Ort::RunOptions{nullptr}, m.inputs_named.data(), m.in[s].data(), m.in[s].size(),
                  m.outputs_named.data(), m.out[s].data(), m.out[s].size());
  } catch (const Ort::Exception& e) {
    throw Error(std::string("ONNX Runtime failed on a step: ") + e.what());
  }
  m.current = 1 - s;  // what it wrote is what the next step reads
  return m.embedding;
}

int OnnxRuntimeStep::query_rows() const { return impl_->query_rows; }

void OnnxRuntimeStep::set_queries(const std::vector<float>& embeddings) {
  Impl& m = *impl_;
  if (m.query_rows == 0) StepBackend::set_queries(embeddings);  // not a fused graph: the caller's mistake
  const size_t width = m.queries.size() / m.query_rows;
  if (embeddings.size() > m.queries.size() || embeddings.size() % width != 0) {
    throw Error("the step graph scores at most " + std::to_string(m.query_rows) + " queries (exported with "
                "--fuse-queries), and " + std::to_string(embeddings.size() / width) + " (" +
                std::to_string(embeddings.size()) + " floats) are given; re-export the bundle with its queries");
  }
  std::copy(embeddings.begin(), embeddings.end(), m.queries.begin());
  std::fill(m.queries.begin() + static_cast<std::ptrdiff_t>(embeddings.size()), m.queries.end(), 0.0f);
}

const std::vector<float>& OnnxRuntimeStep::cosines() const {
  if (impl_->query_rows == 0) return StepBackend::cosines();
  return impl_->cosines;
}

void OnnxRuntimeStep::reset() {
  Impl& m = *impl_;
  for (auto& set : m.state) {
    for (size_t i = 0; i < m.spec.size(); ++i) fill(set[i], m.types[i], m.spec[i].initial_value);
  }
  m.current = 0;
}

void OnnxRuntimeStep::keep_streams(const std::vector<int>& idle) {
  Impl& m = *impl_;
  const auto& read = m.state[1 - m.current];  // what the last step read; it wrote m.state[m.current]
  for (const int stream : idle) {
    for (size_t i = 0; i < m.spec.size(); ++i) {
      const auto rows = stream_bytes(read[i].size(), m.streams, stream);
      std::memcpy(m.state[m.current][i].data() + rows.offset, read[i].data() + rows.offset, rows.size);
    }
  }
}

void OnnxRuntimeStep::reset_stream(int stream) {
  Impl& m = *impl_;
  for (size_t i = 0; i < m.spec.size(); ++i) {
    auto& next = m.state[m.current][i];  // the set the next step reads
    const auto rows = stream_bytes(next.size(), m.streams, stream);
    std::vector<uint8_t> initial(rows.size);
    fill(initial, m.types[i], m.spec[i].initial_value);
    std::copy(initial.begin(), initial.end(), next.begin() + static_cast<std::ptrdiff_t>(rows.offset));
  }
}

std::vector<uint8_t> OnnxRuntimeStep::stream_state(int stream) const {
  const Impl& m = *impl_;
  std::vector<uint8_t> bytes;
  for (const auto& tensor : m.state[m.current]) {  // the set the next step reads
    const auto rows = stream_bytes(tensor.size(), m.streams, stream);
    bytes.insert(bytes.end(), tensor.begin() + static_cast<std::ptrdiff_t>(rows.offset),
                 tensor.begin() + static_cast<std::ptrdiff_t>(rows.offset + rows.size));
  }
  return bytes;
}

void OnnxRuntimeStep::set_stream_state(int stream, const std::vector<uint8_t>& bytes) {
  Impl& m = *impl_;
  size_t at = 0;
  for (const auto& tensor : m.state[m.current]) at += stream_bytes(tensor.size(), m.streams, stream).size;
  if (bytes.size() != at) {
    throw Error("a stream's state of " + std::to_string(bytes.size()) + " bytes for a step graph whose stream holds " +
                std::to_string(at));
  }
  at = 0;
  for (auto& tensor : m.state[m.current]) {
    const auto rows = stream_bytes(tensor.size(), m.streams, stream);
    std::memcpy(tensor.data() + rows.offset, bytes.data() + at, rows.size);
    at += rows.size;
  }
}

std::vector<size_t> OnnxRuntimeStep::state_element_bytes() const {
  std::vector<size_t> sizes;
  for (const auto type : impl_->types) sizes.push_back(element_bytes(type));
  return sizes;
}

void OnnxRuntimeStep::warm_up() {
  const std::vector<float> blank(impl_->frame.size(), 0.0f);
  step(blank);
  step(blank);
  reset();
}

}  // namespace sdqes
