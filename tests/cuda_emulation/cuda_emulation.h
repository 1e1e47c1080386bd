// CUDA's device vocabulary on the host, so that the library's kernels (runtime/ort_ops/*_kernels.cuh) run, as
// written, where there is no GPU: one host thread walks the grid, block by block and thread by thread. Faithful for
// those kernels because each is a grid-stride loop whose threads are independent (no shared memory, barrier or warp
// function; cuda_kernels.cuh says so), so any order of the threads computes what the GPU computes. The arithmetic
// is the host's: float16 is the compiler's _Float16 (IEEE binary16, rounded to nearest even as __float2half_rn
// does), and the explicitly rounded __fmul_rn and __fadd_rn are a plain product and sum (built with
// -ffp-contract=off, so neither becomes a fused multiply-add). What this cannot show is the device's own: nvcc's
// contraction of the other expressions, its expf, the launch itself; the GPU tests do.
#pragma once

#define SDQES_CUDA_EMULATION

#include <cmath>
#include <cstdint>

#define __global__
#define __device__
#define __host__

struct EmulatedIndex {
  unsigned x = 0, y = 0, z = 0;
};

inline EmulatedIndex blockIdx, threadIdx, blockDim, gridDim;

using __half = _Float16;

inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half_rn(float v) { return static_cast<__half>(v); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

// kernel<<<blocks, threads>>>(args...), every thread of the grid in turn.
template <typename... Parameters, typename... Arguments>
void emulated_launch(void (*kernel)(Parameters...), unsigned blocks, unsigned threads, Arguments... arguments) {
  gridDim.x = blocks;
  blockDim.x = threads;
  for (unsigned block = 0; block < blocks; ++block) {
    for (unsigned thread = 0; thread < threads; ++thread) {
      blockIdx.x = block;
      threadIdx.x = thread;
      kernel(arguments...);
    }
  }
}
