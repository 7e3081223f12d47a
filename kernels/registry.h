// The kernel table: one X-macro list names every kernel family and its params struct; each
// backend fills a KernelTable explicitly from one register function per family (no static
// initializers). A missing kernel is an error naming the family and the device.
#pragma once

#include "kernels/cost.h"
#include "kernels/params.h"
#include "runtime/profiler.h"
#include "runtime/device.h"

// MT_KERNEL_LIST (every family and its params struct) is in kernels/params.h.

namespace mt {

struct KernelTable {
#define MT_KERNEL_SLOT(name, P) void (*name)(const P&) = nullptr;
  MT_KERNEL_LIST(MT_KERNEL_SLOT)
#undef MT_KERNEL_SLOT
};

// The table for a device type; filled on first use.
const KernelTable& kernels(DeviceType type);
[[noreturn]] void missing_kernel(const char* family, DeviceType type);

// Shape inference runs ops on meta tensors (DTensor dispatch, on a propagation-cache miss): while
// a MetaKernelsGuard lives on this thread, every meta kernel is a no-op (and reading a meta
// tensor's values gives zeros) instead of an error.
class MetaKernelsGuard {
 public:
  MetaKernelsGuard();
  ~MetaKernelsGuard();
  MetaKernelsGuard(const MetaKernelsGuard&) = delete;
  MetaKernelsGuard& operator=(const MetaKernelsGuard&) = delete;
  static bool active();

 private:
  bool prev_;
};

// Per-family registration, one function per file in kernels/cpu/.
void register_cpu_copy(KernelTable& t);       // fill, arange, copy
void register_cpu_pointwise(KernelTable& t);  // unary, binary, silu_mul_bwd, where
void register_cpu_reduce(KernelTable& t);     // reduce
void register_cpu_matmul(KernelTable& t);     // matmul
void register_cpu_norm(KernelTable& t);       // rms_norm(_bwd), layer_norm(_bwd), softmax
void register_cpu_rope(KernelTable& t);       // rope
void register_cpu_index(KernelTable& t);      // index_select, index_add, gather, scatter_add, topk
void register_cpu_loss(KernelTable& t);       // cross_entropy(_bwd)
void register_cpu_attention(KernelTable& t);  // attention(_bwd)
void register_cpu_random(KernelTable& t);     // random
void register_cpu_optim(KernelTable& t);      // adamw, adamw_multi, sum_sq, adamw8bit

// The CUDA backend (kernels/cuda/*.cu, built when MT_HAVE_CUDA): the same families.
void register_cuda_copy(KernelTable& t);
void register_cuda_pointwise(KernelTable& t);
void register_cuda_reduce(KernelTable& t);
void register_cuda_matmul(KernelTable& t);
void register_cuda_norm(KernelTable& t);
void register_cuda_rope(KernelTable& t);
void register_cuda_index(KernelTable& t);
void register_cuda_loss(KernelTable& t);
void register_cuda_attention(KernelTable& t);
void register_cuda_random(KernelTable& t);
void register_cuda_optim(KernelTable& t);


// The hook of MT_KERNEL when kernel_hooks_armed() (runtime/profiler.h): adds the call's work to
// this thread's KernelCostScope and records it on this thread's Profiler, whichever is active,
// then calls the kernel (kernels/hooks.cpp).
#define MT_KERNEL_HOOK_DECL(name, P) \
  void run_hooked_kernel(const char* family, DeviceType dev, void (*fn)(const P&), const P& p);
MT_KERNEL_LIST(MT_KERNEL_HOOK_DECL)
#undef MT_KERNEL_HOOK_DECL

}  // namespace mt

// Calls the kernel of `family` for device type `dev`, or throws naming both. With no Profiler
// and no KernelCostScope anywhere, the hooks cost one relaxed load and a predictable branch.
#define MT_KERNEL(dev, family, params)                                    \
  do {                                                                    \
    auto fn_ = ::mt::kernels(dev).family;                                 \
    if (!fn_) ::mt::missing_kernel(#family, dev);                         \
    if (::mt::kernel_hooks_armed())                                       \
      ::mt::run_hooked_kernel(#family, dev, fn_, params);                 \
    else                                                                  \
      fn_(params);                                                        \
  } while (0)
