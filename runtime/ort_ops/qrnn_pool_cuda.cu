// sdqes_edge.QrnnPool and QrnnScan on ONNX Runtime's CUDA provider: the launchers of the kernels in
// qrnn_pool_kernels.cuh, and the library's CUDA readiness check.
#include "qrnn_pool_kernels.cuh"
#include "retention_step.h"

namespace {

template <typename T>
int launch(void* stream, const T* gates, const T* h, T* out, int64_t count, int64_t width, float alpha) {
  if (count == 0) return 0;
  qrnn_pool_kernel<T><<<static_cast<unsigned>(blocks_for(count)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gates, h, out, count, width, alpha);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int launch_scan(void* stream, const T* gates, T* out, sdqes::ScanExtent extent, float alpha) {
  const int64_t lanes = extent.outer * extent.inner * extent.width;
  if (lanes == 0) return 0;
  qrnn_scan_kernel<T><<<static_cast<unsigned>(blocks_for(lanes)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gates, out, extent, alpha);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int sdqes_qrnn_pool_cuda(void* stream, int half, const void* gates, const void* h, void* out,
                                    int64_t count, int64_t width, float alpha) {
  if (half)
    return launch(stream, static_cast<const __half*>(gates), static_cast<const __half*>(h), static_cast<__half*>(out),
                  count, width, alpha);
  return launch(stream, static_cast<const float*>(gates), static_cast<const float*>(h), static_cast<float*>(out), count,
                width, alpha);
}

extern "C" int sdqes_qrnn_scan_cuda(void* stream, int half, const void* gates, void* out, sdqes::ScanExtent extent,
                                    float alpha) {
  if (half) return launch_scan(stream, static_cast<const __half*>(gates), static_cast<__half*>(out), extent, alpha);
  return launch_scan(stream, static_cast<const float*>(gates), static_cast<float*>(out), extent, alpha);
}

// Whether these kernels can run on the current CUDA device: 0, or the CUDA error that says why (no driver, a driver
// older than the CUDA runtime linked in, no kernel image for the device's architecture), asked before a session
// registers the library so that the user reads why instead of a failed launch in every step. Also reported: the
// CUDA runtime linked in and the driver's CUDA version (1000 * major + 10 * minor; 0: no driver), and the
// device's compute capability (10 * major + minor; 0: none found).
extern "C" int sdqes_ort_ops_cuda_ready(int* runtime_version, int* driver_version, int* device_arch) {
  *runtime_version = *driver_version = *device_arch = 0;
  cudaRuntimeGetVersion(runtime_version);
  cudaDriverGetVersion(driver_version);
  int device = 0, major = 0, minor = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (error == cudaSuccess) {
    *device_arch = 10 * major + minor;
    cudaFuncAttributes attributes;  // fails where the library holds no image (nor PTX) this device can run
    error = cudaFuncGetAttributes(&attributes, qrnn_pool_kernel<__half>);
    if (error == cudaSuccess) error = cudaFuncGetAttributes(&attributes, qrnn_scan_kernel<__half>);
    if (error == cudaSuccess) error = static_cast<cudaError_t>(sdqes_retention_step_cuda_check());
  }
  cudaGetLastError();  // the check's error is returned, not left for ONNX Runtime's next call to find
  return static_cast<int>(error);
}

extern "C" const char* sdqes_ort_ops_cuda_error(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}
