// PLACEHOLDER: replaced by the norm kernel family.
#include "kernels/registry.h"
namespace mt {
void register_cpu_norm(KernelTable&) {}
}  // namespace mt
