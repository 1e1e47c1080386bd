// libsdqes_ort_ops: ONNX Runtime kernels for the sdqes_edge operator domain.
//
// The graphs for ONNX Runtime write each QRNN adapter's pooling step as the model-local ONNX function
// sdqes_edge.QrnnPool, a sliding window's pooling over its frames as sdqes_edge.QrnnScan (export/fused_ops.py),
// and each RetNet adapter's retention step as sdqes_edge.RetentionStep (export/fused_retention.py). ONNX Runtime
// inlines a function no kernel claims, so a graph runs everywhere without this library; with it registered
// (SessionOptions.register_custom_ops_library), each is one kernel here, on the CPU and, where built with CUDA, on
// the CUDA provider.
//
// Built by build.sh (sdqes-edge build-ort-ops) against ONNX Runtime's C API headers; needs no ONNX Runtime library
// to link.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "qrnn_pool.h"
#include "retention_step.h"

namespace {

constexpr const char* kDomain = "sdqes_edge";
// The C API version asked of ONNX Runtime, and the one each operator declares: 17, ONNX Runtime 1.17, the oldest
// whose API has every function these kernels call (KernelContext_ParallelFor came in 1.17; the status-returning
// CreateKernelV2/KernelComputeV2 in 1.16) and the oldest this project supports (pyproject.toml). The headers are
// newer (1.21); asking for their version would refuse every ONNX Runtime from 1.17 to 1.20, Jetson's among them.
// ONNX Runtime's API table only grows, so a newer one serves version 17 as it is.
constexpr uint32_t kApiVersion = 17;
static_assert(kApiVersion <= ORT_API_VERSION, "the headers must be at least as new as the API version asked for");
constexpr const char* kCudaProvider = "CUDAExecutionProvider";

template <typename T>
struct Element;

template <>
struct Element<float> {
  static constexpr ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  static constexpr int half = 0;  // the CUDA launchers' flag
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};

template <>
struct Element<Ort::Float16_t> {
  static constexpr ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  static constexpr int half = 1;
  static float load(Ort::Float16_t v) { return v.ToFloat(); }
  static Ort::Float16_t store(float v) { return Ort::Float16_t(v); }
};

// The shapes ONNX Runtime's graph resolution is told a kernel's outputs have (Kernel::output_shapes), so that it
// keeps every later tensor's shape: unknown, its optimizer leaves a product and its bias unfused after the node.
using Shape = Ort::ShapeInferContext::Shape;
using Dimension = Ort::ShapeInferContext::SymbolicInteger;

struct Extent {
  int64_t count;  // elements of the output
  int64_t width;  // r, the pooled state's last axis
};

// gates [..., 2r] and h [..., r] with the same leading axes; anything else is a graph this op was not made for.
Extent checked_extent(const std::vector<int64_t>& gates, const std::vector<int64_t>& h) {
  bool same = !h.empty() && gates.size() == h.size() && gates.back() == 2 * h.back();
  for (size_t i = 0; same && i + 1 < h.size(); ++i) same = gates[i] == h[i];
  if (!same) ORT_CXX_API_THROW("sdqes_edge.QrnnPool: gates must be [..., 2r] and h [..., r] with the same leading axes",
                               ORT_INVALID_ARGUMENT);
  int64_t count = 1;
  for (int64_t d : h) count *= d;
  return {count, h.back()};
}

// An error inside a kernel goes back to ONNX Runtime as a status: no C++ exception crosses its C API.
template <typename Body>
OrtStatusPtr as_status(Body&& body) {
  try {
    body();
    return nullptr;
  } catch (const Ort::Exception& error) {
    return Ort::GetApi().CreateStatus(error.GetOrtErrorCode(), error.what());
  } catch (const std::exception& error) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, error.what());
  }
}

constexpr int64_t kBlock = 4096;  // elements (or a scan's lanes) per task on ONNX Runtime's intra-op threads

// body(begin, end) over [0, count) in blocks of `block`, on the session's intra-op threads (as ONNX Runtime's own
// elementwise kernels run): one thread walking a ViT-B/16 step's 24 pooling steps cost 8% of its CPU time.
template <typename Body>
void parallel_blocks(const Ort::KernelContext& context, int64_t count, Body&& body, int64_t block = kBlock) {
  const int64_t blocks = (count + block - 1) / block;
  if (blocks <= 1) {
    body(int64_t{0}, count);
    return;
  }
  struct Job {
    Body* body;
    int64_t count, block;
  } job{&body, count, block};
  context.ParallelFor(
      [](void* data, size_t index) {
        auto* job = static_cast<Job*>(data);
        const int64_t begin = static_cast<int64_t>(index) * job->block;
        (*job->body)(begin, std::min(begin + job->block, job->count));
      },
      static_cast<size_t>(blocks), 0, &job);
}

