// Fused cross-entropy on the CPU: one pass per row computes the log-sum-exp (max-shifted, summed
// in double) and the loss; the backward rebuilds softmax from the saved lse, so the [N, V]
// probabilities never exist as a tensor. f32 and 16-bit logits compute in float with vmath.h's
// vectorizable exp and lane sums (a row's exps staged in a per-thread buffer, then summed); f64
// logits in double with libm's exp, one running sum (the gradient checks' reference type).
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/vmath.h"
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
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    if constexpr (std::is_same_v<T, double>) {
      for (int64_t v = 0; v < V; ++v) m = std::max(m, row[v]);
      for (int64_t v = 0; v < V; ++v) s += std::exp(row[v] - m);
    } else {
      thread_local std::vector<float> e;
      e.resize(static_cast<size_t>(V));
      const float mf = lane_max(V, [row](int64_t v) { return static_cast<float>(row[v]); });
      for (int64_t v = 0; v < V; ++v) e[static_cast<size_t>(v)] = exp_f32(static_cast<float>(row[v]) - mf);
      s = lane_sum(V, [&](int64_t v) { return static_cast<double>(e[static_cast<size_t>(v)]); });
      m = mf;
    }
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
    if constexpr (std::is_same_v<T, double>) {
      const double g = gl[n * p.grad_loss.strides[0]], l = lse[n * p.lse.strides[0]];
      for (int64_t v = 0; v < V; ++v) grow[v] = g * (std::exp(row[v] - l) - (v == t ? 1.0 : 0.0));
    } else {
      const float g = gl[n * p.grad_loss.strides[0]], l = lse[n * p.lse.strides[0]];
      for (int64_t v = 0; v < V; ++v) grow[v] = T(g * exp_f32(static_cast<float>(row[v]) - l));
      grow[t] = T(g * (exp_f32(static_cast<float>(row[t]) - l) - 1.0f));
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
