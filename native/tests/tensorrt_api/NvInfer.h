// The part of TensorRT's C++ API (10.x/11.x) that native/src/tensorrt_backend.cpp uses, declared from NVIDIA's API
// reference, with nothing defined. Where TensorRT is absent, CMake compiles the TensorRT backend and sdqes-run
// against these declarations without linking them (target sdqes_tensorrt_compile_check), so a mistake in code that
// only a GPU machine can run still fails the build here. Add a declaration when the backend starts using one.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#define NV_TENSORRT_MAJOR 10
#define NV_TENSORRT_MINOR 0
#define NV_TENSORRT_PATCH 0

namespace nvinfer1 {

using AsciiChar = char;

enum class DataType : int32_t { kFLOAT = 0, kHALF = 1, kINT8 = 2, kINT32 = 3, kBOOL = 4, kUINT8 = 5, kFP8 = 6,
                                kBF16 = 7, kINT64 = 8, kINT4 = 9 };
enum class TensorIOMode : int32_t { kNONE = 0, kINPUT = 1, kOUTPUT = 2 };
enum class ExecutionContextAllocationStrategy : int32_t { kSTATIC = 0, kON_PROFILE_CHANGE = 1, kUSER_MANAGED = 2 };

class ILogger {
 public:
  enum class Severity : int32_t { kINTERNAL_ERROR = 0, kERROR = 1, kWARNING = 2, kINFO = 3, kVERBOSE = 4 };
  virtual void log(Severity severity, AsciiChar const* msg) noexcept = 0;
  virtual ~ILogger() = default;
};

class IExecutionContext {
 public:
  virtual ~IExecutionContext() noexcept;
  bool setTensorAddress(char const* tensorName, void* data) noexcept;
  bool enqueueV3(cudaStream_t stream) noexcept;
};

class ICudaEngine {
 public:
  virtual ~ICudaEngine() noexcept;
  TensorIOMode getTensorIOMode(char const* tensorName) const noexcept;
  DataType getTensorDataType(char const* tensorName) const noexcept;
  IExecutionContext* createExecutionContext(
      ExecutionContextAllocationStrategy strategy = ExecutionContextAllocationStrategy::kSTATIC) noexcept;
};

class IRuntime {
 public:
  virtual ~IRuntime() noexcept;
  ICudaEngine* deserializeCudaEngine(void const* blob, std::size_t size) noexcept;
};

IRuntime* createInferRuntime(ILogger& logger) noexcept;

}  // namespace nvinfer1
