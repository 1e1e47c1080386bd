// sdqes_edge.RetentionStep on ONNX Runtime's CUDA provider: one kernel for the Split, Gather, three Muls, two Adds
// and the MatMul (and views) that the inlined step runs, each of which read or wrote the whole state.
//
// One thread per (token, value channel j) walks the key channels two at a time (a pair and its partner), so each
// element of the state is read once and written once, coalesced across j; the thread sums out[j] = q R'[:, j] as
// it goes. The arithmetic is the header's, with the rounding modes spelled out (__fmul_rn, __fadd_rn) so that nvcc
// contracts nothing into a fused multiply-add the ONNX body does not do.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "retention_step.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ inline float stored(float* p, int64_t i, float v) {
  p[i] = v;
  return v;
}
__device__ inline float stored(__half* p, int64_t i, float v) {  // the value as written, which q multiplies
  const __half h = __float2half_rn(v);
  p[i] = h;
  return __half2float(h);
}

__device__ inline float element(float own, float partner, const sdqes::RetentionRow& row, float v) {
  return __fadd_rn(__fadd_rn(__fmul_rn(own, row.keep), __fmul_rn(partner, row.cross)), __fmul_rn(row.k, v));
}

template <typename T>
__global__ void retention_step_kernel(const T* qkv, const T* state, const T* keep, const T* cross, T* out,
                                      T* state_next, sdqes::RetentionExtent extent) {
  const int64_t d = extent.width, lanes = extent.tokens * d;
  for (int64_t lane = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; lane < lanes;
       lane += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t token = lane / d, j = lane % d;
    const T* q = qkv + token * 3 * d;
    const T* rows = state + token * d * d;
    T* next = state_next + token * d * d;
    const float v = load(q, 2 * d + j);
    float sum = 0.0f;
    for (int64_t i = 0; i < d; i += 2) {
      const sdqes::RetentionRow even{load(keep, i), load(cross, i), load(q, d + i), load(q, i)};
      const sdqes::RetentionRow odd{load(keep, i + 1), load(cross, i + 1), load(q, d + i + 1), load(q, i + 1)};
      const float a = load(rows, i * d + j), b = load(rows, (i + 1) * d + j);
      sum += even.q * stored(next, i * d + j, element(a, b, even, v));
      sum += odd.q * stored(next, (i + 1) * d + j, element(b, a, odd, v));
    }
    stored(out, token * d + j, sum);
  }
}

template <typename T>
int launch(void* stream, const void* qkv, const void* state, const void* keep, const void* cross, void* out,
           void* state_next, sdqes::RetentionExtent extent) {
  const int64_t lanes = extent.tokens * extent.width;
  if (lanes == 0) return 0;
  const int64_t blocks = (lanes + kThreads - 1) / kThreads;
  retention_step_kernel<T><<<static_cast<unsigned>(blocks > kMaxBlocks ? kMaxBlocks : blocks), kThreads, 0,
                             static_cast<cudaStream_t>(stream)>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(state), static_cast<const T*>(keep),
      static_cast<const T*>(cross), static_cast<T*>(out), static_cast<T*>(state_next), extent);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int sdqes_retention_step_cuda(void* stream, int half, const void* qkv, const void* state, const void* keep,
                                         const void* cross, void* out, void* state_next,
                                         sdqes::RetentionExtent extent) {
  if (half) return launch<__half>(stream, qkv, state, keep, cross, out, state_next, extent);
  return launch<float>(stream, qkv, state, keep, cross, out, state_next, extent);
}

extern "C" int sdqes_retention_step_cuda_check() {
  cudaFuncAttributes attributes;
  cudaError_t error = cudaFuncGetAttributes(&attributes, retention_step_kernel<__half>);
  if (error == cudaSuccess) error = cudaFuncGetAttributes(&attributes, retention_step_kernel<float>);
  return static_cast<int>(error);
}
