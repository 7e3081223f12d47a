// SGD update: a fused host loop for contiguous f32/f64 CPU tensors, tensor ops otherwise.
#include "optim/sgd.h"

#include <cmath>

#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt {

namespace {

std::vector<std::string> sgd_state_kinds(const SGDOptions& o) {
  if (o.momentum != 0) return {"momentum_buffer"};
  return {};
}

const SGDOptions& checked(const SGDOptions& o) {
  MT_CHECK(std::isfinite(o.momentum) && o.momentum >= 0, "SGD: momentum {} must be finite and >= 0",
           o.momentum);
  MT_CHECK(std::isfinite(o.dampening), "SGD: dampening {} must be finite", o.dampening);
  MT_CHECK(o.nesterov == Nesterov::kNo || (o.momentum > 0 && o.dampening == 0),
           "SGD: Nesterov momentum needs momentum > 0 and dampening 0 (got momentum {}, dampening {})",
           o.momentum, o.dampening);
  return o;
}

// One pass over the elements; `first` is the parameter's first update, when the momentum buffer
// starts as the (decayed) gradient itself, as in PyTorch.
template <class T>
void sgd_host(T* p, const T* g, T* buf, int64_t n, const SGDOptions& o, double lr, double wd, bool first) {
  const T tlr = static_cast<T>(lr), twd = static_cast<T>(wd), mom = static_cast<T>(o.momentum);
  const T damp = static_cast<T>(1 - o.dampening);
  const bool nesterov = o.nesterov == Nesterov::kYes;
#pragma omp parallel for if (n > 32768) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i];
    if (wd != 0) d += twd * p[i];
    if (buf) {
      T b = first ? d : mom * buf[i] + damp * d;
      buf[i] = b;
      d = nesterov ? d + mom * b : b;
    }
    p[i] -= tlr * d;
  }
}

}  // namespace

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& opts)
    : Optimizer(std::move(groups), opts.lr, sgd_state_kinds(checked(opts)), "SGD"), opts_(opts) {}

void SGD::update(Slot& slot, const Tensor& grad, double lr, double weight_decay) {
  Tensor& p = slot.param;
  Tensor buf = slot.state.empty() ? Tensor() : slot.state[0];
  const bool first = slot.steps == 1;
  std::vector<Tensor> others{grad};
  if (buf.defined()) others.push_back(buf);
  if (detail::fused_host_ok(p, others)) {
    if (p.dtype() == DType::kF64)
      sgd_host<double>(p.data<double>(), grad.data<double>(), buf.defined() ? buf.data<double>() : nullptr,
                       p.numel(), opts_, lr, weight_decay, first);
    else
      sgd_host<float>(p.data<float>(), grad.data<float>(), buf.defined() ? buf.data<float>() : nullptr,
                      p.numel(), opts_, lr, weight_decay, first);
    bump_version(p);
    if (buf.defined()) bump_version(buf);
    return;
  }
  Tensor d = grad;
  if (weight_decay != 0) d = add(grad, mul(p, weight_decay));
  if (buf.defined()) {
    if (first) {
      buf.copy_(d);
    } else {
      buf.mul_(opts_.momentum);
      buf.add_(d, 1 - opts_.dampening);
    }
    d = opts_.nesterov == Nesterov::kYes ? add(d, mul(buf, opts_.momentum)) : buf;
  }
  p.add_(d, -lr);
}

}  // namespace mt
