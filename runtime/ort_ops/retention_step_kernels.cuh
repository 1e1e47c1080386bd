// sdqes_edge.RetentionStep as a CUDA kernel (launched by retention_step_cuda.cu): one kernel for the Split, Gather,
// three Muls, two Adds and the MatMul (and views) that the inlined step runs, each of which read or wrote the whole
// state.
//
// One thread per (token, value channel j) walks the key channels two at a time (a pair and its partner), so each
// element of the state is read once and written once, coalesced across j; the thread sums out[j] = q R'[:, j] as
// it goes. The arithmetic is the header's (retention_step.h), with the rounding modes spelled out (__fmul_rn,
// __fadd_rn) so that nvcc contracts nothing into a fused multiply-add the ONNX body does not do.
#pragma once

#include "cuda_kernels.cuh"
#include "retention_step.h"

namespace {

__device__ inline float element(float own, float partner, const sdqes::RetentionRow& row, float v) {
  return __fadd_rn(__fadd_rn(__fmul_rn(own, row.keep), __fmul_rn(partner, row.cross)), __fmul_rn(row.k, v));
}

template <typename T>
__global__ void retention_step_kernel(const T* qkv, const T* state, const T* keep, const T* cross, T* out,
                                      T* state_next, sdqes::RetentionExtent extent) {
  const int64_t d = extent.width, lanes = extent.tokens * d;
  for (int64_t lane = first_lane(); lane < lanes; lane += lane_stride()) {
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

}  // namespace
