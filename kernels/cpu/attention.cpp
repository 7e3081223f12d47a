// PLACEHOLDER: replaced by the attention kernel family.
#include "kernels/registry.h"
namespace mt {
void register_cpu_attention(KernelTable&) {}
}  // namespace mt
