// PLACEHOLDER: replaced by the matmul kernel family.
#include "kernels/registry.h"
namespace mt {
void register_cpu_matmul(KernelTable&) {}
}  // namespace mt
