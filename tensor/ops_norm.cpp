// Normalization and softmax front ends. The kernels work on the last dim of contiguous rows;
// softmax over another dim moves that dim last (transpose + contiguous) and back, as views that
// autograd already differentiates. rms_norm/layer_norm save rstd (and mean) from the forward for
// their fused backward kernels; softmax backward composes ops. weight/bias take x's dtype.
#include <vector>

#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/grad_destination.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_pointwise.h"
#include "tensor/ops_reduce.h"

namespace mt {
namespace {

enum class SoftmaxKind { kPlain, kLog };

// x viewed as [rows, H] for a kernel (x contiguous).
KView rows_view(const Tensor& x) {
  KView v = x.view_info();
  int64_t h = x.dim() ? x.size(-1) : 1;
  int64_t rows = 1;
  for (int d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  v.sizes = Shape{rows, h};
  v.strides = Shape{h, 1};
  return v;
}

KView opt_view(const Tensor& t) { return t.defined() ? t.view_info() : KView{}; }

// Statistics saved per row: f64 for f64 data, f32 otherwise.
DType stat_dtype(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

Shape leading_shape(const Tensor& x) {
  Shape s = x.shape();
  s.resize(s.size() - 1);
  return s;
}

// Softmax over the last dim of x.
Tensor softmax_last(const Tensor& x0, SoftmaxKind kind) {
  Tensor x = x0.contiguous();
  Tensor out = empty(x.shape(), x.options());
  if (out.numel() > 0) {
    SoftmaxParams p{rows_view(x), rows_view(out), kind == SoftmaxKind::kLog};
    MT_KERNEL(x.device().type, softmax, p);
  }
  if (!needs_grad(x)) return out;
  Tensor y = out.detach();
  if (kind == SoftmaxKind::kPlain) {
    record("SoftmaxBackward", {x}, out, [y](const auto& g) {
      return std::vector<Tensor>{mul(y, sub(g[0], sum(mul(g[0], y), {-1}, KeepDim::kYes)))};
    });
  } else {
    record("LogSoftmaxBackward", {x}, out, [y](const auto& g) {
      return std::vector<Tensor>{sub(g[0], mul(exp(y), sum(g[0], {-1}, KeepDim::kYes)))};
    });
  }
  return out;
}

Tensor softmax_any(const Tensor& x, int64_t dim, SoftmaxKind kind) {
  const char* name = kind == SoftmaxKind::kLog ? "log_softmax" : "softmax";
  MT_CHECK(x.defined(), "{}: undefined input", name);
  if (x.is_distributed()) [[unlikely]] {
    DistOp d{name, DistRule::kSlice};  // the softmax dim must not be split
    d.args[0] = x.dim() == 0 ? 0 : wrap_dim(dim, x.dim(), name);
    return dist_dispatch1(d, {x}, MT_DIST_LOCAL(softmax_any(l[0], dim, kind)));
  }
  MT_CHECK(is_floating(x.dtype()), "{}: expected a floating tensor, got {}", name, x.desc());
  if (x.dim() == 0) {
    wrap_dim(dim, 1, name);
    return softmax_last(x.reshape({1}), kind).reshape({});
  }
  const int d = wrap_dim(dim, x.dim(), name);
  const int last = x.dim() - 1;
  if (d == last) return softmax_last(x, kind);
  return softmax_last(x.transpose(d, last), kind).transpose(d, last);
}

// Checks that an optional per-feature parameter is [H] and brings it to x's dtype.
Tensor feature_param(const Tensor& p, const Tensor& x, const char* op, const char* what) {
  if (!p.defined()) return p;
  MT_CHECK(p.device() == x.device(), "{}: {} {} and x {} are on different devices", op, what, p.desc(), x.desc());
  MT_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), "{}: {} must have shape [{}] (the last dim of x {}), got {}",
           op, what, x.size(-1), x.shape(), p.shape());
  MT_CHECK(is_floating(p.dtype()), "{}: {} must be floating, got {}", op, what, p.desc());
  return p.to(x.dtype()).contiguous();
}

void check_norm_input(const Tensor& x, const char* op) {
  MT_CHECK(x.defined(), "{}: undefined input", op);
  MT_CHECK(x.dim() >= 1, "{}: expected at least 1 dim, got {}", op, x.desc());
  MT_CHECK(is_floating(x.dtype()), "{}: expected a floating tensor, got {}", op, x.desc());
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_any(x, dim, SoftmaxKind::kPlain); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_any(x, dim, SoftmaxKind::kLog); }

Tensor rms_norm(const Tensor& x0, const Tensor& weight0, double eps) {
  check_norm_input(x0, "rms_norm");
  if (any_dist(x0, weight0)) [[unlikely]]
    return dist_dispatch1({"rms_norm", DistRule::kNorm}, {x0, weight0}, MT_DIST_LOCAL(rms_norm(l[0], l[1], eps)));
  Tensor w = feature_param(weight0, x0, "rms_norm", "weight");
  Tensor x = x0.contiguous();
  Tensor out = empty(x.shape(), x.options());
  Tensor rstd = empty(leading_shape(x), x.options().with_dtype(stat_dtype(x.dtype())));
  if (out.numel() > 0 || rstd.numel() > 0) {
    RmsNormParams p{rows_view(x), opt_view(w), rows_view(out), rstd.view_info(), eps};
    MT_KERNEL(x.device().type, rms_norm, p);
  }
  if (needs_grad(x, w)) {
    record("RmsNormBackward", {x, w}, out, [x, w, rstd](const auto& g) {
      Tensor gy = g[0].to(x.dtype()).contiguous();
      // The residual stream's gradient sum, fused: when the engine already holds a gradient of
      // x that nothing else refers to (the skip connection's), the kernel adds into it.
      Tensor gx = grad_accumulation_target(0);
      const bool accumulate = gx.defined() && gx.local_shape() == x.shape() && gx.dtype() == x.dtype() &&
                              gx.device() == x.device();
      if (!accumulate) gx = empty(x.shape(), x.options());
      Tensor gw;
      if (w.defined() && w.requires_grad()) {
        gw = grad_destination(w);  // zero-copy FSDP gradients: straight into the unit's buffer
        if (!gw.defined()) gw = empty(w.shape(), w.options());
      }
      if (gx.numel() > 0 || (gw.defined() && gw.numel() > 0)) {
        RmsNormBwdParams p{rows_view(gy), rows_view(x), opt_view(w), rstd.view_info(), rows_view(gx), opt_view(gw),
                           accumulate};
        MT_KERNEL(x.device().type, rms_norm_bwd, p);
      }
      return std::vector<Tensor>{gx, gw};
    });
  }
  return out;
}

Tensor layer_norm(const Tensor& x0, const Tensor& weight0, const Tensor& bias0, double eps) {
  check_norm_input(x0, "layer_norm");
  if (any_dist(x0, weight0, bias0)) [[unlikely]]
    return dist_dispatch1({"layer_norm", DistRule::kNorm}, {x0, weight0, bias0},
                          MT_DIST_LOCAL(layer_norm(l[0], l[1], l[2], eps)));
  Tensor w = feature_param(weight0, x0, "layer_norm", "weight");
  Tensor b = feature_param(bias0, x0, "layer_norm", "bias");
  Tensor x = x0.contiguous();
  Tensor out = empty(x.shape(), x.options());
  TensorOptions so = x.options().with_dtype(stat_dtype(x.dtype()));
  Tensor mean = empty(leading_shape(x), so), rstd = empty(leading_shape(x), so);
  if (out.numel() > 0 || rstd.numel() > 0) {
    LayerNormParams p{rows_view(x), opt_view(w), opt_view(b), rows_view(out), mean.view_info(), rstd.view_info(), eps};
    MT_KERNEL(x.device().type, layer_norm, p);
  }
  if (needs_grad({&x, &w, &b})) {
    record("LayerNormBackward", {x, w, b}, out, [x, w, b, mean, rstd](const auto& g) {
      Tensor gy = g[0].to(x.dtype()).contiguous();
      Tensor gx = empty(x.shape(), x.options());
      Tensor gw;
      if (w.defined() && w.requires_grad()) {
        gw = grad_destination(w);  // zero-copy FSDP gradients: straight into the unit's buffer
        if (!gw.defined()) gw = empty(w.shape(), w.options());
      }
      Tensor gb = b.defined() && b.requires_grad() ? empty(b.shape(), b.options()) : Tensor();
      LayerNormBwdParams p{rows_view(gy),     rows_view(x),     opt_view(w),  mean.view_info(),
                           rstd.view_info(),  rows_view(gx),    opt_view(gw), opt_view(gb)};
      if (gx.numel() > 0 || x.size(-1) > 0) MT_KERNEL(x.device().type, layer_norm_bwd, p);
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return out;
}

}  // namespace mt
