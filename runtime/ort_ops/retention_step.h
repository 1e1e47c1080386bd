// The RetNet adapter's retention step: what sdqes_edge.RetentionStep computes (export/fused_retention.py writes
// the same arithmetic as the ONNX function every runtime without this library inlines). Per token, with R its
// state [d, d] (key channel, value channel), [q | k | v] = qkv [3d], and keep, cross [d] the per-key-channel
// factors of the rotation and decay:
//   R'[i] = R[i] * keep[i] + R[i ^ 1] * cross[i] + k[i] v        out = q R'
// (swap exchanges the two channels of each pair: row i's partner is row i ^ 1, which the kernels check).
// Each element is computed as the body's operators compute it, one rounding per operator in float (the fp32
// graph's state comes out bit for bit the same); out sums q[i] R'[i] over the rows as written, in float.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace sdqes {

// The per-row factors of one key channel (loaded once for a whole row).
struct RetentionRow {
  float keep, cross, k, q;
};

// R'[i][j] from R[i][j], its partner R[i ^ 1][j] and v[j]: the body's Mul, Mul, Add, Mul, Add in its order.
SDQES_HOST_DEVICE inline float retention_element(float own, float partner, const RetentionRow& row, float v) {
  const float kept = own * row.keep;
  const float crossed = partner * row.cross;
  const float rotated = kept + crossed;
  const float kv = row.k * v;
  return rotated + kv;
}

// The extent of one RetentionStep: tokens (every leading axis of the state together) and d.
struct RetentionExtent {
  int64_t tokens, width;
};

}  // namespace sdqes

// The CUDA launcher (retention_step_cuda.cu), on the stream ONNX Runtime computes on; no allocation, so a step
// with it can be captured in a CUDA graph. ``half``: the tensors are float16 (else float32).
extern "C" {
int sdqes_retention_step_cuda(void* stream, int half, const void* qkv, const void* state, const void* keep,
                              const void* cross, void* out, void* state_next, sdqes::RetentionExtent extent);
// 0 where this GPU can run the kernel, else the CUDA error (sdqes_ort_ops_cuda_ready asks it with the others').
int sdqes_retention_step_cuda_check();
}
