// AdamW update: one fused kernel for contiguous f32/f64 tensors on the CPU or CUDA (one pass, no
// temporaries: the `adamw` kernel family), tensor ops otherwise (other dtypes, strided parameters).
#include "optim/adamw.h"

#include <cmath>

#include "kernels/registry.h"
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

}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& opts)
    : Optimizer(std::move(groups), opts.lr, {"exp_avg", "exp_avg_sq"}, "AdamW"), opts_(checked(opts)) {}

void AdamW::update(Slot& slot, const Tensor& grad, double lr, double weight_decay) {
  Tensor& p = slot.param;
  Tensor& m = slot.state[0];
  Tensor& v = slot.state[1];
  const double t = static_cast<double>(slot.steps);
  AdamWParams c;
  c.decay = 1 - lr * weight_decay;
  c.beta1 = opts_.beta1;
  c.beta2 = opts_.beta2;
  c.step_size = lr / (1 - std::pow(opts_.beta1, t));
  c.bc2_sqrt = std::sqrt(1 - std::pow(opts_.beta2, t));
  c.eps = opts_.eps;
  if (detail::fused_ok(p, {grad, m, v})) {  // one kernel (kernels/cpu/optim.cpp, kernels/cuda/optim.cu)
    c.param = p.view_info();
    c.grad = grad.view_info();
    c.exp_avg = m.view_info();
    c.exp_avg_sq = v.view_info();
    MT_KERNEL(p.device().type, adamw, c);
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
