// PLACEHOLDER: CUDA kernels for rope (issue 3). Registers nothing yet.
#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {

void register_cuda_rope(KernelTable&) {}

}  // namespace mt
