// MT_KERNEL's hook (kernels/registry.h), run only while some thread has a KernelCostScope or a
// Profiler (kernel_hooks_armed()): this thread's scope gets the call's work, this thread's
// Profiler an op event (module, shapes, dtype, device, time, FLOPs, bytes).
#include <fmt/format.h>

#include "kernels/cost.h"
#include "kernels/registry.h"
#include "runtime/cuda/device.h"
#include "runtime/profiler.h"

namespace mt {
namespace {

std::string shapes_of(const KernelWork& w) {
  std::string s;
  for (int i = 0; i < w.n_views; ++i) {
    const KView& v = *w.views[i];
    if (!v && v.ndim() == 0) continue;  // an optional operand left empty
    if (!s.empty()) s += ' ';
    s += '[';
    for (int d = 0; d < v.ndim(); ++d) {
      if (d) s += ',';
      s += std::to_string(v.sizes[d]);
    }
    s += ']';
  }
  return s;
}

template <class P>
void hooked(const char* family, DeviceType dev, void (*fn)(const P&), const P& p) {
  const bool cost = KernelCostScope::active();
  Profiler* prof = dev == DeviceType::kMeta ? nullptr : Profiler::current();  // meta ops move nothing
  if (!cost && !prof) {
    fn(p);
    return;
  }
  const KernelWork w = kernel_work(p);
  if (cost) detail::add_kernel_cost(w);
  if (!prof) {
    fn(p);
    return;
  }
  const double t0 = prof->now_us();
  fn(p);
  if (dev == DeviceType::kCUDA) cuda::synchronize();  // device time, not launch time
  const double t1 = prof->now_us();
  ProfileEvent e;
  e.kind = ProfileEvent::Kind::kOp;
  e.name = family;
  e.module = prof->current_module();
  e.backward = prof->in_backward();
  e.shapes = shapes_of(w);
  e.dtype = w.n_views > 0 ? dtype_name(w.views[0]->dtype) : "";
  e.device = dev == DeviceType::kCUDA ? "cuda" : "cpu";
  e.ts_us = t0;
  e.dur_us = t1 - t0;
  e.flops = w.matmul_flops;
  e.bytes = w.matmul_bytes + w.other_bytes;
  prof->add_event(std::move(e));
}

}  // namespace

#define MT_KERNEL_HOOK_DEF(name, P)                                                              \
  void run_hooked_kernel(const char* family, DeviceType dev, void (*fn)(const P&), const P& p) { \
    hooked(family, dev, fn, p);                                                                  \
  }
MT_KERNEL_LIST(MT_KERNEL_HOOK_DEF)
#undef MT_KERNEL_HOOK_DEF

}  // namespace mt
