// The library's CUDA kernels, compiled for the host with cuda_emulation.h, behind a C interface the tests call
// through ctypes (tests/test_cuda_kernels_emulated.py). ``blocks`` 0: the launch geometry the launchers use
// (blocks_for, kThreads); otherwise that many blocks of ``threads``, small enough that each thread strides.
#include "cuda_emulation.h"
// (after the emulation, which the kernels' headers take instead of CUDA's)
#include "qrnn_pool_kernels.cuh"
#include "retention_step_kernels.cuh"

namespace {

struct Grid {
  unsigned blocks, threads;
};

Grid grid(unsigned blocks, unsigned threads, int64_t lanes) {
  if (blocks != 0) return {blocks, threads};
  return {static_cast<unsigned>(blocks_for(lanes)), static_cast<unsigned>(kThreads)};
}

template <typename T>
void pool(const void* gates, const void* h, void* out, int64_t count, int64_t width, float alpha, Grid g) {
  emulated_launch(qrnn_pool_kernel<T>, g.blocks, g.threads, static_cast<const T*>(gates), static_cast<const T*>(h),
                  static_cast<T*>(out), count, width, alpha);
}

template <typename T>
void scan(const void* gates, void* out, sdqes::ScanExtent extent, float alpha, Grid g) {
  emulated_launch(qrnn_scan_kernel<T>, g.blocks, g.threads, static_cast<const T*>(gates), static_cast<T*>(out),
                  extent, alpha);
}

template <typename T>
void retention(const void* qkv, const void* state, const void* keep, const void* cross, void* out, void* state_next,
               sdqes::RetentionExtent extent, Grid g) {
  emulated_launch(retention_step_kernel<T>, g.blocks, g.threads, static_cast<const T*>(qkv),
                  static_cast<const T*>(state), static_cast<const T*>(keep), static_cast<const T*>(cross),
                  static_cast<T*>(out), static_cast<T*>(state_next), extent);
}

}  // namespace

extern "C" {

void emulated_qrnn_pool(int half, const void* gates, const void* h, void* out, int64_t count, int64_t width,
                        float alpha, unsigned blocks, unsigned threads) {
  const Grid g = grid(blocks, threads, count);
  half ? pool<__half>(gates, h, out, count, width, alpha, g) : pool<float>(gates, h, out, count, width, alpha, g);
}

void emulated_qrnn_scan(int half, const void* gates, void* out, int64_t outer, int64_t frames, int64_t inner,
                        int64_t width, float alpha, unsigned blocks, unsigned threads) {
  const sdqes::ScanExtent extent{outer, frames, inner, width};
  const Grid g = grid(blocks, threads, outer * inner * width);
  half ? scan<__half>(gates, out, extent, alpha, g) : scan<float>(gates, out, extent, alpha, g);
}

void emulated_retention_step(int half, const void* qkv, const void* state, const void* keep, const void* cross,
                             void* out, void* state_next, int64_t tokens, int64_t width, unsigned blocks,
                             unsigned threads) {
  const sdqes::RetentionExtent extent{tokens, width};
  const Grid g = grid(blocks, threads, tokens * width);
  half ? retention<__half>(qkv, state, keep, cross, out, state_next, extent, g)
       : retention<float>(qkv, state, keep, cross, out, state_next, extent, g);
}

}  // extern "C"