#ifdef SDQES_WITH_CUDA
// A CUDA launch that failed, returned to ONNX Runtime as an error of the op.
void check_launch(int error, const char* op) {
  if (error != 0) ORT_CXX_API_THROW(std::string("sdqes_edge.") + op + ": CUDA launch failed, error " +
                                    std::to_string(error), ORT_FAIL);
}
#endif

// What every kernel shares: an error inside its Compute goes back to ONNX Runtime as a status.
template <typename Kernel>
struct ReturnsStatus {
  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    return as_status([&] { static_cast<Kernel*>(this)->Compute(raw); });
  }
};

template <typename T, bool kCuda>
struct QrnnPoolKernel : ReturnsStatus<QrnnPoolKernel<T, kCuda>> {
  using Type = T;
  static constexpr bool kOnCuda = kCuda;
  static constexpr const char* kName = "QrnnPool";
  static constexpr size_t kInputs = 2;  // gates [..., 2r], h [..., r]
  float alpha;

  explicit QrnnPoolKernel(const OrtKernelInfo* info) : alpha(Ort::ConstKernelInfo(info).GetAttribute<float>("alpha")) {}

  static std::vector<Shape> output_shapes(const Ort::ShapeInferContext& context) { return {context.GetInputShape(1)}; }

  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext context(raw);
    auto gates = context.GetInput(0);
    auto h = context.GetInput(1);
    auto h_shape = h.GetTensorTypeAndShapeInfo().GetShape();
    const Extent extent = checked_extent(gates.GetTensorTypeAndShapeInfo().GetShape(), h_shape);
    auto out = context.GetOutput(0, h_shape);
    const T* g = gates.GetTensorData<T>();
    const T* prev = h.GetTensorData<T>();
    T* next = out.GetTensorMutableData<T>();
    if constexpr (kOnCuda) {
#ifdef SDQES_WITH_CUDA
      check_launch(sdqes_qrnn_pool_cuda(context.GetGPUComputeStream(), Element<T>::half, g, prev, next, extent.count,
                                        extent.width, alpha), kName);
#endif
    } else {
      parallel_blocks(context, extent.count, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          const int64_t z = sdqes::z_offset(k, extent.width);
          next[k] = Element<T>::store(sdqes::qrnn_pool(Element<T>::load(g[z]), Element<T>::load(g[z + extent.width]),
                                                       Element<T>::load(prev[k]), alpha));
        }
      });
    }
  }
};

// gates [outer..., T, inner..., 2r] with T on ``axis``: the extent of the scan over it.
sdqes::ScanExtent checked_scan_extent(const std::vector<int64_t>& gates, int64_t axis) {
  const int64_t rank = static_cast<int64_t>(gates.size());
  if (axis < 0) axis += rank;
  if (rank < 2 || axis < 0 || axis >= rank - 1 || gates.back() % 2 != 0)
    ORT_CXX_API_THROW("sdqes_edge.QrnnScan: gates must be [..., T, ..., 2r] with the time axis before the last",
                      ORT_INVALID_ARGUMENT);
  sdqes::ScanExtent extent{1, gates[axis], 1, gates.back() / 2};
  for (int64_t i = 0; i < axis; ++i) extent.outer *= gates[i];
  for (int64_t i = axis + 1; i < rank - 1; ++i) extent.inner *= gates[i];
  return extent;
}

template <typename T, bool kCuda>
struct QrnnScanKernel : ReturnsStatus<QrnnScanKernel<T, kCuda>> {
  using Type = T;
  static constexpr bool kOnCuda = kCuda;
  static constexpr const char* kName = "QrnnScan";
  static constexpr size_t kInputs = 1;  // gates [..., T, ..., 2r]; h starts at 0
  float alpha;
  int64_t axis;

  explicit QrnnScanKernel(const OrtKernelInfo* info)
      : alpha(Ort::ConstKernelInfo(info).GetAttribute<float>("alpha")),
        axis(Ort::ConstKernelInfo(info).GetAttribute<int64_t>("axis")) {}

