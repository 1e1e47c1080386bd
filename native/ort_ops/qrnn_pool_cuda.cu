// sdqes_edge.QrnnPool on ONNX Runtime's CUDA provider: one kernel for the six (Split, QuickGelu, Sigmoid, Sub,
// Mul, Add) that the inlined function runs.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "qrnn_pool.h"

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

template <typename T>
int launch(void* stream, const T* gates, const T* h, T* out, int64_t count, int64_t width, float alpha) {
  if (count == 0) return 0;
  int64_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  qrnn_pool_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gates, h, out, count, width, alpha);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int sdqes_qrnn_pool_cuda_float(void* stream, const float* gates, const float* h, float* out,
                                          int64_t count, int64_t width, float alpha) {
  return launch(stream, gates, h, out, count, width, alpha);
}

extern "C" int sdqes_qrnn_pool_cuda_half(void* stream, const uint16_t* gates, const uint16_t* h, uint16_t* out,
                                         int64_t count, int64_t width, float alpha) {
  return launch(stream, reinterpret_cast<const __half*>(gates), reinterpret_cast<const __half*>(h),
                reinterpret_cast<__half*>(out), count, width, alpha);
}
