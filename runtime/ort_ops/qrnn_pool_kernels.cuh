// sdqes_edge.QrnnPool and QrnnScan as CUDA kernels (launched by qrnn_pool_cuda.cu): one kernel for the six (Split,
// QuickGelu, Sigmoid, Sub, Mul, Add) that the inlined step runs, and for the 3 + 5 T (and T Unsqueezes, a Concat)
// of a window of T frames. The arithmetic is the header's (qrnn_pool.h), as the CPU kernels compute it.
#pragma once

#include "cuda_kernels.cuh"
#include "qrnn_pool.h"

namespace {

template <typename T>
__global__ void qrnn_pool_kernel(const T* gates, const T* h, T* out, int64_t count, int64_t width, float alpha) {
  for (int64_t k = first_lane(); k < count; k += lane_stride()) {
    const int64_t z = sdqes::z_offset(k, width);
    stored(out, k, sdqes::qrnn_pool(load(gates, z), load(gates, z + width), load(h, k), alpha));
  }
}

// Lane k (outer * inner * r of them) walks the frames; an output element's z sits at output offset o's row
// (o / r) times 2r plus its column, as in the step (z_offset), f r further on. h is carried in float from frame
// to frame, as the CPU kernel carries it.
template <typename T>
__global__ void qrnn_scan_kernel(const T* gates, T* out, sdqes::ScanExtent extent, float alpha) {
  const int64_t lanes = extent.outer * extent.inner * extent.width;
  for (int64_t k = first_lane(); k < lanes; k += lane_stride()) {
    float h = 0.0f;
    for (int64_t t = 0; t < extent.frames; ++t) {
      const int64_t o = sdqes::frame_offset(extent, k, t);
      const int64_t z = sdqes::z_offset(o, extent.width);
      h = sdqes::qrnn_pool(load(gates, z), load(gates, z + extent.width), h, alpha);
      stored(out, o, h);
    }
  }
}

}  // namespace
