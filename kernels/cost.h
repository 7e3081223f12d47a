// Work per kernel call for the roofline of `meshtrain plan --estimate` (plan/roofline.h). While a
// KernelCostScope lives on this thread, every MT_KERNEL call (meta no-op kernels included) adds
// its FLOPs and the bytes it reads and writes, taken from the shapes in its params, to the scope's
// totals. Matmul and attention FLOPs are counted apart (they run at a GEMM rate); every other
// family is memory bound (its bytes run at a memory bandwidth). Counting costs nothing when no
// scope is active (one thread-local test per kernel call).
#pragma once

#include <cstdint>

#include "kernels/params.h"

namespace mt {

struct KernelCost {
  double matmul_flops = 0;  // matmul and attention (forward and backward), 2 per multiply-add
  double matmul_bytes = 0;  // their operands, read and written once
  double other_bytes = 0;   // every other kernel: inputs read + outputs written
  int64_t kernels = 0;      // kernel calls
  int64_t matmuls = 0;
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

namespace detail {
void add_kernel_cost(double matmul_flops, double matmul_bytes, double other_bytes);
inline double view_bytes(const KView& v) {
  return static_cast<double>(v.numel()) * static_cast<double>(dtype_size(v.dtype));
}
template <class... V>
double bytes_of(const V&... v) {
  return (0.0 + ... + view_bytes(v));
}
}  // namespace detail

// One overload per kernel family (the names of MT_KERNEL_LIST in kernels/registry.h).
void record_kernel_cost(const FillParams& p);
void record_kernel_cost(const ArangeParams& p);
void record_kernel_cost(const CopyParams& p);
void record_kernel_cost(const UnaryParams& p);
void record_kernel_cost(const BinaryParams& p);
void record_kernel_cost(const WhereParams& p);
void record_kernel_cost(const ReduceParams& p);
void record_kernel_cost(const MatmulParams& p);
void record_kernel_cost(const RmsNormParams& p);
void record_kernel_cost(const RmsNormBwdParams& p);
void record_kernel_cost(const LayerNormParams& p);
void record_kernel_cost(const LayerNormBwdParams& p);
void record_kernel_cost(const SoftmaxParams& p);
void record_kernel_cost(const RopeParams& p);
void record_kernel_cost(const IndexSelectParams& p);
void record_kernel_cost(const IndexAddParams& p);
void record_kernel_cost(const GatherParams& p);
void record_kernel_cost(const ScatterAddParams& p);
void record_kernel_cost(const TopkParams& p);
void record_kernel_cost(const CrossEntropyParams& p);
void record_kernel_cost(const CrossEntropyBwdParams& p);
void record_kernel_cost(const AttentionParams& p);
void record_kernel_cost(const AttentionBwdParams& p);
void record_kernel_cost(const RandomParams& p);
void record_kernel_cost(const AdamWParams& p);
void record_kernel_cost(const AdamWMultiParams& p);
void record_kernel_cost(const SumSqParams& p);

}  // namespace mt
