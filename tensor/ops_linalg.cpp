// Matrix product front ends. matmul follows numpy: 1-D operands get a unit dim inserted (and
// removed from the result), batch dims broadcast, and transposed or strided operands go to the
// GEMM kernel as they are; only a matrix with unit stride in neither of its last two dims is made
// contiguous. 16-bit floats compute in f32 and round once at the end. The differentiable core is
// `matmul_nd` on operands of rank >= 2; 1-D handling and dtype casts are views and casts that
// autograd already knows.
#include "tensor/ops_linalg.h"

#include <algorithm>

#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/grad_destination.h"
#include "tensor/ops_pointwise.h"
#include "tensor/ops_reduce.h"
#include "tensor/pointwise_util.h"

namespace mt {
namespace {

bool is_16bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// The dtype a product of a and b computes in: f32 or f64 on the CPU (16-bit inputs are widened);
// on CUDA 16-bit inputs go to cuBLASLt as they are (f32 accumulation). Throws for integers.
DType compute_dtype(const Tensor& a, const Tensor& b, const char* op) {
  MT_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()),
           "{}: integer tensors are not supported (floating types only), got {} and {}", op, a.desc(), b.desc());
  DType t = promote(a.dtype(), b.dtype());
  return is_16bit(t) && !a.device().is_cuda() ? DType::kF32 : t;
}

// True when the matrices of v (its last two dims) can be mapped by the GEMM kernel as they are:
// unit stride along one dim and a leading dimension that does not overlap rows/columns.
bool gemm_mappable(const KView& v) {
  const int n = v.ndim();
  const int64_t rows = v.sizes[n - 2], cols = v.sizes[n - 1];
  const int64_t rs = v.strides[n - 2], cs = v.strides[n - 1];
  bool row_major = (cols <= 1 || cs == 1) && (rows <= 1 || rs >= std::max<int64_t>(cols, 1));
  bool col_major = (rows <= 1 || rs == 1) && (cols <= 1 || cs >= std::max<int64_t>(rows, 1));
  return row_major || col_major;
}

// a's kernel view broadcast to `shape` (batch dims of the product), made mappable if needed.
KView gemm_view(Tensor& t, Shape shape) {  // shape by value: it may be t's own
  KView v = broadcast_view(t, shape);
  if (!gemm_mappable(v)) {
    t = t.contiguous();
    v = broadcast_view(t, shape);
  }
  return v;
}

Shape batch_of(const Tensor& t) {
  Shape s = t.shape();
  s.resize(s.size() - 2);
  return s;
}

// The product of t's dims before its last: its rows as a 2-D matrix. Not a -1 in a view, which
// an empty last dim leaves ambiguous ([2, 3, 0] as [-1, 0]: an uneven split's K or N of 0).
int64_t rows_of(const Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return rows;
}

// out[..., M, N] = a[..., M, K] @ b[..., K, N] for ranks >= 2 and one floating dtype (f32/f64).
// No autograd here. `op` names the user-facing op in messages.
Tensor gemm(Tensor a, Tensor b, const char* op) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  Shape batch = broadcast_shapes(batch_of(a), batch_of(b), op);
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  // [..., M, K] @ [K, N] with a dense a: one big GEMM over all rows instead of a batch of them.
  if (b.dim() == 2 && a.dim() > 2 && a.is_contiguous()) {
    return gemm(a.view({rows_of(a), k}), b, op).view(out_shape);
  }
  Tensor out = empty(out_shape, a.options());
  if (out.numel() == 0) return out;
  Shape sa = batch, sb = batch;
  sa.push_back(m);
  sa.push_back(k);
  sb.push_back(k);
  sb.push_back(n);
  MatmulParams p;
  p.a = gemm_view(a, sa);
  p.b = gemm_view(b, sb);
  p.out = out.view_info();
  MT_KERNEL(a.device().type, matmul, p);
  return out;
}

Tensor mT(const Tensor& t) { return t.transpose(-1, -2); }

// out = a @ b for 2-D operands of out's dtype, written into `out` (contiguous): a weight's
// gradient into its grad_destination. No autograd.
void gemm_into(Tensor a, Tensor b, const Tensor& out) {
  if (out.numel() == 0) return;
  if (a.size(1) == 0) {
    Tensor o = out;
    o.zero_();
    return;
  }
  MatmulParams p;
  p.a = gemm_view(a, a.shape());
  p.b = gemm_view(b, b.shape());
  p.out = out.view_info();
  MT_KERNEL(out.device().type, matmul, p);
}

