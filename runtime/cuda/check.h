// MT_CUDA_CHECK for host code in runtime/cuda/*.cpp (kernels/cuda/common.cuh has the same for .cu
// files): throws mt::Error with CUDA's error string, the expression, file and line.
#pragma once

#include <cuda_runtime.h>

namespace mt {
[[noreturn]] void cuda_fail(cudaError_t err, const char* expr, const char* file, int line);
}  // namespace mt

#ifndef MT_CUDA_CHECK
#define MT_CUDA_CHECK(expr)                                                                      \
  do {                                                                                           \
    cudaError_t err_ = (expr);                                                                   \
    if (err_ != cudaSuccess)                                                                     \
      ::mt::cuda_fail(err_, #expr, __FILE__, __LINE__);                                          \
  } while (0)
#endif
