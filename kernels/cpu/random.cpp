// PLACEHOLDER: replaced by the random kernel family.
#include "kernels/registry.h"
namespace mt {
void register_cpu_random(KernelTable&) {}
}  // namespace mt
