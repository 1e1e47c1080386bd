#include "sdqes/tensorrt_backend.hpp"

#include <cstring>
#include <fstream>
#include <iterator>

#include <NvInfer.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

namespace sdqes {
namespace {

struct Logger : nvinfer1::ILogger {
  void log(Severity severity, const char* message) noexcept override {
    if (severity <= Severity::kWARNING) std::fprintf(stderr, "TensorRT: %s\n", message);
  }
};

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
}

// The bytes of one element of an engine's I/O tensor, read from the engine itself: an fp16 engine built strongly
// typed (TensorRT 11) holds its state in fp16, one built from the fp32 graph in fp32. Anything else is refused.
size_t element_bytes(const nvinfer1::ICudaEngine& engine, const std::string& name, const std::string& rebuild) {
  if (engine.getTensorIOMode(name.c_str()) == nvinfer1::TensorIOMode::kNONE) {
    throw Error("the engine has no tensor " + name + ", so it is not this bundle's step graph; " + rebuild);
  }
  switch (engine.getTensorDataType(name.c_str())) {
    case nvinfer1::DataType::kFLOAT: return sizeof(float);
    case nvinfer1::DataType::kHALF: return sizeof(__half);
    default: throw Error("the engine's " + name + " is neither fp32 nor fp16; " + rebuild);
  }
}

// ``count`` copies of ``value`` as the engine stores them (fp32 or fp16 bytes).
std::vector<unsigned char> filled(int64_t count, float value, size_t bytes_each) {
  std::vector<unsigned char> out(static_cast<size_t>(count) * bytes_each);
  for (int64_t i = 0; i < count; ++i) {
    if (bytes_each == sizeof(float)) {
      std::memcpy(out.data() + i * bytes_each, &value, sizeof(float));
    } else {
      const __half half = __float2half(value);
      std::memcpy(out.data() + i * bytes_each, &half, sizeof(__half));
    }
  }
  return out;
}

}  // namespace

EngineTarget current_engine_target() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  EngineTarget target;
  target.cc_major = properties.major;
  target.cc_minor = properties.minor;
  target.tensorrt_version = std::to_string(NV_TENSORRT_MAJOR) + "." + std::to_string(NV_TENSORRT_MINOR) + "." +
                            std::to_string(NV_TENSORRT_PATCH);
  return target;
}

struct TensorRTStep::Impl {
  Logger logger;
  std::unique_ptr<nvinfer1::IRuntime> runtime;
  std::unique_ptr<nvinfer1::ICudaEngine> engine;
  std::unique_ptr<nvinfer1::IExecutionContext> context;
  cudaStream_t stream = nullptr;
  void* frame = nullptr;
  void* embedding = nullptr;
  std::vector<void*> sets[2];
  std::vector<std::vector<unsigned char>> initial;  // each state tensor's initial bytes, in the engine's dtype
  std::vector<StateTensor> state;
  std::vector<float> host_embedding;
  size_t frame_bytes = 0;
  int current = 0;
  int streams = 1;  // B: the streams each step steps, each its own rows of every state tensor
};

TensorRTStep::TensorRTStep(const std::filesystem::path& engine_path, const Bundle& bundle) : impl_(new Impl) {
  auto& m = *impl_;
  std::ifstream in(engine_path, std::ios::binary);
  const std::vector<char> blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  m.runtime.reset(nvinfer1::createInferRuntime(m.logger));
  m.engine.reset(m.runtime->deserializeCudaEngine(blob.data(), blob.size()));
  if (!m.engine) throw Error("TensorRT cannot load " + engine_path.string() + "; rebuild it with sdqes-edge build-engine");
  const std::string rebuild = "rebuild it: sdqes-edge build-engine " + bundle.root.string();
  if (m.engine->getTensorIOMode(kQueryInput) == nvinfer1::TensorIOMode::kINPUT) {  // not built by build-engine
    throw Error("the engine " + engine_path.filename().string() + " takes " + kQueryInput + " (its bundle was "
                "exported with --fuse-queries), which the TensorRT backend does not give; give --backend onnxruntime, "
                "or re-export the bundle without --fuse-queries and rebuild the engine");
  }
  // The frame goes in and the embedding comes out as floats (every step graph's ends are fp32).
  for (const char* name : {"frame", "embedding"}) {
    if (element_bytes(*m.engine, name, rebuild) != sizeof(float)) {
      throw Error(std::string("the engine's ") + name + " is not fp32; " + rebuild);
    }
  }
  m.context.reset(m.engine->createExecutionContext());
  check(cudaStreamCreate(&m.stream), "cudaStreamCreate");
  m.state = bundle.state;
  m.streams = static_cast<int>(bundle.batch);
  m.frame_bytes = sizeof(float) * bundle.batch * 3 * bundle.image_size * bundle.image_size;
  m.host_embedding.resize(static_cast<size_t>(bundle.batch) * bundle.embed_dim);
  check(cudaMalloc(&m.frame, m.frame_bytes), "cudaMalloc");
  check(cudaMalloc(&m.embedding, m.host_embedding.size() * sizeof(float)), "cudaMalloc");
  for (const auto& t : m.state) {
    const size_t bytes_each = element_bytes(*m.engine, t.input_name(), rebuild);
    if (element_bytes(*m.engine, t.output_name(), rebuild) != bytes_each) {
      throw Error("the engine's " + t.input_name() + " and " + t.output_name() + " differ in dtype; " + rebuild);
    }
    m.initial.push_back(filled(t.elements(), t.initial_value, bytes_each));
    for (auto& set : m.sets) {
      void* buffer = nullptr;
      check(cudaMalloc(&buffer, m.initial.back().size()), "cudaMalloc");
      set.push_back(buffer);
    }
  }
  reset();
}

