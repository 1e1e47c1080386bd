// The QRNN adapter's pooling step, one element: what sdqes_edge.QrnnPool computes (export/fused_ops.py writes
// the same arithmetic as the ONNX function every runtime without this library inlines).
//   gates [..., 2r] = [z | f] (pre-activation), h [..., r] the previous pooled state
//   h_next = h + sigmoid(f) * (QuickGELU(z) - h),  QuickGELU(z) = z * sigmoid(alpha * z)
// Computed in float whatever the tensors' type: one rounding to the output type instead of one per operator.
#pragma once

#ifdef __CUDACC__
#define SDQES_HOST_DEVICE __host__ __device__
#else
#define SDQES_HOST_DEVICE
#include <cmath>
#endif

#include <cstdint>

namespace sdqes {

SDQES_HOST_DEVICE inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

SDQES_HOST_DEVICE inline float qrnn_pool(float z, float f, float h, float alpha) {
  const float candidate = z * sigmoid(alpha * z);
  return h + sigmoid(f) * (candidate - h);
}

// Element k of the output: row k / width, column k % width; z and f sit in the row's two halves of the gates.
SDQES_HOST_DEVICE inline int64_t z_offset(int64_t k, int64_t width) { return (k / width) * width + k; }

}  // namespace sdqes

// The CUDA launchers (qrnn_pool_cuda.cu), on the stream ONNX Runtime computes on; no allocation, so a step
// with them can be captured in a CUDA graph.
extern "C" {
int sdqes_qrnn_pool_cuda_float(void* stream, const float* gates, const float* h, float* out, int64_t count,
                               int64_t width, float alpha);
int sdqes_qrnn_pool_cuda_half(void* stream, const uint16_t* gates, const uint16_t* h, uint16_t* out,
                              int64_t count, int64_t width, float alpha);
}
