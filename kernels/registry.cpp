// Builds the kernel tables once. Only this file knows which backends exist.
#include "kernels/registry.h"

#include "config.h"
#include "runtime/error.h"

namespace mt {
namespace {

KernelTable make_cpu_table() {
  KernelTable t;
  register_cpu_copy(t);
  register_cpu_pointwise(t);
  register_cpu_reduce(t);
  register_cpu_matmul(t);
  register_cpu_norm(t);
  register_cpu_rope(t);
  register_cpu_index(t);
  register_cpu_loss(t);
  register_cpu_attention(t);
  register_cpu_random(t);
  return t;
}

}  // namespace

const KernelTable& kernels(DeviceType type) {
  static const KernelTable cpu = make_cpu_table();
  static const KernelTable none;  // CUDA kernels arrive with the CUDA backend
  return type == DeviceType::kCPU ? cpu : none;
}

void missing_kernel(const char* family, DeviceType type) {
  const char* dev = type == DeviceType::kCPU ? "cpu" : type == DeviceType::kCUDA ? "cuda" : "meta";
  MT_FAIL("no {} kernel for '{}'{}", dev, family,
          type == DeviceType::kMeta ? " (meta tensors have no storage: materialize them first)" : "");
}

}  // namespace mt
