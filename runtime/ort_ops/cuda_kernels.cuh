// What the library's CUDA kernels share: their launch geometry and how they read and write float and float16.
// The kernels themselves live in headers of their own (qrnn_pool_kernels.cuh, retention_step_kernels.cuh), apart
// from their launchers, so that the tests can run them on a host without a GPU (tests/cuda_emulation: one host
// thread walks the grid). Every kernel is a grid-stride loop whose threads are independent: no shared memory, no
// barrier, no warp function, which is what makes that walk faithful.
#pragma once

#ifndef SDQES_CUDA_EMULATION  // tests/cuda_emulation/cuda_emulation.h stands in for these where there is no CUDA
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif
#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride beyond this: a ViT-B/16 step at 32 streams is 1.7M elements

inline int64_t blocks_for(int64_t lanes) {
  const int64_t blocks = (lanes + kThreads - 1) / kThreads;
  return blocks > kMaxBlocks ? kMaxBlocks : blocks;
}

// The first lane of this thread and the stride to its next (a grid-stride loop).
__device__ inline int64_t first_lane() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ inline int64_t lane_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __half* p, int64_t i) { return __half2float(p[i]); }

// Writes v to p[i] in p's type and returns the value as written (which later arithmetic must read).
__device__ inline float stored(float* p, int64_t i, float v) {
  p[i] = v;
  return v;
}
__device__ inline float stored(__half* p, int64_t i, float v) {
  const __half h = __float2half_rn(v);
  p[i] = h;
  return __half2float(h);
}

}  // namespace
