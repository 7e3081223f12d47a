// Scaled dot-product attention front end: validates the [B, H, T, D] layouts and the grouped
// kv heads, and runs the fused forward, which saves only the per-row
// log-sum-exp [B, Hq, T] (f32; f64 for f64 inputs). The CPU kernels read any strides and dtype
// (tiles copied to f32 scratch): operands go in place, with no cast or transposing copy. 16-bit
// inputs stay 16-bit on CUDA where it has a tensor-core kernel for them
// (attention_tensor_core_ok), read in place when their strides allow it (else a contiguous copy);
// elsewhere on CUDA they are cast to f32 and the result cast back. In place, the output and the
// gradients are written in [B, T, H, D] memory (the layout models transpose back into
// [B, T, H * D] for free). The backward is the fused attention_bwd kernel (no double backward).
#include <cmath>
#include <limits>

#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/ops_nn.h"
#include "tensor/ops.h"
#include "tensor/pointwise_util.h"

namespace mt {
namespace {

// An operand of the tensor-core kernel: read in place when its layout qualifies (unit stride in D,
// 16-byte aligned rows: contiguous [B, H, T, D], or [B, T, H, D] memory seen through
// transpose(1, 2) as models make it), else a fresh contiguous copy.
Tensor tc_operand(const Tensor& t) {
  if (t.numel() == 0 || attention_tc_layout_ok(t.view_info())) return t;
  Tensor c = t.contiguous();
  return attention_tc_layout_ok(c.view_info()) ? c : c.clone();
}

// [B, H, T, D] with [B, T, H, D] memory: the layout models transpose back into [B, T, H * D]
// for free.
Tensor empty_bthd(const Shape& s, const TensorOptions& opts) {
  return empty(Shape{s[0], s[2], s[1], s[3]}, opts).transpose(1, 2);
}

// A gradient laid out like its input (so that the input's transpose / view backward is free).
Tensor empty_grad_like(const Tensor& x) {
  const bool bthd = !x.is_contiguous() && x.transpose(1, 2).is_contiguous();
  return bthd ? empty_bthd(x.shape(), x.options()) : empty(x.shape(), x.options());
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q0, const Tensor& k0, const Tensor& v0, Causal causal,
                                    double scale) {
  const char* op = "scaled_dot_product_attention";
  if (any_dist(q0, k0, v0)) [[unlikely]] {
    DistOp d{op, DistRule::kAttention};
    d.args[0] = causal == Causal::kYes;
    AttentionArgs a{scale};
    d.extra = &a;  // read by context-parallel attention (mesh/ring_attention.h)
    return dist_dispatch1(d, {q0, k0, v0}, MT_DIST_LOCAL(scaled_dot_product_attention(l[0], l[1], l[2], causal, scale)));
  }
  check_same_device(q0, k0, op);
  check_same_device(q0, v0, op);
  MT_CHECK(q0.dim() == 4 && k0.dim() == 4 && v0.dim() == 4,
           "{}: expected 4-D q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv]; got q {}, k {}, v {}", op,
           q0.shape(), k0.shape(), v0.shape());
  MT_CHECK(is_floating(q0.dtype()) && q0.dtype() == k0.dtype() && q0.dtype() == v0.dtype(),
           "{}: q, k, v must share one floating dtype; got q {}, k {}, v {}", op, q0.desc(), k0.desc(), v0.desc());
  const Shape &qs = q0.shape(), &ks = k0.shape(), &vs = v0.shape();
  MT_CHECK(qs[0] == ks[0] && qs[0] == vs[0] && ks[1] == vs[1] && ks[2] == vs[2] && qs[3] == ks[3],
           "{}: shapes disagree: q {} [B, Hq, T, D], k {} [B, Hkv, S, D], v {} [B, Hkv, S, Dv]", op, qs, ks, vs);
  MT_CHECK(ks[1] > 0 && qs[1] % ks[1] == 0,
           "{}: query heads Hq = {} must be a multiple of kv heads Hkv = {} (q {}, k {}, v {})", op, qs[1], ks[1],
           qs, ks, vs);
  MT_CHECK(qs[3] > 0, "{}: head dim D must be positive (q {}, k {}, v {})", op, qs, ks, vs);
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(qs[3]));