TensorRTStep::~TensorRTStep() {
  auto& m = *impl_;
  for (auto& set : m.sets)
    for (void* buffer : set) cudaFree(buffer);
  cudaFree(m.frame);
  cudaFree(m.embedding);
  if (m.stream) cudaStreamDestroy(m.stream);
}

void TensorRTStep::reset() {
  auto& m = *impl_;
  for (size_t i = 0; i < m.state.size(); ++i) {
    check(cudaMemcpy(m.sets[0][i], m.initial[i].data(), m.initial[i].size(), cudaMemcpyHostToDevice), "reset");
  }
  m.current = 0;
}

void TensorRTStep::keep_streams(const std::vector<int>& idle) {
  auto& m = *impl_;
  const int read = 1 - m.current;  // what the last step read; it wrote sets[current]
  for (const int stream : idle) {
    for (size_t i = 0; i < m.state.size(); ++i) {
      const auto rows = stream_bytes(m.initial[i].size(), m.streams, stream);
      check(cudaMemcpyAsync(static_cast<unsigned char*>(m.sets[m.current][i]) + rows.offset,
                            static_cast<const unsigned char*>(m.sets[read][i]) + rows.offset, rows.size,
                            cudaMemcpyDeviceToDevice, m.stream), "keep an idle stream's state");
    }
  }
}

void TensorRTStep::reset_stream(int stream) {
  auto& m = *impl_;
  for (size_t i = 0; i < m.state.size(); ++i) {
    const auto rows = stream_bytes(m.initial[i].size(), m.streams, stream);
    check(cudaMemcpy(static_cast<unsigned char*>(m.sets[m.current][i]) + rows.offset,
                     m.initial[i].data() + rows.offset, rows.size, cudaMemcpyHostToDevice), "reset a stream");
  }
}

std::vector<uint8_t> TensorRTStep::stream_state(int stream) const {
  const auto& m = *impl_;
  check(cudaStreamSynchronize(m.stream), "synchronize");  // an idle stream's rows may still be on their way
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < m.state.size(); ++i) {
    const auto rows = stream_bytes(m.initial[i].size(), m.streams, stream);
    const size_t at = bytes.size();
    bytes.resize(at + rows.size);
    check(cudaMemcpy(bytes.data() + at, static_cast<const unsigned char*>(m.sets[m.current][i]) + rows.offset,
                     rows.size, cudaMemcpyDeviceToHost), "read a stream's state");
  }
  return bytes;
}

void TensorRTStep::set_stream_state(int stream, const std::vector<uint8_t>& bytes) {
  auto& m = *impl_;
  size_t at = 0;
  for (const auto& initial : m.initial) at += stream_bytes(initial.size(), m.streams, stream).size;
  if (bytes.size() != at) {
    throw Error("a stream's state of " + std::to_string(bytes.size()) + " bytes for an engine whose stream holds " +
                std::to_string(at));
  }
  check(cudaStreamSynchronize(m.stream), "synchronize");
  at = 0;
  for (size_t i = 0; i < m.state.size(); ++i) {
    const auto rows = stream_bytes(m.initial[i].size(), m.streams, stream);
    check(cudaMemcpy(static_cast<unsigned char*>(m.sets[m.current][i]) + rows.offset, bytes.data() + at, rows.size,
                     cudaMemcpyHostToDevice), "give a stream its state");
    at += rows.size;
  }
}

std::vector<size_t> TensorRTStep::state_element_bytes() const {
  std::vector<size_t> sizes;
  for (size_t i = 0; i < impl_->state.size(); ++i) {
    sizes.push_back(impl_->initial[i].size() / static_cast<size_t>(impl_->state[i].elements()));
  }
  return sizes;
}

void TensorRTStep::warm_up() {
  const std::vector<float> blank(impl_->frame_bytes / sizeof(float), 0.0f);
  for (size_t set = 0; set < std::size(impl_->sets); ++set) step(blank);  // each set read, each written once
  reset();
}

const std::vector<float>& TensorRTStep::step(const std::vector<float>& frame) {
  auto& m = *impl_;
  const int in = m.current, out = 1 - m.current;
  check(cudaMemcpyAsync(m.frame, frame.data(), m.frame_bytes, cudaMemcpyHostToDevice, m.stream), "frame in");
  m.context->setTensorAddress("frame", m.frame);
  m.context->setTensorAddress("embedding", m.embedding);
  for (size_t i = 0; i < m.state.size(); ++i) {
    m.context->setTensorAddress(m.state[i].input_name().c_str(), m.sets[in][i]);
    m.context->setTensorAddress(m.state[i].output_name().c_str(), m.sets[out][i]);
  }
  if (!m.context->enqueueV3(m.stream)) throw Error("TensorRT failed to run the engine; rebuild it");
  check(cudaMemcpyAsync(m.host_embedding.data(), m.embedding, m.host_embedding.size() * sizeof(float),
                        cudaMemcpyDeviceToHost, m.stream), "embedding out");
  check(cudaStreamSynchronize(m.stream), "synchronize");
  m.current = out;
  return m.host_embedding;
}

}  // namespace sdqes
