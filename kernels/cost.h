// Work per kernel call for the roofline of `meshtrain plan --estimate` (plan/roofline.h). While a
// KernelCostScope lives on this thread, every MT_KERNEL call (meta no-op kernels included) adds
// its FLOPs and the bytes it reads and writes, taken from the shapes in its params, to the scope's
// totals. Matmul and attention FLOPs are counted apart (they run at a GEMM rate); every other
// family is memory bound (its bytes run at a memory bandwidth). Counting costs nothing when no
// scope is active: MT_KERNEL tests one process-wide counter (kernel_hooks_armed(),
// runtime/profiler.h) that scopes and Profilers raise. The profiler records the same work per call.
#pragma once

#include <cstdint>

#include "kernels/params.h"

namespace mt {

// Matmul FLOPs are also kept by the smallest dim of each product (M, N or the reduction K): a
// GEMM with a thin dim (a weight gradient over few tokens, a projection of a short batch) runs
// well below the rate of a square one, and the roofline charges each bucket at the profile's
// efficiency for that dim (plan/roofline.h). Bucket b holds products whose smallest dim d has
// kGemmDimBound[b - 1] < d <= kGemmDimBound[b]; the last one every larger d, and attention.
inline constexpr int kGemmDimBuckets = 8;
inline constexpr int64_t kGemmDimBound[kGemmDimBuckets - 1] = {8, 16, 32, 64, 128, 256, 512};
int gemm_dim_bucket(int64_t smallest_dim);

struct KernelCost {
  double matmul_flops = 0;  // matmul and attention (forward and backward), 2 per multiply-add
  double matmul_flops_by_dim[kGemmDimBuckets] = {};  // the same FLOPs by the product's smallest dim
  double matmul_bytes = 0;  // their operands, read and written once
  double other_bytes = 0;   // every other kernel: inputs read + outputs written
  // The optimizer step's bytes (modelled by the estimate, which does not run the optimizer): they
  // run at the profile's optimizer bandwidth (an AdamW update does ~10 FLOPs per element, and on a
  // CPU runs at about half the copy bandwidth).
  double optimizer_bytes = 0;
  int64_t kernels = 0;      // kernel calls
  int64_t matmuls = 0;
  // Host-side calls above the kernels, each with its own per-call cost in the roofline
  // (plan/roofline.h): DTensor op dispatches (sharding propagation, local op, wrap; mesh/dispatch.cpp)
  // and DTensor redistributions (mesh/dtensor.cpp: plan hooks, rule-driven and explicit ones, and
  // their backward), counted whether or not they move data.
  int64_t dist_ops = 0;
  int64_t redistributes = 0;
  // Counted collectives that block the rank until its peers join (all but the gradient reducer's
  // bucket launches, which overlap backward; mesh/collective_count.h).
  int64_t blocking_collectives = 0;
};

class KernelCostScope {
 public:
  KernelCostScope();  // starts from zero
  ~KernelCostScope();
  KernelCostScope(const KernelCostScope&) = delete;
  KernelCostScope& operator=(const KernelCostScope&) = delete;
  static bool active();
  static const KernelCost& totals();

 private:
  bool prev_;
};

// The work of one kernel call, from the shapes in its params: FLOPs and bytes as above, and the
// params' views in declaration order (kernels/params.h), whose shapes the profiler records.
struct KernelWork {
  double matmul_flops = 0;
  int64_t gemm_min_dim = 0;  // a matmul's smallest dim (0: attention or no matmul; the top bucket)
  double matmul_bytes = 0;
  double other_bytes = 0;
  const KView* views[10] = {};
  int n_views = 0;
};

enum class HostCall : uint8_t { kDistOp, kRedistribute, kBlockingCollective };
// Adds one host call to this thread's KernelCostScope (a no-op when none is active).
void count_host_call(HostCall c);

namespace detail {
void add_kernel_cost(const KernelWork& w);
inline double view_bytes(const KView& v) {
  return static_cast<double>(v.numel()) * static_cast<double>(dtype_size(v.dtype));
}
template <class... V>
double bytes_of(const V&... v) {
  return (0.0 + ... + view_bytes(v));
}
}  // namespace detail

// One overload per kernel family (the names of MT_KERNEL_LIST in kernels/registry.h).
#define MT_KERNEL_WORK_DECL(name, P) KernelWork kernel_work(const P& p);
MT_KERNEL_LIST(MT_KERNEL_WORK_DECL)
#undef MT_KERNEL_WORK_DECL

// Adds the call's work to this thread's KernelCostScope (the MT_KERNEL hook; kernels/hooks.cpp).
template <class P>
void record_kernel_cost(const P& p) {
  detail::add_kernel_cost(kernel_work(p));
}

}  // namespace mt
