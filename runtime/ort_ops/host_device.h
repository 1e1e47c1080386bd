// What the kernels' arithmetic headers share: their functions compile for the host and, under nvcc, the device.
#pragma once

#ifdef __CUDACC__
#define SDQES_HOST_DEVICE __host__ __device__
#else
#define SDQES_HOST_DEVICE
#endif
