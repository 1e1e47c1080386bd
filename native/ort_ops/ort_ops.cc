// libsdqes_ort_ops: ONNX Runtime kernels for the sdqes_edge operator domain.
//
// An exported GPU-form step graph writes each QRNN adapter's pooling step as the model-local ONNX function
// sdqes_edge.QrnnPool (export/fused_ops.py). ONNX Runtime inlines a function no kernel claims, so a graph runs
// everywhere without this library; with it registered (SessionOptions.register_custom_ops_library), the
// function is one kernel here instead of six, on the CPU and, where built with CUDA, on the CUDA provider.
//
// Built by scripts/build_ort_ops.sh against ONNX Runtime's C API headers; needs no ONNX Runtime library to link.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <exception>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "qrnn_pool.h"

#define SDQES_STRINGIFY_(x) #x
#define SDQES_STRINGIFY(x) SDQES_STRINGIFY_(x)

namespace {

constexpr const char* kDomain = "sdqes_edge";
constexpr const char* kCudaProvider = "CUDAExecutionProvider";

template <typename T>
struct Element;

template <>
struct Element<float> {
  static constexpr ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};

template <>
struct Element<Ort::Float16_t> {
  static constexpr ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  static float load(Ort::Float16_t v) { return v.ToFloat(); }
  static Ort::Float16_t store(float v) { return Ort::Float16_t(v); }
};

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

template <typename T, bool kOnCuda>
struct QrnnPoolKernel {
  float alpha;

  explicit QrnnPoolKernel(const OrtKernelInfo* info) : alpha(Ort::ConstKernelInfo(info).GetAttribute<float>("alpha")) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) {
    return as_status([&] { Compute(raw); });
  }

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
      launch(context.GetGPUComputeStream(), g, prev, next, extent);
    } else {
      for (int64_t k = 0; k < extent.count; ++k) {
        const int64_t z = sdqes::z_offset(k, extent.width);
        next[k] = Element<T>::store(sdqes::qrnn_pool(Element<T>::load(g[z]), Element<T>::load(g[z + extent.width]),
                                                     Element<T>::load(prev[k]), alpha));
      }
    }
  }

  void launch(void* stream, const T* g, const T* prev, T* next, Extent extent) const {
#ifdef SDQES_WITH_CUDA
    int error;
    if constexpr (std::is_same_v<T, float>) {
      error = sdqes_qrnn_pool_cuda_float(stream, g, prev, next, extent.count, extent.width, alpha);
    } else {
      error = sdqes_qrnn_pool_cuda_half(stream, reinterpret_cast<const uint16_t*>(g),
                                        reinterpret_cast<const uint16_t*>(prev), reinterpret_cast<uint16_t*>(next),
                                        extent.count, extent.width, alpha);
    }
    if (error != 0)
      ORT_CXX_API_THROW("sdqes_edge.QrnnPool: CUDA launch failed, error " + std::to_string(error), ORT_FAIL);
#else
    (void)stream, (void)g, (void)prev, (void)next, (void)extent;
    ORT_CXX_API_THROW("sdqes_edge.QrnnPool: this library was built without CUDA", ORT_FAIL);
#endif
  }
};

template <typename T, bool kOnCuda>
struct QrnnPoolOp : Ort::CustomOpBase<QrnnPoolOp<T, kOnCuda>, QrnnPoolKernel<T, kOnCuda>, /*WithStatus=*/true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return as_status([&] { *kernel = new QrnnPoolKernel<T, kOnCuda>(info); });
  }
  const char* GetName() const { return "QrnnPool"; }
  const char* GetExecutionProviderType() const { return kOnCuda ? kCudaProvider : nullptr; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t) const { return Element<T>::type; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return Element<T>::type; }
};

QrnnPoolOp<float, false> cpu_float;
QrnnPoolOp<Ort::Float16_t, false> cpu_half;
#ifdef SDQES_WITH_CUDA
QrnnPoolOp<float, true> cuda_float;
QrnnPoolOp<Ort::Float16_t, true> cuda_half;
#endif

// One domain for every session that registers the library (ONNX Runtime holds it by reference).
Ort::CustomOpDomain& domain() {
  static Ort::CustomOpDomain made(kDomain);
  static std::once_flag filled;
  std::call_once(filled, [] {
    made.Add(&cpu_float);
    made.Add(&cpu_half);
#ifdef SDQES_WITH_CUDA
    made.Add(&cuda_float);
    made.Add(&cuda_half);
#endif
  });
  return made;
}

}  // namespace

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
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    return api_base->GetApi(1)->CreateStatus(
        ORT_FAIL, "libsdqes_ort_ops was built against onnxruntime 1." SDQES_STRINGIFY(ORT_API_VERSION)
                  "'s C API, which this onnxruntime lacks; upgrade onnxruntime or run without the library");
  }
  Ort::InitApi(api);
  try {
    Ort::UnownedSessionOptions(options).Add(domain());
  } catch (const Ort::Exception& error) {
    return api->CreateStatus(error.GetOrtErrorCode(), error.what());
  }
  return nullptr;
}