  static std::vector<Shape> output_shapes(const Ort::ShapeInferContext& context) {  // the gates' with r for 2r
    Shape h = context.GetInputShape(0);
    if (h.empty() || !h.back().IsInt()) return {};
    h.back() = Dimension(h.back().AsInt() / 2);
    return {h};
  }

  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext context(raw);
    auto gates = context.GetInput(0);
    auto shape = gates.GetTensorTypeAndShapeInfo().GetShape();
    const sdqes::ScanExtent extent = checked_scan_extent(shape, axis);
    shape.back() = extent.width;
    auto out = context.GetOutput(0, shape);
    const T* g = gates.GetTensorData<T>();
    T* h = out.GetTensorMutableData<T>();
    if constexpr (kOnCuda) {
#ifdef SDQES_WITH_CUDA
      check_launch(sdqes_qrnn_scan_cuda(context.GetGPUComputeStream(), Element<T>::half, g, h, extent, alpha), kName);
#endif
    } else {
      parallel_blocks(context, extent.outer * extent.inner * extent.width, [&](int64_t begin, int64_t end) {
        for (int64_t lane = begin; lane < end; ++lane) {
          float pooled = 0.0f;
          for (int64_t t = 0; t < extent.frames; ++t) {
            const int64_t o = sdqes::frame_offset(extent, lane, t);
            const int64_t z = sdqes::z_offset(o, extent.width);
            pooled = sdqes::qrnn_pool(Element<T>::load(g[z]), Element<T>::load(g[z + extent.width]), pooled, alpha);
            h[o] = Element<T>::store(pooled);
          }
        }
      });
    }
  }
};

// qkv [..., 3d], state [..., d, d] with the same leading axes, swap [d] exchanging each pair's channels, keep and
// cross of d elements: the extent of the step; anything else is a graph this op was not made for.
sdqes::RetentionExtent checked_retention_extent(const std::vector<int64_t>& qkv, const std::vector<int64_t>& state,
                                                const Ort::ConstValue& swap, size_t keep, size_t cross) {
  const size_t rank = state.size();
  bool fits = rank >= 3 && qkv.size() == rank - 1 && state[rank - 1] == state[rank - 2] &&
              qkv.back() == 3 * state.back() && state.back() % 2 == 0;
  for (size_t i = 0; fits && i + 2 < rank; ++i) fits = qkv[i] == state[i];
  if (!fits) ORT_CXX_API_THROW("sdqes_edge.RetentionStep: qkv must be [..., 3d] and state [..., d, d] (d even) "
                               "with the same leading axes", ORT_INVALID_ARGUMENT);
  const int64_t d = state.back();
  const auto swap_shape = swap.GetTensorTypeAndShapeInfo().GetShape();
  const int64_t* partner = swap.GetTensorData<int64_t>();
  bool pairs = swap_shape.size() == 1 && swap_shape[0] == d && keep == static_cast<size_t>(d) &&
               cross == static_cast<size_t>(d);
  for (int64_t i = 0; pairs && i < d; ++i) pairs = partner[i] == (i ^ 1);
  if (!pairs) ORT_CXX_API_THROW("sdqes_edge.RetentionStep: swap must exchange the two channels of each pair and "
                                "keep and cross have d elements", ORT_INVALID_ARGUMENT);
  int64_t tokens = 1;
  for (size_t i = 0; i + 2 < rank; ++i) tokens *= state[i];
  return {tokens, d};
}

template <typename T, bool kCuda>
struct RetentionStepKernel : ReturnsStatus<RetentionStepKernel<T, kCuda>> {
  using Type = T;
  static constexpr bool kOnCuda = kCuda;
  static constexpr const char* kName = "RetentionStep";
  static constexpr size_t kInputs = 5;  // qkv [..., 3d], state [..., d, d], swap [d], keep [d, 1], cross [d, 1]
  static constexpr size_t kOutputs = 2;  // out [..., d], state_next [..., d, d]
  static constexpr size_t kSwapInput = 2;  // int64, read on the host (checked, then each row's partner is i ^ 1)

  explicit RetentionStepKernel(const OrtKernelInfo*) {}

  static std::vector<Shape> output_shapes(const Ort::ShapeInferContext& context) {  // the state's without its last
    Shape state = context.GetInputShape(1), out = state;
    if (out.empty()) return {};
    out.pop_back();
    return {out, state};
  }

