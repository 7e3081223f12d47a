// PLACEHOLDER: replaced by the index kernel family.
#include "kernels/registry.h"
namespace mt {
void register_cpu_index(KernelTable&) {}
}  // namespace mt
