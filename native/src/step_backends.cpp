// Opening a bundle's step graph on a backend, and scoring its queries from a step (sdqes/step_backend.hpp): what
// sdqes-run and the C API share.
#include "sdqes/step_backend.hpp"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "sdqes/runtime.hpp"
#ifdef SDQES_WITH_TENSORRT
#include "sdqes/tensorrt_backend.hpp"
#endif
#ifdef SDQES_WITH_ONNXRUNTIME
#include "sdqes/onnxruntime_backend.hpp"
#endif

namespace sdqes {

namespace {

// Warmed, and given the queries where its graph scores them itself (exported with --fuse-queries).
OpenedStep warmed(std::unique_ptr<StepBackend> backend, std::string words, const Bundle& bundle,
                  const QueryTable& queries) {
  backend->warm_up();  // before the first frame: its latency is a steady one
  if (backend->query_rows() > 0) {
    backend->set_queries(queries.embeddings);  // refuses more queries than the graph scores
    words += ", its queries scored inside the graph";
  }
  std::vector<std::string> state_names;
  for (const StateTensor& t : bundle.state) state_names.push_back(t.name);
  return {std::move(backend), std::move(words), model_identity(bundle), std::move(state_names)};
}

}  // namespace

const char* default_backend() {
#if defined(SDQES_WITH_TENSORRT) || !defined(SDQES_WITH_ONNXRUNTIME)
  return "tensorrt";
#else
  return "onnxruntime";
#endif
}

std::string built_backends() {
  std::string built;
#ifdef SDQES_WITH_TENSORRT
  built += "tensorrt";
#endif
#ifdef SDQES_WITH_ONNXRUNTIME
  built += built.empty() ? "onnxruntime" : ", onnxruntime";
#endif
  return built.empty() ? "none" : built;
}

void check_backend(const std::string& backend, const std::string& named_as) {
  if (backend != "tensorrt" && backend != "onnxruntime") {
    throw Error(named_as + " " + backend + " is not one of tensorrt, onnxruntime");
  }
}

const char* default_precision(const std::string& backend) { return backend == "tensorrt" ? "fp16" : "fp32"; }

std::string slow_precision_words(const std::string& backend, const std::string& precision, const std::string& bundle) {
  if (backend != "onnxruntime" || precision != "fp16") return "";
  return "the fp16 graph is a GPU format: ONNX Runtime's CPU provider has no fp16 kernel for most of its operators "
         "and runs them in float32 between Casts it adds, no faster than fp32 (`sdqes-edge inspect " + bundle +
         " --precision fp16` counts them); on a CPU use fp32 or int8";
}

int usable_cores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) return CPU_COUNT(&allowed);
  return std::max(1U, std::thread::hardware_concurrency());
}

int threads_within_cores(int threads) { return threads > 0 ? std::min(threads, usable_cores()) : threads; }

OpenedStep open_step(const Bundle& bundle, const QueryTable& queries, const std::string& backend,
                     const std::string& precision, int threads) {
  check_backend(backend, "backend");
  if (backend == "tensorrt") {
#ifdef SDQES_WITH_TENSORRT
    const auto path = find_engine(bundle, precision, current_engine_target());
    return warmed(std::make_unique<TensorRTStep>(path, bundle), "TensorRT, " + path.filename().string(), bundle,
                  queries);
#else
    (void)find_engine(bundle, precision);  // a bundle without any engine says how to build one first
    throw Error(std::string("this build of sdqes has no TensorRT backend (CMake found no TensorRT/CUDA); build it "
                            "on the NVIDIA device with TensorRT installed") +
                (std::string(default_backend()) == "onnxruntime"
                     ? ", or give --backend onnxruntime to step the bundle's graph on the CPU"
                     : ""));
#endif
  }
#ifdef SDQES_WITH_ONNXRUNTIME
  const auto graph = bundle.step_graph(precision);
  return warmed(std::make_unique<OnnxRuntimeStep>(graph, bundle, threads_within_cores(threads)),
                "ONNX Runtime " + onnxruntime_version() + " on the CPU, " + graph.filename().string(), bundle,
                queries);
#else
  (void)threads;
  (void)queries;
  throw Error("this build of sdqes has no ONNX Runtime backend (CMake found no onnxruntime_cxx_api.h and "
              "libonnxruntime); build it with ONNXRUNTIME_ROOT set to an ONNX Runtime release folder");
#endif
}

std::vector<float> query_probabilities(const StepBackend& backend, const std::vector<float>& embedding,
                                       const QueryTable& queries, int stream) {
  const auto row = static_cast<size_t>(stream);
  if (backend.query_rows() > 0) {
    return probabilities_of(backend.cosines().data() + row * backend.query_rows(), queries.texts.size());
  }
  return probabilities(embedding.data() + row * static_cast<size_t>(queries.dim), queries);
}

StreamBatch::StreamBatch(int streams, size_t frame_floats)
    : frame_floats_(frame_floats), batch_(frame_floats * static_cast<size_t>(streams), 0.0f),
      is_idle_(static_cast<size_t>(streams), 0) {}

const std::vector<float>* StreamBatch::step(StepBackend& backend, const float* const* frames) {
  idle_.clear();
  for (int b = 0; b < streams(); ++b) {
    float* slot = batch_.data() + static_cast<size_t>(b) * frame_floats_;
    is_idle_[static_cast<size_t>(b)] = frames[b] == nullptr;
    if (frames[b]) {
      std::copy(frames[b], frames[b] + frame_floats_, slot);
    } else {
      idle_.push_back(b);
      std::fill(slot, slot + frame_floats_, 0.0f);
    }
  }
  if (idle_.size() == is_idle_.size()) return nullptr;
  const auto& embedding = backend.step(batch_);
  if (!idle_.empty()) backend.keep_streams(idle_);
  return &embedding;
}

StreamBytes stream_bytes(size_t tensor_bytes, int streams, int stream) {
  if (streams < 1 || stream < 0 || stream >= streams) {
    throw Error("stream " + std::to_string(stream) + " is out of range: the step graph steps " +
                (streams == 1 ? std::string("one stream, 0")
                              : std::to_string(streams) + " streams, 0 to " + std::to_string(streams - 1)));
  }
  const size_t each = tensor_bytes / static_cast<size_t>(streams);
  return {each * static_cast<size_t>(stream), each};
}

}  // namespace sdqes
