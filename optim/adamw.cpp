// AdamW update: a fused host loop for contiguous f32/f64 CPU tensors (one pass, no temporaries),
// tensor ops otherwise (other dtypes, strided parameters, other devices).
#include "optim/adamw.h"

#include <cmath>

#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt {

namespace {

const AdamWOptions& checked(const AdamWOptions& o) {
  MT_CHECK(o.beta1 >= 0 && o.beta1 < 1, "AdamW: beta1 {} must be in [0, 1)", o.beta1);
  MT_CHECK(o.beta2 >= 0 && o.beta2 < 1, "AdamW: beta2 {} must be in [0, 1)", o.beta2);
  MT_CHECK(std::isfinite(o.eps) && o.eps >= 0, "AdamW: eps {} must be finite and >= 0", o.eps);
  return o;
}

// Per-step scalars, computed once in double.
struct AdamWCoefs {
  double decay;        // 1 - lr * wd
  double beta1, beta2;
  double step_size;    // lr / (1 - beta1^t)
  double bc2_sqrt;     // sqrt(1 - beta2^t)
  double eps;
};

template <class T>
void adamw_host(T* p, const T* g, T* m, T* v, int64_t n, const AdamWCoefs& c) {
  const T decay = static_cast<T>(c.decay), b1 = static_cast<T>(c.beta1), b2 = static_cast<T>(c.beta2);
  const T one_b1 = static_cast<T>(1 - c.beta1), one_b2 = static_cast<T>(1 - c.beta2);
  const T step_size = static_cast<T>(c.step_size), bc2_sqrt = static_cast<T>(c.bc2_sqrt);
  const T eps = static_cast<T>(c.eps);
#pragma omp parallel for if (n > 32768) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    const T mi = b1 * m[i] + one_b1 * gi;
    const T vi = b2 * v[i] + one_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}

}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& opts)
    : Optimizer(std::move(groups), opts.lr, {"exp_avg", "exp_avg_sq"}, "AdamW"), opts_(checked(opts)) {}

void AdamW::update(Slot& slot, const Tensor& grad, double lr, double weight_decay) {
  Tensor& p = slot.param;
  Tensor& m = slot.state[0];
  Tensor& v = slot.state[1];
  const double t = static_cast<double>(slot.steps);
  AdamWCoefs c;
  c.decay = 1 - lr * weight_decay;
  c.beta1 = opts_.beta1;
  c.beta2 = opts_.beta2;
  c.step_size = lr / (1 - std::pow(opts_.beta1, t));
  c.bc2_sqrt = std::sqrt(1 - std::pow(opts_.beta2, t));
  c.eps = opts_.eps;
  if (detail::fused_host_ok(p, {grad, m, v})) {
    if (p.dtype() == DType::kF64)
      adamw_host<double>(p.data<double>(), grad.data<double>(), m.data<double>(), v.data<double>(),
                         p.numel(), c);
    else
      adamw_host<float>(p.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), p.numel(), c);
    bump_version(p);
    bump_version(m);
    bump_version(v);
    return;
  }
  if (weight_decay != 0) p.mul_(c.decay);
  m.mul_(c.beta1);
  m.add_(grad, 1 - c.beta1);
  v.mul_(c.beta2);
  v.add_(mul(grad, grad), 1 - c.beta2);
  Tensor denom = add(div(sqrt(v), c.bc2_sqrt), c.eps);
  p.add_(div(m, denom), -c.step_size);
}

}  // namespace mt
