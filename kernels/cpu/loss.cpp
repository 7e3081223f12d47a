// Fused cross-entropy on the CPU: one pass per row computes the log-sum-exp (max-shifted,
// accumulated in double) and the loss; the backward rebuilds softmax from the saved lse, so the
// [N, V] probabilities never exist as a tensor. 16-bit logits are read in float.
#include <cmath>
#include <limits>

#include "kernels/cpu/loops.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

template <class I>
int64_t target_at(const KView& t, int64_t n) {
  return static_cast<int64_t>(t.ptr<I>()[n * t.strides[0]]);
}

int64_t target_of(const KView& t, int64_t n) {
  if (t.dtype == DType::kI64) return target_at<int64_t>(t, n);
  return target_at<int32_t>(t, n);
}

template <class T>
void cross_entropy_typed(const CrossEntropyParams& p) {
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;  // loss/lse type
  const int64_t N = p.logits.sizes[0], V = p.logits.sizes[1];
  const T* logits = p.logits.ptr<T>();
  L* loss = p.loss.ptr<L>();
  L* lse_out = p.lse.ptr<L>();
  parallel_for(N, V, [&](int64_t n) {
    const T* row = logits + n * V;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(compute_t<T>(row[v])));
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(compute_t<T>(row[v])) - m);
    double lse = std::isinf(m) ? m : m + std::log(s);
    lse_out[n * p.lse.strides[0]] = static_cast<L>(lse);
    int64_t t = target_of(p.target, n);
    loss[n * p.loss.strides[0]] =
        t == p.ignore_index ? L(0) : static_cast<L>(lse - static_cast<double>(compute_t<T>(row[t])));
  });
}

template <class T>
void cross_entropy_bwd_typed(const CrossEntropyBwdParams& p) {
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  using C = compute_t<T>;
  const int64_t N = p.logits.sizes[0], V = p.logits.sizes[1];
  const T* logits = p.logits.ptr<T>();
  T* grad = p.grad_logits.ptr<T>();
  const L* lse = p.lse.ptr<L>();
  const L* gl = p.grad_loss.ptr<L>();
  parallel_for(N, V, [&](int64_t n) {
    const T* row = logits + n * V;
    T* grow = grad + n * V;
    int64_t t = target_of(p.target, n);
    if (t == p.ignore_index) {
      for (int64_t v = 0; v < V; ++v) grow[v] = T(C(0));
      return;
    }
    double g = static_cast<double>(gl[n * p.grad_loss.strides[0]]);
    double l = static_cast<double>(lse[n * p.lse.strides[0]]);
    for (int64_t v = 0; v < V; ++v) {
      double prob = std::exp(static_cast<double>(C(row[v])) - l);
      grow[v] = T(static_cast<C>(g * (prob - (v == t ? 1.0 : 0.0))));
    }
  });
}

void cross_entropy(const CrossEntropyParams& p) {
  MT_DISPATCH_FLOAT(p.logits.dtype, "cross_entropy", { cross_entropy_typed<scalar_t>(p); });
}
void cross_entropy_bwd(const CrossEntropyBwdParams& p) {
  MT_DISPATCH_FLOAT(p.logits.dtype, "cross_entropy_bwd", { cross_entropy_bwd_typed<scalar_t>(p); });
}

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_loss(KernelTable& t) {
  t.cross_entropy = cpu::cross_entropy;
  t.cross_entropy_bwd = cpu::cross_entropy_bwd;
}
}  // namespace mt
