// Kernel cost counting (cost.h): FLOPs and bytes from the shapes in each family's params.
#include "kernels/cost.h"

#include <algorithm>

namespace mt {
namespace {
thread_local bool g_active = false;
thread_local KernelCost g_cost;

using detail::bytes_of;

void other(double bytes) { detail::add_kernel_cost(0, 0, bytes); }

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
}
KernelCostScope::~KernelCostScope() { g_active = prev_; }
bool KernelCostScope::active() { return g_active; }
const KernelCost& KernelCostScope::totals() { return g_cost; }

void detail::add_kernel_cost(double matmul_flops, double matmul_bytes, double other_bytes) {
  g_cost.matmul_flops += matmul_flops;
  g_cost.matmul_bytes += matmul_bytes;
  g_cost.other_bytes += other_bytes;
  ++g_cost.kernels;
  if (matmul_flops > 0) ++g_cost.matmuls;
}

void record_kernel_cost(const FillParams& p) { other(bytes_of(p.out)); }
void record_kernel_cost(const ArangeParams& p) { other(bytes_of(p.out)); }
void record_kernel_cost(const CopyParams& p) { other(bytes_of(p.src, p.out)); }
void record_kernel_cost(const UnaryParams& p) { other(bytes_of(p.in, p.out)); }
void record_kernel_cost(const BinaryParams& p) { other(bytes_of(p.out) * 3); }  // a, b broadcast to out
void record_kernel_cost(const WhereParams& p) { other(bytes_of(p.out) * 3 + bytes_of(p.cond)); }
void record_kernel_cost(const ReduceParams& p) { other(bytes_of(p.in, p.out)); }
void record_kernel_cost(const MatmulParams& p) {
  // a [..., M, K] @ b [..., K, N] -> out [..., M, N]
  const int nd = p.a.ndim();
  const double k = nd >= 1 ? static_cast<double>(p.a.sizes[nd - 1]) : 1;
  detail::add_kernel_cost(2 * static_cast<double>(p.out.numel()) * k, bytes_of(p.a, p.b, p.out), 0);
}
void record_kernel_cost(const RmsNormParams& p) { other(bytes_of(p.x, p.weight, p.out, p.rstd)); }
void record_kernel_cost(const RmsNormBwdParams& p) { other(bytes_of(p.gy, p.x, p.weight, p.rstd, p.gx, p.gw)); }
void record_kernel_cost(const LayerNormParams& p) { other(bytes_of(p.x, p.weight, p.bias, p.out, p.mean, p.rstd)); }
void record_kernel_cost(const LayerNormBwdParams& p) {
  other(bytes_of(p.gy, p.x, p.weight, p.mean, p.rstd, p.gx, p.gw, p.gb));
}
void record_kernel_cost(const SoftmaxParams& p) { other(bytes_of(p.in, p.out)); }
void record_kernel_cost(const RopeParams& p) { other(bytes_of(p.x, p.cos, p.sin, p.out)); }
void record_kernel_cost(const IndexSelectParams& p) { other(bytes_of(p.index, p.out) * 1 + bytes_of(p.out)); }
void record_kernel_cost(const IndexAddParams& p) { other(bytes_of(p.index, p.src) + 2 * bytes_of(p.src)); }
void record_kernel_cost(const GatherParams& p) { other(bytes_of(p.index, p.out) + bytes_of(p.out)); }
void record_kernel_cost(const ScatterAddParams& p) { other(bytes_of(p.index, p.src) + 2 * bytes_of(p.src)); }
void record_kernel_cost(const TopkParams& p) { other(bytes_of(p.in, p.values, p.indices)); }
void record_kernel_cost(const CrossEntropyParams& p) { other(bytes_of(p.logits, p.target, p.loss, p.lse)); }
void record_kernel_cost(const CrossEntropyBwdParams& p) {
  other(bytes_of(p.logits, p.target, p.lse, p.grad_loss, p.grad_logits));
}
void record_kernel_cost(const AttentionParams& p) {
  detail::add_kernel_cost(attention_flops(p.q, p.v, p.causal), bytes_of(p.q, p.k, p.v, p.out, p.lse), 0);
}
void record_kernel_cost(const AttentionBwdParams& p) {
  // Scores recomputed (QK^T), then dV, dP, dQ, dK: five products against the forward's two.
  detail::add_kernel_cost(2.5 * attention_flops(p.q, p.v, p.causal),
                          bytes_of(p.q, p.k, p.v, p.out, p.lse, p.gout, p.gq, p.gk, p.gv), 0);
}
void record_kernel_cost(const RandomParams& p) { other(bytes_of(p.out)); }
// Reads p, g, m, v; writes p, m, v.
void record_kernel_cost(const AdamWParams& p) {
  other(bytes_of(p.param, p.grad, p.exp_avg, p.exp_avg_sq) + bytes_of(p.param, p.exp_avg, p.exp_avg_sq));
}
void record_kernel_cost(const AdamWMultiParams& p) {  // one call: the items' bytes
  double bytes = 0;
  for (const AdamWParams& i : p.items)
    bytes += bytes_of(i.param, i.grad, i.exp_avg, i.exp_avg_sq) + bytes_of(i.param, i.exp_avg, i.exp_avg_sq);
  other(bytes);
}
void record_kernel_cost(const SumSqParams& p) { other(bytes_of(p.x)); }

}  // namespace mt
