// Global-norm gradient clipping. Sums of squares are accumulated in double over fixed-size blocks
// (the block partials are added in order: the sum_sq kernel family), so the result does not
// depend on the thread count.
#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/registry.h"
#include "mesh/dtensor.h"
#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt {

namespace {

// acc[0] += sum of squares of the plain (non-distributed) floating tensor t, on t's device.
void add_sum_sq(const Tensor& t, const Tensor& acc) {
  MT_CHECK(is_floating(t.dtype()) && !t.is_meta(), "clip_grad_norm: gradient {} is not a floating tensor with storage",
           t.desc());
  const Tensor x = t.contiguous();
  SumSqParams p;
  p.x = x.view_info();
  p.out = acc.view_info();
  MT_KERNEL(x.device().type, sum_sq, p);
}

Tensor sum_sq_acc(const Device& d) { return zeros({}, TensorOptions(DType::kF64).with_device(d)); }

}  // namespace

double l2_norm_sq(const Tensor& t) {
  if (t.numel() == 0) return 0;
  if (t.is_distributed()) {
    // Squares summed by dispatch (Partial over split dims), then all-reduced by full_tensor.
    MT_CHECK(!t.dist_spec()->has_partial(), "clip_grad_norm: gradient {} is Partial: reduce gradients first", t.desc());
    Tensor x = t.to(DType::kF64);
    return full_tensor(sum(mul(x, x))).item();
  }
  Tensor acc = sum_sq_acc(t.device());
  add_sum_sq(t, acc);
  return acc.item();
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  double total_sq = 0;
  // Plain gradients add their squares into one f64 accumulator per device, in parameter order
  // (the sum_sq kernel family): one host sync per device at the end.
  std::vector<std::pair<Device, Tensor>> acc;
  for (const Tensor& p : params) {
    MT_CHECK(p.defined(), "clip_grad_norm: parameter {} is an undefined tensor", grads.size());
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!g.is_distributed() && g.numel() > 0) {
      auto it = std::find_if(acc.begin(), acc.end(), [&](const auto& a) { return a.first == g.device(); });
      if (it == acc.end()) it = acc.insert(acc.end(), {g.device(), sum_sq_acc(g.device())});
      add_sum_sq(g, it->second);
    } else {
      total_sq += l2_norm_sq(g);
    }
    grads.push_back(g);
  }
  for (const auto& a : acc) total_sq += a.second.item();
  const double norm = std::sqrt(total_sq);
  if (max_norm <= 0 || !std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (Tensor& g : grads) g.mul_(coef);
  return norm;
}

double clip_grad_norm(const NamedTensors& params, double max_norm) {
  std::vector<Tensor> ts;
  ts.reserve(params.size());
  for (const auto& [name, t] : params) {
    MT_CHECK(t.defined(), "clip_grad_norm: parameter '{}' is an undefined tensor", name);
    ts.push_back(t);
  }
  return clip_grad_norm(ts, max_norm);
}

}  // namespace mt