  const DType in_dtype = q0.dtype();
  const DeviceType dev = q0.device().type;
  const bool native16 = dev == DeviceType::kCUDA && attention_tensor_core_ok(in_dtype, qs[3], vs[3]);
  // Meta (the estimate's dry run) takes the in-place path of the CPU and of 16-bit tensor-core
  // attention, what a run allocates on the CPU and in a bf16 GPU run. It made the f32 copies of
  // q, k, v and out until 2026-12-07, which no CPU step does: llama-tiny's predicted peak was 2.8%
  // over the measured one at seq 64 (an f32 GPU run does make them; its estimate is that much under).
  const bool in_place = native16 || dev == DeviceType::kCPU || dev == DeviceType::kMeta;
  Tensor q, k, v, out, lse;
  if (in_place) {  // input dtype; out in [B, T, H, D] memory, lse f32 (f64 for f64)
    q = native16 ? tc_operand(q0) : q0;
    k = native16 ? tc_operand(k0) : k0;
    v = native16 ? tc_operand(v0) : v0;
    const TensorOptions opts = q.options().with_grad(false);
    out = empty_bthd(Shape{qs[0], qs[1], qs[2], vs[3]}, opts);
    lse = empty(Shape{qs[0], qs[1], qs[2]}, opts.with_dtype(in_dtype == DType::kF64 ? DType::kF64 : DType::kF32));
  } else {  // f32 (f64 for f64), contiguous
    const DType kdt = in_dtype == DType::kF64 ? DType::kF64 : DType::kF32;
    q = q0.to(kdt).contiguous();
    k = k0.to(kdt).contiguous();
    v = v0.to(kdt).contiguous();
    const TensorOptions opts = q.options().with_grad(false);
    out = empty(Shape{qs[0], qs[1], qs[2], vs[3]}, opts);
    lse = empty(Shape{qs[0], qs[1], qs[2]}, opts);
  }
  const bool is_causal = causal == Causal::kYes;
  AttentionParams p;
  p.q = q.view_info();
  p.k = k.view_info();
  p.v = v.view_info();
  p.out = out.view_info();
  p.lse = lse.view_info();
  p.scale = scale;
  p.causal = is_causal;
  if (out.numel() > 0) MT_KERNEL(q.device().type, attention, p);

  if (needs_grad({&q, &k, &v})) {
    Tensor qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach();
    record("ScaledDotProductAttentionBackward", {q, k, v}, out,
           [qd, kd, vd, od, lse, scale, is_causal, native16, in_place](const auto& g) {
             Tensor go = g[0].to(od.dtype());
             if (native16)
               go = tc_operand(go);
             else if (!in_place)
               go = go.contiguous();
             Tensor gq = in_place ? empty_grad_like(qd) : empty(qd.shape(), qd.options()),
                    gk = in_place ? empty_grad_like(kd) : empty(kd.shape(), kd.options()),
                    gv = in_place ? empty_grad_like(vd) : empty(vd.shape(), vd.options());
             AttentionBwdParams b;
             b.q = qd.view_info();
             b.k = kd.view_info();
             b.v = vd.view_info();
             b.out = od.view_info();
             b.lse = lse.view_info();
             b.gout = go.view_info();
             b.gq = gq.view_info();
             b.gk = gk.view_info();
             b.gv = gv.view_info();
             b.scale = scale;
             b.causal = is_causal;
             if (gq.numel() + gk.numel() + gv.numel() > 0) MT_KERNEL(qd.device().type, attention_bwd, b);
             return std::vector<Tensor>{gq, gk, gv};
           });
  }
  return out.to(in_dtype);
}

}  // namespace mt

namespace mt {

Tensor eager_attention_dropout(const Tensor& q, Tensor k, Tensor v, double scale, double dropout_p, Generator* gen) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1);
  if (Hkv != Hq) {  // repeat_kv
    const int64_t rep = Hq / Hkv;
    k = k.unsqueeze(2).expand(Shape{B, Hkv, rep, T, D}).reshape(Shape{B, Hq, T, D});
    v = v.unsqueeze(2).expand(Shape{B, Hkv, rep, T, v.size(3)}).reshape(Shape{B, Hq, T, v.size(3)});
  }
  Tensor scores = mul(matmul(q, k.transpose(2, 3)), scale);
  std::vector<uint8_t> m(static_cast<size_t>(T * T));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) m[static_cast<size_t>(i * T + j)] = j > i ? 1 : 0;
  Tensor mask = from_vector<uint8_t>(m, Shape{T, T}).to(DType::kBool);
  if (mask.device() != q.device()) mask = mask.to(q.device());
  scores = masked_fill(scores, mask, -std::numeric_limits<double>::infinity());
  const DType sdt = q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor probs = softmax(scores.to(sdt), -1).to(q.dtype());
  probs = dropout(probs, dropout_p, gen);
  return matmul(probs, v);
}

Tensor attention_dropout(const Tensor& q, const Tensor& k, const Tensor& v, double scale, double p, Generator* gen) {
  if (any_dist(q, k, v)) [[unlikely]] {
    DistOp d{"attention_dropout", DistRule::kAttention};
    d.args[0] = 1;  // causal
    d.args[1] = 1;  // with dropout: the composite runs it (ring or eager_attention_dropout)
    AttentionArgs a{scale, p, gen};
    d.extra = &a;
    return dist_dispatch1(d, {q, k, v}, MT_DIST_LOCAL(eager_attention_dropout(l[0], l[1], l[2], scale, p, gen)));
  }
  return eager_attention_dropout(q, k, v, scale, p, gen);
}

}  // namespace mt
