// cuda_fail: what MT_CUDA_CHECK (kernels/cuda/common.cuh) throws, with CUDA's own error string.
#include <cuda_runtime.h>

#include "runtime/cuda/check.h"
#include "runtime/error.h"

namespace mt {

void cuda_fail(cudaError_t err, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so that the process can go on
  throw Error(fmt::format("CUDA error {} ({}): {} in `{}` at {}:{}", static_cast<int>(err),
                          cudaGetErrorName(err), cudaGetErrorString(err), expr, file, line));
}

}  // namespace mt
