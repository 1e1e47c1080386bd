// The QRNN adapter's pooling, one element: what sdqes_edge.QrnnPool (one frame) and sdqes_edge.QrnnScan (a
// window's frames from h = 0) compute (export/fused_ops.py writes the same arithmetic as the ONNX functions
// every runtime without this library inlines).
//   gates [..., 2r] = [z | f] (pre-activation), h [..., r] the previous pooled state
//   h_next = h + sigmoid(f) * (QuickGELU(z) - h),  QuickGELU(z) = z * sigmoid(alpha * z)
// Computed in float whatever the tensors' type: one rounding to the output type instead of one per operator.
#pragma once

#ifndef __CUDACC__
#include <cmath>
#endif
#include <cstdint>

#include "host_device.h"

namespace sdqes {

SDQES_HOST_DEVICE inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

SDQES_HOST_DEVICE inline float qrnn_pool(float z, float f, float h, float alpha) {
  const float candidate = z * sigmoid(alpha * z);
  return h + sigmoid(f) * (candidate - h);
}

// Element k of the output: row k / width, column k % width; z and f sit in the row's two halves of the gates.
SDQES_HOST_DEVICE inline int64_t z_offset(int64_t k, int64_t width) { return (k / width) * width + k; }

// A scan's gates [outer, frames, inner, 2r] and output [outer, frames, inner, r] (frames along the time axis):
// lane k of outer * inner * r walks the frames; frame t of lane k is output element frame_offset(k, t).
struct ScanExtent {
  int64_t outer, frames, inner, width;
};

SDQES_HOST_DEVICE inline int64_t frame_offset(const ScanExtent& e, int64_t lane, int64_t t) {
  const int64_t per_outer = e.inner * e.width;
  return ((lane / per_outer) * e.frames + t) * per_outer + lane % per_outer;
}

}  // namespace sdqes

// The CUDA launchers (qrnn_pool_cuda.cu), on the stream ONNX Runtime computes on; no allocation, so a step
// with them can be captured in a CUDA graph. ``half``: the tensors are float16 (else float32).
extern "C" {
int sdqes_qrnn_pool_cuda(void* stream, int half, const void* gates, const void* h, void* out, int64_t count,
                         int64_t width, float alpha);
int sdqes_qrnn_scan_cuda(void* stream, int half, const void* gates, void* out, sdqes::ScanExtent extent,
                         float alpha);
}
