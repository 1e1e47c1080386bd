// sdqes_edge.RetentionStep on ONNX Runtime's CUDA provider: the launcher of the kernel in
// retention_step_kernels.cuh, and its part of the library's CUDA readiness check.
#include "retention_step_kernels.cuh"

namespace {

template <typename T>
int launch(void* stream, const void* qkv, const void* state, const void* keep, const void* cross, void* out,
           void* state_next, sdqes::RetentionExtent extent) {
  const int64_t lanes = extent.tokens * extent.width;
  if (lanes == 0) return 0;
  retention_step_kernel<T><<<static_cast<unsigned>(blocks_for(lanes)), kThreads, 0,
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
