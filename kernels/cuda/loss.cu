// PLACEHOLDER: CUDA kernels for cross_entropy(_bwd) (issue 3). Registers nothing yet.
#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {

void register_cuda_loss(KernelTable&) {}

}  // namespace mt
