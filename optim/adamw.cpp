// AdamW update: contiguous f32/f64 tensors on the CPU or CUDA are queued during the step and
// updated by one fused kernel call at its end (one pass, no temporaries; on CUDA up to 40 f32
// tensors per launch: the `adamw_multi` kernel family); tensor ops otherwise (other dtypes,
// strided parameters).
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
  c.grad_scale = grad_scale_;
  Tensor copy;
  if (auto it = copies_.find(slot.name); it != copies_.end())
    copy = it->second.is_distributed() ? local_view(it->second) : it->second;
  const bool mixed = grad.dtype() != p.dtype();
  const auto same_place = [&](const Tensor& x) {
    return x.device() == p.device() && x.is_contiguous() && x.shape() == p.shape();
  };
  if (detail::fused_ok(p, {m, v}) && same_place(grad) && (!copy.defined() || same_place(copy))) {
    // queued for adamw_multi (kernels/{cpu,cuda}/optim.*)
    c.param = p.view_info();
    c.grad = grad.view_info();
    c.exp_avg = m.view_info();
    c.exp_avg_sq = v.view_info();
    if (copy.defined()) c.param_copy = copy.view_info();
    queued_.push_back({c, p, grad, m, v, copy});
    return;
  }
  Tensor g = mixed ? grad.to(p.dtype()) : grad;
  if (grad_scale_ != 1) g = mul(g, grad_scale_);
  if (weight_decay != 0) p.mul_(c.decay);
  m.mul_(c.beta1);
  m.add_(g, 1 - c.beta1);
  v.mul_(c.beta2);
  v.add_(mul(g, g), 1 - c.beta2);
  Tensor denom = add(div(sqrt(v), c.bc2_sqrt), c.eps);
  p.add_(div(m, denom), -c.step_size);
  if (copy.defined()) copy.copy_(p);
}

bool AdamW::accepts_grad(const Tensor& param, const Tensor& grad) const {
  return grad.dtype() == param.dtype() ||
         (param.dtype() == DType::kF32 && (grad.dtype() == DType::kBF16 || grad.dtype() == DType::kF16));
}

void AdamW::set_grad_scale(double scale) {
  MT_CHECK(std::isfinite(scale) && scale > 0, "AdamW: gradient scale {} must be finite and > 0", scale);
  grad_scale_ = scale;
}

void AdamW::set_param_copies(const NamedTensors& copies) {
  copies_.clear();
  for (const auto& [name, t] : copies) {
    MT_CHECK(t.defined() && (t.dtype() == DType::kBF16 || t.dtype() == DType::kF16),
             "AdamW.set_param_copies: '{}' must be a bf16 or f16 tensor, got {}", name,
             t.defined() ? t.desc() : std::string("undefined"));
    copies_.emplace(name, t);
  }
}

void AdamW::finish_step(bool apply) {
  std::vector<Queued> q;
  q.swap(queued_);
  grad_scale_ = 1;
  if (!apply) return;
  // One call per device in queue order (a step's parameters normally share one device).
  for (size_t i = 0; i < q.size();) {
    const Device dev = q[i].p.device();
    AdamWMultiParams batch;
    size_t j = i;
    for (; j < q.size() && q[j].p.device() == dev; ++j) batch.items.push_back(q[j].params);
    MT_KERNEL(dev.type, adamw_multi, batch);
    for (; i < j; ++i) {
      bump_version(q[i].p);
      bump_version(q[i].m);
      bump_version(q[i].v);
      if (q[i].copy.defined()) bump_version(q[i].copy);
    }
  }
}

}  // namespace mt