// out[j] = sum over i of g[i, j] for a 2-D g, written into `out` ([cols], contiguous, g's dtype,
// f32 or f64): a bias's gradient into its grad_destination, with the bits of sum(g, {0}) (the same
// reduce kernel and order). No autograd.
void column_sums_into(const Tensor& g, const Tensor& out) {
  ReduceParams p;
  p.op = ReduceOp::kSum;
  p.in = g.view_info();
  p.in.sizes = {g.size(1), g.size(0)};
  p.in.strides = {g.strides()[1], g.strides()[0]};
  p.out = out.view_info();
  p.n_reduce = 1;
  if (out.numel() > 0) MT_KERNEL(out.device().type, reduce, p);
}

// Differentiable product of operands with rank >= 2 that share a dtype (f32 or f64).
Tensor matmul_nd(const Tensor& a, const Tensor& b, const char* op) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = gemm(a, b, op);
  }
  if (!needs_grad(a, b)) return out;
  record("MatmulBackward", {a, b}, out, [a, b](const auto& g) {
    Tensor ga, gb;
    if (a.requires_grad()) ga = sum_to(matmul(g[0], mT(b)), a.shape());
    if (b.requires_grad()) {
      if (b.dim() == 2 && a.dim() > 2) {  // shared weight: one GEMM over all batch rows
        const int64_t k = a.size(-1), n = b.size(-1);
        gb = matmul(mT(a.reshape({rows_of(a), k})), g[0].reshape({rows_of(g[0]), n}));
      } else {
        gb = sum_to(matmul(mT(a), g[0]), b.shape());
      }
    }
    return std::vector<Tensor>{ga, gb};
  });
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a0, const Tensor& b0) {
  if (any_dist(a0, b0)) [[unlikely]]
    return dist_dispatch1({"matmul", DistRule::kMatmul}, {a0, b0}, MT_DIST_LOCAL(matmul(l[0], l[1])));
  check_same_device(a0, b0, "matmul");
  MT_CHECK(a0.dim() >= 1 && b0.dim() >= 1, "matmul: both operands need at least 1 dim, got {} and {}",
           a0.desc(), b0.desc());
  const int64_t ka = a0.size(-1), kb = b0.dim() == 1 ? b0.size(0) : b0.size(-2);
  MT_CHECK(ka == kb, "matmul: inner dims do not match: a {} @ b {} ({} vs {})", a0.shape(), b0.shape(), ka, kb);
  for (int i = 3; i <= std::min(a0.dim(), b0.dim()); ++i) {
    const int64_t da = a0.size(-i), db = b0.size(-i);
    MT_CHECK(da == db || da == 1 || db == 1, "matmul: batch dims do not broadcast: a {} @ b {}", a0.shape(),
             b0.shape());
  }
  const DType ct = compute_dtype(a0, b0, "matmul");
  const DType result = promote(a0.dtype(), b0.dtype());
  Tensor a = a0.to(ct), b = b0.to(ct);
  const bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  if (a_vec) a = a.unsqueeze(0);
  if (b_vec) b = b.unsqueeze(-1);
  Tensor out = matmul_nd(a, b, "matmul");
  if (b_vec) out = out.squeeze(-1);
  if (a_vec) out = out.squeeze(-1 - (b_vec ? 0 : 1));
  return out.to(result);
}

Tensor bmm(const Tensor& a0, const Tensor& b0) {
  if (any_dist(a0, b0)) [[unlikely]] {
    DistOp d{"bmm", DistRule::kMatmul};
    d.args[1] = 1;  // batch dims do not broadcast (matmul's size-1 batch dims do)
    return dist_dispatch1(d, {a0, b0}, MT_DIST_LOCAL(bmm(l[0], l[1])));
  }
  check_same_device(a0, b0, "bmm");
  MT_CHECK(a0.dim() == 3 && b0.dim() == 3, "bmm: expected 3-D operands [B, M, K] and [B, K, N], got {} and {}",
           a0.shape(), b0.shape());
  MT_CHECK(a0.size(0) == b0.size(0), "bmm: batch sizes differ: a {} and b {}", a0.shape(), b0.shape());
  MT_CHECK(a0.size(2) == b0.size(1), "bmm: inner dims do not match: a {} @ b {} ({} vs {})", a0.shape(),
           b0.shape(), a0.size(2), b0.size(1));
  const DType ct = compute_dtype(a0, b0, "bmm");
  const DType result = promote(a0.dtype(), b0.dtype());
  return matmul_nd(a0.to(ct), b0.to(ct), "bmm").to(result);
}

