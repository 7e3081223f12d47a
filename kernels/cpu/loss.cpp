// PLACEHOLDER: replaced by the loss kernel family.
#include "kernels/registry.h"
namespace mt {
void register_cpu_loss(KernelTable&) {}
}  // namespace mt
