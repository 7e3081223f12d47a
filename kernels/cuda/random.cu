#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"
namespace mt {
void register_cuda_random(KernelTable&) {}
}
