// Global-norm gradient clipping. Sums of squares are accumulated in double over fixed-size blocks
// (the block partials are added in order), so the result does not depend on the thread count.
#include "optim/clip.h"

#include <cmath>

#include "mesh/dtensor.h"
#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt {

namespace {

constexpr int64_t kBlock = 8192;

template <class T>
double sum_sq_host(const T* x, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for if (n > 4 * kBlock) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    double s = 0;
    for (int64_t i = b * kBlock; i < end; ++i) {
      const double v = static_cast<double>(static_cast<compute_t<T>>(x[i]));
      s += v * v;
    }
    partial[static_cast<size_t>(b)] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

double l2_norm_sq(const Tensor& t) {
  if (t.numel() == 0) return 0;
  if (t.is_distributed()) {
    // Squares summed by dispatch (Partial over split dims), then all-reduced by full_tensor.
    MT_CHECK(!t.dist_spec()->has_partial(), "clip_grad_norm: gradient {} is Partial: reduce gradients first", t.desc());
    Tensor x = t.to(DType::kF64);
    return full_tensor(sum(mul(x, x))).item();
  }
  MT_CHECK(is_floating(t.dtype()) && !t.is_meta(), "clip_grad_norm: gradient {} is not a floating tensor with storage",
           t.desc());
  if (t.device().is_cpu() && t.is_contiguous()) {
    double s = 0;
    MT_DISPATCH_FLOAT(t.dtype(), "clip_grad_norm", s = sum_sq_host<scalar_t>(t.data<scalar_t>(), t.numel()));
    return s;
  }
  Tensor x = t.to(DType::kF64);
  return sum(mul(x, x)).item();
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  double total_sq = 0;
  Tensor device_sq;  // plain CUDA gradients: summed on the device in order, one host sync at the end
  for (const Tensor& p : params) {
    MT_CHECK(p.defined(), "clip_grad_norm: parameter {} is an undefined tensor", grads.size());
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.device().is_cuda() && !g.is_distributed() && g.numel() > 0) {
      Tensor x = g.to(DType::kF64);
      Tensor sq = sum(mul(x, x));
      device_sq = device_sq.defined() ? add(device_sq, sq) : sq;
    } else {
      total_sq += l2_norm_sq(g);
    }
    grads.push_back(g);
  }
  if (device_sq.defined()) total_sq += device_sq.item();
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
