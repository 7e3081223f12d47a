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
  register_cpu_optim(t);
  return t;
}

// Empty in a build without the CUDA backend: every CUDA kernel is then "missing", with a message.
KernelTable make_cuda_table() {
  KernelTable t;
#if MT_HAVE_CUDA
  register_cuda_copy(t);
  register_cuda_pointwise(t);
  register_cuda_reduce(t);
  register_cuda_matmul(t);
  register_cuda_norm(t);
  register_cuda_rope(t);
  register_cuda_index(t);
  register_cuda_loss(t);
  register_cuda_attention(t);
  register_cuda_random(t);
  register_cuda_optim(t);
#endif
  return t;
}

KernelTable make_noop_table() {
  KernelTable t;
#define MT_NOOP_SLOT(name, P) t.name = [](const P&) {};
  MT_KERNEL_LIST(MT_NOOP_SLOT)
#undef MT_NOOP_SLOT
  return t;
}

thread_local bool g_meta_kernels = false;

}  // namespace

MetaKernelsGuard::MetaKernelsGuard() : prev_(g_meta_kernels) { g_meta_kernels = true; }
MetaKernelsGuard::~MetaKernelsGuard() { g_meta_kernels = prev_; }
bool MetaKernelsGuard::active() { return g_meta_kernels; }

const KernelTable& kernels(DeviceType type) {
  static const KernelTable cpu = make_cpu_table();
  static const KernelTable cuda = make_cuda_table();
  static const KernelTable none;  // meta: no storage, no kernels
  static const KernelTable noop = make_noop_table();
  if (type == DeviceType::kCPU) return cpu;
  if (type == DeviceType::kCUDA) return cuda;
  if (type == DeviceType::kMeta && g_meta_kernels) return noop;
  return none;
}

void missing_kernel(const char* family, DeviceType type) {
  const char* dev = type == DeviceType::kCPU ? "cpu" : type == DeviceType::kCUDA ? "cuda" : "meta";
  MT_FAIL("no {} kernel for '{}'{}", dev, family,
          type == DeviceType::kMeta   ? " (meta tensors have no storage: materialize them first)"
          : type == DeviceType::kCUDA ? (MT_HAVE_CUDA ? " (no CUDA kernel is registered for it)"
                                                      : " (this build has no CUDA backend)")
                                      : "");
}

}  // namespace mt
