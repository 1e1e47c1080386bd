// The part of CUDA's half-precision API the TensorRT backend uses, declared, nothing defined: see NvInfer.h beside it.
#pragma once

struct __half {
  unsigned short x;
};

__half __float2half(const float a);
