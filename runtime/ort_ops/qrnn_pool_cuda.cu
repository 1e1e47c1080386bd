// sdqes_edge.QrnnPool and QrnnScan on ONNX Runtime's CUDA provider: one kernel for the six (Split, QuickGelu,
// Sigmoid, Sub, Mul, Add) that the inlined step runs, and for the 3 + 5 T (and T Unsqueezes, a Concat) of a
// window of T frames.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "qrnn_pool.h"
#include "retention_step.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride beyond this: a ViT-B/16 step at 32 streams is 1.7M elements

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

template <typename T>
__global__ void qrnn_pool_kernel(const T* gates, const T* h, T* out, int64_t count, int64_t width, float alpha) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t z = sdqes::z_offset(k, width);
    store(out, k, sdqes::qrnn_pool(load(gates, z), load(gates, z + width), load(h, k), alpha));
  }
}

// Lane k (outer * inner * r of them) walks the frames; an output element's z sits at output offset o's row
// (o / r) times 2r plus its column, as in the step (z_offset), f r further on.
template <typename T>
__global__ void qrnn_scan_kernel(const T* gates, T* out, sdqes::ScanExtent extent, float alpha) {
  const int64_t lanes = extent.outer * extent.inner * extent.width;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < lanes;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float h = 0.0f;
    for (int64_t t = 0; t < extent.frames; ++t) {
      const int64_t o = sdqes::frame_offset(extent, k, t);
      const int64_t z = sdqes::z_offset(o, extent.width);
      h = sdqes::qrnn_pool(load(gates, z), load(gates, z + extent.width), h, alpha);
      store(out, o, h);
    }
  }
}

int64_t blocks_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return blocks > kMaxBlocks ? kMaxBlocks : blocks;
}

template <typename T>
int launch(void* stream, const T* gates, const T* h, T* out, int64_t count, int64_t width, float alpha) {
  if (count == 0) return 0;
  qrnn_pool_kernel<T><<<static_cast<unsigned>(blocks_for(count)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gates, h, out, count, width, alpha);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int launch_scan(void* stream, const T* gates, T* out, sdqes::ScanExtent extent, float alpha) {
  const int64_t lanes = extent.outer * extent.inner * extent.width;
  if (lanes == 0) return 0;
  qrnn_scan_kernel<T><<<static_cast<unsigned>(blocks_for(lanes)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gates, out, extent, alpha);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int sdqes_qrnn_pool_cuda(void* stream, int half, const void* gates, const void* h, void* out,
                                    int64_t count, int64_t width, float alpha) {
  if (half)
    return launch(stream, static_cast<const __half*>(gates), static_cast<const __half*>(h), static_cast<__half*>(out),
                  count, width, alpha);
  return launch(stream, static_cast<const float*>(gates), static_cast<const float*>(h), static_cast<float*>(out), count,
                width, alpha);
}

extern "C" int sdqes_qrnn_scan_cuda(void* stream, int half, const void* gates, void* out, sdqes::ScanExtent extent,
                                    float alpha) {
  if (half) return launch_scan(stream, static_cast<const __half*>(gates), static_cast<__half*>(out), extent, alpha);
  return launch_scan(stream, static_cast<const float*>(gates), static_cast<float*>(out), extent, alpha);
}

// Whether these kernels can run on the current CUDA device: 0, or the CUDA error that says why (no driver, a driver
// older than the CUDA runtime linked in, no kernel image for the device's architecture), asked before a session
// registers the library so that the user reads why instead of a failed launch in every step. Also reported: the
// CUDA runtime linked in and the driver's CUDA version (1000 * major + 10 * minor; 0: no driver), and the
// device's compute capability (10 * major + minor; 0: none found).
extern "C" int sdqes_ort_ops_cuda_ready(int* runtime_version, int* driver_version, int* device_arch) {
  *runtime_version = *driver_version = *device_arch = 0;
  cudaRuntimeGetVersion(runtime_version);
  cudaDriverGetVersion(driver_version);
  int device = 0, major = 0, minor = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (error == cudaSuccess) {
    *device_arch = 10 * major + minor;
    cudaFuncAttributes attributes;  // fails where the library holds no image (nor PTX) this device can run
    error = cudaFuncGetAttributes(&attributes, qrnn_pool_kernel<__half>);
    if (error == cudaSuccess) error = cudaFuncGetAttributes(&attributes, qrnn_scan_kernel<__half>);
    if (error == cudaSuccess) error = static_cast<cudaError_t>(sdqes_retention_step_cuda_check());
  }
  cudaGetLastError();  // the check's error is returned, not left for ONNX Runtime's next call to find
  return static_cast<int>(error);
}

extern "C" const char* sdqes_ort_ops_cuda_error(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}