  static ONNXTensorElementDataType input_type(size_t index) {
    return index == kSwapInput ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : Element<T>::type;
  }

  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext context(raw);
    auto qkv = context.GetInput(0);
    auto state = context.GetInput(1);
    auto keep = context.GetInput(3);
    auto cross = context.GetInput(4);
    auto state_shape = state.GetTensorTypeAndShapeInfo().GetShape();
    const sdqes::RetentionExtent extent = checked_retention_extent(
        qkv.GetTensorTypeAndShapeInfo().GetShape(), state_shape, context.GetInput(kSwapInput),
        keep.GetTensorTypeAndShapeInfo().GetElementCount(), cross.GetTensorTypeAndShapeInfo().GetElementCount());
    auto out_shape = state_shape;
    out_shape.pop_back();
    auto out = context.GetOutput(0, out_shape);
    auto next = context.GetOutput(1, state_shape);
    const T* keeps = keep.GetTensorData<T>();
    const T* crosses = cross.GetTensorData<T>();
    if constexpr (kOnCuda) {
#ifdef SDQES_WITH_CUDA
      check_launch(sdqes_retention_step_cuda(context.GetGPUComputeStream(), Element<T>::half, qkv.GetTensorData<T>(),
                                             state.GetTensorData<T>(), keeps, crosses, out.GetTensorMutableData<T>(),
                                             next.GetTensorMutableData<T>(), extent), kName);
#endif
    } else {
      step_tokens(context, qkv.GetTensorData<T>(), state.GetTensorData<T>(), keeps, crosses,
                  out.GetTensorMutableData<T>(), next.GetTensorMutableData<T>(), extent);
    }
  }

  // Token by token: the rows two at a time (a pair and its partner, each read once), out summed as rows are written.
  static void step_tokens(const Ort::KernelContext& context, const T* qkv, const T* state, const T* keep,
                          const T* cross, T* out, T* state_next, sdqes::RetentionExtent extent) {
    const int64_t d = extent.width;
    const int64_t per_task = std::max<int64_t>(1, kBlock * 16 / (d * d));  // tokens: about 64k elements a task
    parallel_blocks(context, extent.tokens, [&](int64_t begin, int64_t end) {
      std::vector<float> v(d), sum(d);
      for (int64_t token = begin; token < end; ++token) {
        const T* q = qkv + token * 3 * d;
        for (int64_t j = 0; j < d; ++j) v[j] = Element<T>::load(q[2 * d + j]);
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int64_t i = 0; i < d; i += 2) {
          const sdqes::RetentionRow even{Element<T>::load(keep[i]), Element<T>::load(cross[i]),
                                         Element<T>::load(q[d + i]), Element<T>::load(q[i])};
          const sdqes::RetentionRow odd{Element<T>::load(keep[i + 1]), Element<T>::load(cross[i + 1]),
                                        Element<T>::load(q[d + i + 1]), Element<T>::load(q[i + 1])};
          const T* a = state + (token * d + i) * d;
          const T* b = a + d;
          T* next_a = state_next + (token * d + i) * d;
          T* next_b = next_a + d;
          for (int64_t j = 0; j < d; ++j) {
            const float own = Element<T>::load(a[j]), partner = Element<T>::load(b[j]);
            next_a[j] = Element<T>::store(sdqes::retention_element(own, partner, even, v[j]));
            next_b[j] = Element<T>::store(sdqes::retention_element(partner, own, odd, v[j]));
            sum[j] += even.q * Element<T>::load(next_a[j]) + odd.q * Element<T>::load(next_b[j]);
          }
        }
        for (int64_t j = 0; j < d; ++j) out[token * d + j] = Element<T>::store(sum[j]);
      }
    }, per_task);
  }
};

