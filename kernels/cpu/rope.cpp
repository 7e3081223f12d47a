// PLACEHOLDER: replaced by the rope kernel family.
#include "kernels/registry.h"
namespace mt {
void register_cpu_rope(KernelTable&) {}
}  // namespace mt