Tensor linear(const Tensor& x0, const Tensor& w0, const Tensor& bias0) {
  if (any_dist(x0, w0, bias0)) [[unlikely]] {
    // x @ w^T (+ bias): the matmul rule with a transposed right operand (args[0] = 1); where the
    // product is Partial the dispatcher gives the bias to one rank only (zeros elsewhere).
    DistOp d{"linear", DistRule::kMatmul};
    d.args[0] = 1;
    if (!bias0.defined()) return dist_dispatch1(d, {x0, w0}, MT_DIST_LOCAL(linear(l[0], l[1])));
    return dist_dispatch1(d, {x0, w0, bias0}, MT_DIST_LOCAL(linear(l[0], l[1], l[2])));
  }
  check_same_device(x0, w0, "linear");
  MT_CHECK(w0.dim() == 2, "linear: weight must be 2-D [out, in], got {} (x {})", w0.shape(), x0.shape());
  MT_CHECK(x0.dim() >= 1 && x0.size(-1) == w0.size(1),
           "linear: input features do not match: x {} with weight {} (expected last dim {})", x0.shape(),
           w0.shape(), w0.size(1));
  const int64_t in_f = w0.size(1), out_f = w0.size(0);
  const bool has_bias = bias0.defined();
  DType result = promote(x0.dtype(), w0.dtype());
  if (has_bias) {
    check_same_device(x0, bias0, "linear");
    MT_CHECK(bias0.dim() == 1 && bias0.size(0) == out_f, "linear: bias must be [{}], got {} (weight {})", out_f,
             bias0.shape(), w0.shape());
    result = promote(result, bias0.dtype());
  }
  MT_CHECK(is_floating(x0.dtype()) && is_floating(w0.dtype()) && (!has_bias || is_floating(bias0.dtype())),
           "linear: integer tensors are not supported (floating types only), got x {}, weight {}, bias {}",
           x0.desc(), w0.desc(), bias0);
  const DType ct = is_16bit(result) && !x0.device().is_cuda() ? DType::kF32 : result;
  // A 16-bit weight on the CPU stays as it is: the GEMM kernel widens it block by block (the same
  // bits as multiplying its f32 copy), so no f32 copy of the weight is made or kept for backward.
  const bool widen_w = ct == DType::kF32 && is_16bit(w0.dtype()) && !w0.device().is_cuda();
  Tensor x = x0.to(ct), w = widen_w ? w0 : w0.to(ct), bias = has_bias ? bias0.to(ct) : Tensor();
  // [rows, in] (rows_of: in == 0, an empty tensor-parallel slice of the inner dim, is a shape too).
  Tensor x2 = x.dim() == 2 ? x : x.reshape({rows_of(x), in_f});
  Tensor out;
  {
    NoGradGuard no_grad;
    out = empty({x2.size(0), out_f}, x2.options());
    MatmulParams p;
    if (has_bias && out.numel() > 0) {  // out = bias, then out += x2 @ w^T in the GEMM itself
      CopyParams cp{broadcast_view(bias, out.shape()), out.view_info()};
      MT_KERNEL(out.device().type, copy, cp);
      p.beta = 1;
    }
    Tensor xm = x2, wt = mT(w);
    p.a = gemm_view(xm, xm.shape());
    p.b = gemm_view(wt, wt.shape());
    p.out = out.view_info();
    if (out.numel() > 0) MT_KERNEL(out.device().type, matmul, p);
  }
  if (needs_grad({&x2, &w, &bias})) {
    const bool bias_grad = has_bias && bias.requires_grad();
    record("LinearBackward", {x2, w, bias}, out, [x2, w, bias, bias_grad, widen_w](const auto& g) {
      Tensor gx;
      if (x2.requires_grad()) {
        if (widen_w && !GradMode::enabled()) {  // g @ w with w widened in the kernel
          gx = empty({g[0].size(0), w.size(1)}, g[0].options());
          gemm_into(g[0], w, gx);
        } else {  // differentiable (double backward), or an f32/f64 weight
          gx = matmul(g[0], widen_w ? w.to(g[0].dtype()) : w);
        }
      }
      Tensor gw;
      if (w.requires_grad()) {
        gw = grad_destination(w);  // zero-copy FSDP gradients: straight into the unit's buffer
        if (gw.defined() && widen_w)  // a 16-bit weight on the CPU: the f32 product rounded into it
          gw.copy_(matmul(mT(g[0]), x2));
        else if (gw.defined())
          gemm_into(mT(g[0]).to(gw.dtype()), x2.to(gw.dtype()), gw);
        else
          gw = widen_w ? matmul(mT(g[0]), x2).to(w.dtype()) : matmul(mT(g[0]), x2);
      }
      Tensor gb;
      if (bias_grad) {
        gb = grad_destination(bias);  // zero-copy FSDP gradients, as for the weight
        const DType dt = g[0].dtype();
        if (gb.defined() && gb.dtype() == dt && (dt == DType::kF32 || dt == DType::kF64) && g[0].dim() == 2)
          column_sums_into(g[0], gb);
        else if (gb.defined())
          gb.copy_(sum(g[0], {0}));
        else
          gb = sum(g[0], {0});
      }
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = out_f;
  return out.reshape(out_shape).to(result);
}

}  // namespace mt