// One operator of the domain, for one kernel (its type and provider); errors return as statuses (WithStatus).
template <typename Kernel>
struct FusedOp : Ort::CustomOpBase<FusedOp<Kernel>, Kernel, /*WithStatus=*/true> {
  // The headers' version otherwise: ONNX Runtime reads the operator's table only as far as it declares.
  FusedOp() {
    this->version = kApiVersion;
    this->InferOutputShapeFn = &FusedOp::infer_output_shapes;
  }
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return as_status([&] { *kernel = new Kernel(info); });
  }
  const char* GetName() const { return Kernel::kName; }
  const char* GetExecutionProviderType() const { return Kernel::kOnCuda ? kCudaProvider : nullptr; }
  size_t GetInputTypeCount() const { return Kernel::kInputs; }
  ONNXTensorElementDataType GetInputType(size_t index) const { return input_type<Kernel>(index); }
  size_t GetOutputTypeCount() const { return output_count<Kernel>(); }
  ONNXTensorElementDataType GetOutputType(size_t) const { return Element<typename Kernel::Type>::type; }
  // An index input stays on the host, where the kernel checks it (on CUDA too: ONNX Runtime keeps the initializer
  // there, so nothing is copied per step and a CUDA graph can still capture it).
  OrtMemType GetInputMemoryType(size_t index) const { return host_input<Kernel>(index) ? OrtMemTypeCPUInput
                                                                                        : OrtMemTypeDefault; }
  // Asked while ONNX Runtime resolves the graph, once for the op's name whichever type's kernel it was asked of:
  // the outputs take the first input's type. An input of unknown rank leaves the outputs' shapes unknown.
  static OrtStatusPtr infer_output_shapes(const OrtCustomOp*, OrtShapeInferContext* raw) {
    return as_status([&] {
      OrtTensorTypeAndShapeInfo* first = nullptr;  // the context's own, not released here
      ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      Ort::ThrowOnError(Ort::GetApi().ShapeInferContext_GetInputTypeShape(raw, 0, &first));
      Ort::ThrowOnError(Ort::GetApi().GetTensorElementType(first, &type));
      Ort::ShapeInferContext context(&Ort::GetApi(), raw);
      const std::vector<Shape> shapes = Kernel::output_shapes(context);
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Ort::Status set = context.SetOutputShape(i, shapes[i], type);
        if (!set.IsOK()) throw Ort::Exception(set.GetErrorMessage(), set.GetErrorCode());
      }
    });
  }

 private:
  // What a kernel that declares nothing more has: every input and its one output of the kernel's type, on its device.
  template <typename K>
  static auto input_type(size_t index) -> decltype(K::input_type(index)) { return K::input_type(index); }
  template <typename K, typename... Unused>
  static ONNXTensorElementDataType input_type(size_t, Unused...) { return Element<typename K::Type>::type; }
  template <typename K>
  static constexpr auto output_count() -> decltype(K::kOutputs) { return K::kOutputs; }
  template <typename K, typename... Unused>
  static constexpr size_t output_count(Unused...) { return 1; }
  template <typename K>
  static auto host_input(size_t index) -> decltype(K::kSwapInput, bool()) { return index == K::kSwapInput; }
  template <typename K, typename... Unused>
  static bool host_input(size_t, Unused...) { return false; }
};

using Half = Ort::Float16_t;
// CPU kernels always; the CUDA provider's where built with nvcc (a CUDA op without them would only throw).
std::tuple<FusedOp<QrnnPoolKernel<float, false>>, FusedOp<QrnnPoolKernel<Half, false>>,
           FusedOp<QrnnScanKernel<float, false>>, FusedOp<QrnnScanKernel<Half, false>>,
           FusedOp<RetentionStepKernel<float, false>>, FusedOp<RetentionStepKernel<Half, false>>
#ifdef SDQES_WITH_CUDA
           , FusedOp<QrnnPoolKernel<float, true>>, FusedOp<QrnnPoolKernel<Half, true>>,
           FusedOp<QrnnScanKernel<float, true>>, FusedOp<QrnnScanKernel<Half, true>>,
           FusedOp<RetentionStepKernel<float, true>>, FusedOp<RetentionStepKernel<Half, true>>
#endif
           > ops;

// One domain for every session that registers the library (ONNX Runtime holds it by reference).
Ort::CustomOpDomain& domain() {
  static Ort::CustomOpDomain made(kDomain);
  static std::once_flag filled;
  std::call_once(filled, [] { std::apply([](auto&... op) { (made.Add(&op), ...); }, ops); });
  return made;
}

}  // namespace

// The operators this library has kernels for, comma-separated ("QrnnPool,QrnnScan,RetentionStep"): the runtime
// names a graph's fused operators that an older build has none for, which ONNX Runtime would run as their bodies
// without a word. (A library without this function is one of the first builds: QrnnPool and QrnnScan.)
extern "C" const char* sdqes_ort_ops_operators() {
  static const std::string names = [] {
    std::vector<std::string> each;  // once per operator, whatever its kernels' types and providers
    std::apply([&](auto&... op) {
      ((std::find(each.begin(), each.end(), op.GetName()) == each.end() ? each.push_back(op.GetName()) : void()), ...);
    }, ops);
    std::string joined;
    for (const std::string& name : each) joined += (joined.empty() ? "" : ",") + name;
    return joined;
  }();
  return names.c_str();
}

// 1 where the CUDA kernels were compiled in: the runtime registers the library for a CUDA session only then (a
// CPU-only kernel would pull the op off the GPU, with copies around it and no CUDA graph).
extern "C" int sdqes_ort_ops_with_cuda() {
#ifdef SDQES_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(kApiVersion);
  if (api == nullptr) {
    return api_base->GetApi(1)->CreateStatus(
        ORT_FAIL, "libsdqes_ort_ops needs onnxruntime 1.17 or newer (its C API version 17), which this onnxruntime "
                  "is not; upgrade onnxruntime or run without the library");
  }
  Ort::InitApi(api);
  try {
    Ort::UnownedSessionOptions(options).Add(domain());
  } catch (const Ort::Exception& error) {
    return api->CreateStatus(error.GetOrtErrorCode(), error.what());
  }
  return nullptr;
}
