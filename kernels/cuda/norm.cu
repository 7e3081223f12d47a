// PLACEHOLDER: CUDA kernels for rms_norm(_bwd), layer_norm(_bwd), softmax (issue 3). Registers nothing yet.
#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {

void register_cuda_norm(KernelTable&) {}

}  // namespace mt
