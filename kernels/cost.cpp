// Kernel cost counting (cost.h): FLOPs and bytes from the shapes in each family's params.
#include "kernels/cost.h"

#include <algorithm>

#include "runtime/profiler.h"

namespace mt {
namespace {
thread_local bool g_active = false;
thread_local KernelCost g_cost;

using detail::bytes_of;

template <class... V>
KernelWork with_views(const V&... v) {
  KernelWork w;
  ((w.views[w.n_views++] = &v), ...);
  return w;
}
// A memory-bound family: its bytes are those of `v...`, read or written once.
template <class... V>
KernelWork other(const V&... v) {
  KernelWork w = with_views(v...);
  w.other_bytes = bytes_of(v...);
  return w;
}

// Attention FLOPs for q [B, Hq, T, D], v [B, Hkv, S, Dv]: QK^T and PV, 2 per multiply-add; a causal
// mask keeps about half of the T x S scores (exactly the kept pairs are counted).
double attention_flops(const KView& q, const KView& v, bool causal) {
  const double B = static_cast<double>(q.sizes[0]), H = static_cast<double>(q.sizes[1]);
  const double T = static_cast<double>(q.sizes[2]), S = static_cast<double>(v.sizes[2]);
  const double D = static_cast<double>(q.sizes[3]), Dv = static_cast<double>(v.sizes[3]);
  double pairs = T * S;
  if (causal) {
    // query t sees keys s <= t + (S - T): sum over t of min(S, t + S - T + 1)
    const double off = S - T;
    double kept = 0;
    for (int64_t t = 0; t < q.sizes[2]; ++t) kept += std::min(S, std::max(0.0, static_cast<double>(t) + off + 1));
    pairs = kept;
  }
  return 2 * B * H * pairs * (D + Dv);
}
}  // namespace

KernelCostScope::KernelCostScope() : prev_(g_active) {
  g_active = true;
  g_cost = KernelCost{};
  detail::g_kernel_hooks.fetch_add(1, std::memory_order_relaxed);  // arms MT_KERNEL's hook
}
KernelCostScope::~KernelCostScope() {
  g_active = prev_;
  detail::g_kernel_hooks.fetch_sub(1, std::memory_order_relaxed);
}
bool KernelCostScope::active() { return g_active; }
const KernelCost& KernelCostScope::totals() { return g_cost; }

void count_host_call(HostCall c) {
  if (!g_active) return;
  if (c == HostCall::kDistOp)
    ++g_cost.dist_ops;
  else if (c == HostCall::kRedistribute)
    ++g_cost.redistributes;
  else
    ++g_cost.blocking_collectives;
}

int gemm_dim_bucket(int64_t d) {
  if (d <= 0) return kGemmDimBuckets - 1;
  int b = 0;
  while (b < kGemmDimBuckets - 1 && d > kGemmDimBound[b]) ++b;
  return b;
}

void detail::add_kernel_cost(const KernelWork& w) {
  g_cost.matmul_flops += w.matmul_flops;
  if (w.matmul_flops > 0) g_cost.matmul_flops_by_dim[gemm_dim_bucket(w.gemm_min_dim)] += w.matmul_flops;
  g_cost.matmul_bytes += w.matmul_bytes;
  g_cost.other_bytes += w.other_bytes;
  ++g_cost.kernels;
  if (w.matmul_flops > 0) ++g_cost.matmuls;
}

KernelWork kernel_work(const FillParams& p) { return other(p.out); }
KernelWork kernel_work(const ArangeParams& p) { return other(p.out); }
KernelWork kernel_work(const CopyParams& p) { return other(p.src, p.out); }
KernelWork kernel_work(const UnaryParams& p) { return other(p.in, p.out); }
KernelWork kernel_work(const BinaryParams& p) {
  KernelWork w = with_views(p.a, p.b, p.out);
  w.other_bytes = bytes_of(p.out) * 3;  // a, b broadcast to out
  return w;
}
KernelWork kernel_work(const SiluMulBwdParams& p) { return other(p.a, p.b, p.g, p.da, p.db); }
KernelWork kernel_work(const WhereParams& p) {
  KernelWork w = with_views(p.cond, p.a, p.b, p.out);
  w.other_bytes = bytes_of(p.out) * 3 + bytes_of(p.cond);
  return w;
}
KernelWork kernel_work(const ReduceParams& p) { return other(p.in, p.out); }
KernelWork kernel_work(const MatmulParams& p) {
  // a [..., M, K] @ b [..., K, N] -> out [..., M, N]
  const int nd = p.a.ndim();
  const double k = nd >= 1 ? static_cast<double>(p.a.sizes[nd - 1]) : 1;
  KernelWork w = with_views(p.a, p.b, p.out);
  w.matmul_flops = 2 * static_cast<double>(p.out.numel()) * k;
  w.matmul_bytes = bytes_of(p.a, p.b, p.out);
  const int on = p.out.ndim();
  const int64_t m = on >= 2 ? p.out.sizes[on - 2] : 1, n = on >= 1 ? p.out.sizes[on - 1] : 1;
  w.gemm_min_dim = std::min({m, n, static_cast<int64_t>(k)});
  return w;
}
KernelWork kernel_work(const RmsNormParams& p) { return other(p.x, p.weight, p.out, p.rstd); }
KernelWork kernel_work(const RmsNormBwdParams& p) { return other(p.gy, p.x, p.weight, p.rstd, p.gx, p.gw); }
KernelWork kernel_work(const LayerNormParams& p) { return other(p.x, p.weight, p.bias, p.out, p.mean, p.rstd); }
KernelWork kernel_work(const LayerNormBwdParams& p) {
  return other(p.gy, p.x, p.weight, p.mean, p.rstd, p.gx, p.gw, p.gb);
}
KernelWork kernel_work(const SoftmaxParams& p) { return other(p.in, p.out); }
KernelWork kernel_work(const RopeParams& p) { return other(p.x, p.cos, p.sin, p.out); }
KernelWork kernel_work(const IndexSelectParams& p) {
  KernelWork w = with_views(p.in, p.index, p.out);
  w.other_bytes = bytes_of(p.index, p.out) + bytes_of(p.out);  // the rows read, the index, out
  return w;
}
KernelWork kernel_work(const IndexAddParams& p) {
  KernelWork w = with_views(p.out, p.index, p.src);
  w.other_bytes = bytes_of(p.index, p.src) + 2 * bytes_of(p.src);
  return w;
}
KernelWork kernel_work(const GatherParams& p) {
  KernelWork w = with_views(p.in, p.index, p.out);
  w.other_bytes = bytes_of(p.index, p.out) + bytes_of(p.out);
  return w;
}
KernelWork kernel_work(const ScatterAddParams& p) {
  KernelWork w = with_views(p.out, p.index, p.src);
  w.other_bytes = bytes_of(p.index, p.src) + 2 * bytes_of(p.src);
  return w;
}
KernelWork kernel_work(const TopkParams& p) { return other(p.in, p.values, p.indices); }
KernelWork kernel_work(const CrossEntropyParams& p) { return other(p.logits, p.target, p.loss, p.lse); }
KernelWork kernel_work(const CrossEntropyBwdParams& p) {
  return other(p.logits, p.target, p.lse, p.grad_loss, p.grad_logits);
}
KernelWork kernel_work(const AttentionParams& p) {
  KernelWork w = with_views(p.q, p.k, p.v, p.out, p.lse);
  w.matmul_flops = attention_flops(p.q, p.v, p.causal);
  w.matmul_bytes = bytes_of(p.q, p.k, p.v, p.out, p.lse);
  return w;
}
KernelWork kernel_work(const AttentionBwdParams& p) {
  // Scores recomputed (QK^T), then dV, dP, dQ, dK: five products against the forward's two.
  KernelWork w = with_views(p.q, p.k, p.v, p.out, p.lse, p.gout, p.gq, p.gk, p.gv);
  w.matmul_flops = 2.5 * attention_flops(p.q, p.v, p.causal);
  w.matmul_bytes = bytes_of(p.q, p.k, p.v, p.out, p.lse, p.gout, p.gq, p.gk, p.gv);
  return w;
}
KernelWork kernel_work(const RandomParams& p) { return other(p.out); }
// Reads p, g, m, v; writes p, m, v.
KernelWork kernel_work(const AdamWParams& p) {
  KernelWork w = with_views(p.param, p.grad, p.exp_avg, p.exp_avg_sq);
  w.other_bytes = bytes_of(p.param, p.grad, p.exp_avg, p.exp_avg_sq) + bytes_of(p.param, p.exp_avg, p.exp_avg_sq);
  return w;
}
KernelWork kernel_work(const AdamWMultiParams& p) {  // one call: the items' bytes (views: the first item's)
  KernelWork w;
  if (!p.items.empty()) w = with_views(p.items[0].param, p.items[0].grad, p.items[0].exp_avg, p.items[0].exp_avg_sq);
  for (const AdamWParams& i : p.items)
    w.other_bytes += bytes_of(i.param, i.grad, i.exp_avg, i.exp_avg_sq) + bytes_of(i.param, i.exp_avg, i.exp_avg_sq);
  return w;
}
// Reads p, g, the codes and absmax; writes p, the codes and absmax.
KernelWork kernel_work(const AdamW8bitParams& p) {
  KernelWork w = with_views(p.param, p.grad, p.exp_avg, p.exp_avg_sq, p.absmax);
  w.other_bytes = bytes_of(p.param, p.grad, p.exp_avg, p.exp_avg_sq, p.absmax) +
                  bytes_of(p.param, p.exp_avg, p.exp_avg_sq, p.absmax);
  return w;
}
KernelWork kernel_work(const SumSqParams& p) {
  KernelWork w = with_views(p.x, p.out);
  w.other_bytes = bytes_of(p.x);
  return w;
}

}  // namespace mt
