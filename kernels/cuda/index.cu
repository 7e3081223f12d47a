// PLACEHOLDER: CUDA kernels for index_select, index_add, gather, scatter_add, topk (issue 3). Registers nothing yet.
#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {

void register_cuda_index(KernelTable&) {}

}  // namespace mt
