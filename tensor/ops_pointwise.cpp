// Pointwise front ends: check devices, promote dtypes, broadcast through zero strides (no
// intermediate views), allocate the output, record the backward formula, call the kernel.
#include "tensor/ops_pointwise.h"

#include <cmath>
#include <functional>

#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/pointwise_util.h"

namespace mt {

KView broadcast_view(const Tensor& t, const Shape& shape) {
  KView v = t.view_info();
  int lead = shape.size() - t.dim();
  v.sizes = shape;
  v.strides = Shape::filled(shape.size(), 0);
  for (int i = lead; i < shape.size(); ++i)
    v.strides[i] = t.shape()[i - lead] == 1 ? 0 : t.strides()[i - lead];
  return v;
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  MT_CHECK(a.defined() && b.defined(), "{}: undefined tensor argument", op);
  MT_CHECK(a.device() == b.device(), "{}: tensors on different devices: {} and {}", op, a.desc(), b.desc());
}

namespace {

const char* binary_name(BinaryOp op) {
  static const char* kNames[] = {"add", "sub", "mul", "div", "maximum", "minimum", "pow", "silu_mul",
                                 "silu_grad_mul", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
                                 "logical_or"};
  return kNames[static_cast<int>(op)];
}

bool is_comparison(BinaryOp op) { return op >= BinaryOp::kEq; }

const char* unary_name(UnaryOp op) {
  static const char* kNames[] = {"neg",  "exp",  "log",     "sqrt",   "rsqrt", "abs",  "relu",
                                 "gelu", "gelu", "silu",    "sigmoid", "tanh", "pow",  "clamp",
                                 "affine", "sign", "sin",   "cos",    "reciprocal", "gelu_grad",
                                 "gelu_grad", "silu_grad", "logical_not"};
  return kNames[static_cast<int>(op)];
}

// silu_mul's backward in one kernel, for plain (non-distributed) a, b and g of one shape, dtype
// and device, both gradients wanted and no graph to build (create_graph takes the unfused path).
bool silu_mul_bwd_fits(const Tensor& a, const Tensor& b, const Tensor& g) {
  return a.requires_grad() && b.requires_grad() && !GradMode::enabled() && !a.is_distributed() &&
         !b.is_distributed() && !g.is_distributed() && a.shape() == b.shape() && g.shape() == a.shape() &&
         a.dtype() == b.dtype() && g.dtype() == a.dtype() && a.device() == b.device() && g.device() == a.device();
}

std::vector<Tensor> silu_mul_bwd(const Tensor& a0, const Tensor& b0, const Tensor& g0) {
  const Tensor a = a0.contiguous(), b = b0.contiguous(), g = g0.contiguous();
  Tensor da = empty(a.shape(), a.options()), db = empty(a.shape(), a.options());
  SiluMulBwdParams p{a.view_info(), b.view_info(), g.view_info(), da.view_info(), db.view_info()};
  MT_KERNEL(a.device().type, silu_mul_bwd, p);
  return {da, db};
}

DistRule binary_rule(BinaryOp op) {
  if (op == BinaryOp::kAdd || op == BinaryOp::kSub) return DistRule::kLinear;
  if (op == BinaryOp::kMul || op == BinaryOp::kDiv) return DistRule::kMulLike;
  return DistRule::kElementwise;
}

// Runs the binary kernel on a and b (already of one dtype), output dtype `out_dtype`.
Tensor run_binary(BinaryOp op, const Tensor& a, const Tensor& b, DType out_dtype) {
  const char* name = binary_name(op);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, a.options().with_dtype(out_dtype));
  BinaryParams p{op, broadcast_view(a, shape), broadcast_view(b, shape), out.view_info()};
  MT_KERNEL(a.device().type, binary, p);
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a0, const Tensor& b0) {
  const char* name = binary_name(op);
  if (any_dist(a0, b0)) [[unlikely]] {
    DistOp d{name, binary_rule(op)};
    d.args[0] = op == BinaryOp::kDiv;
    return dist_dispatch1(d, {a0, b0}, MT_DIST_LOCAL(binary(op, l[0], l[1])));
  }
  check_same_device(a0, b0, name);
  DType t = promote(a0.dtype(), b0.dtype());
  if (op == BinaryOp::kDiv && is_integral(t)) t = DType::kF32;  // true division
  if (op == BinaryOp::kLogicalAnd || op == BinaryOp::kLogicalOr) t = promote(t, DType::kBool);
  Tensor a = a0.to(t), b = b0.to(t);
  Tensor out;
  {
    NoGradGuard no_grad;  // the formulas below are recorded on `out` directly
    out = run_binary(op, a, b, is_comparison(op) ? DType::kBool : t);
  }
  if (is_comparison(op) || !needs_grad(a, b)) return out;
  Shape sa = a.shape(), sb = b.shape();
  switch (op) {
    case BinaryOp::kAdd:
      record("AddBackward", {a, b}, out, [sa, sb](const auto& g) {
        return std::vector<Tensor>{sum_to(g[0], sa), sum_to(g[0], sb)};
      });
      break;
    case BinaryOp::kSub:
      record("SubBackward", {a, b}, out, [sa, sb](const auto& g) {
        return std::vector<Tensor>{sum_to(g[0], sa), sum_to(neg(g[0]), sb)};
      });
      break;
    case BinaryOp::kMul:
      record("MulBackward", {a, b}, out, [a, b](const auto& g) {
        return std::vector<Tensor>{a.requires_grad() ? sum_to(mul(g[0], b), a.shape()) : Tensor(),
                                   b.requires_grad() ? sum_to(mul(g[0], a), b.shape()) : Tensor()};
      });
      break;
    case BinaryOp::kDiv:
      record("DivBackward", {a, b}, out, [a, b](const auto& g) {
        Tensor ga = div(g[0], b);
        return std::vector<Tensor>{sum_to(ga, a.shape()),
                                   b.requires_grad() ? sum_to(neg(mul(ga, div(a, b))), b.shape()) : Tensor()};
      });
      break;
    case BinaryOp::kMaximum:
    case BinaryOp::kMinimum: {
      bool is_max = op == BinaryOp::kMaximum;
      record(is_max ? "MaximumBackward" : "MinimumBackward", {a, b}, out, [a, b, is_max](const auto& g) {
        // Ties split the gradient evenly, like PyTorch.
        Tensor wins = (is_max ? gt(a, b) : lt(a, b)).to(g[0].dtype());
        Tensor ties = eq(a, b).to(g[0].dtype());
        Tensor wa = add(wins, mul(ties, 0.5));
        return std::vector<Tensor>{sum_to(mul(g[0], wa), a.shape()),
                                   sum_to(mul(g[0], rsub(1.0, wa)), b.shape())};
      });
      break;
    }
    case BinaryOp::kSiluMul:
      // The gradients of mul(silu(a), b) with the same roundings (and bits): dA = silu'(a) (g b),
      // dB = silu(a) g: one silu_mul_bwd pass over plain same-shaped tensors (SwiGLU's usual
      // case), else two fused passes and one mul instead of four kernels.
      record("SiluMulBackward", {a, b}, out, [a, b](const auto& g) {
        if (silu_mul_bwd_fits(a, b, g[0])) return silu_mul_bwd(a, b, g[0]);
        return std::vector<Tensor>{
            a.requires_grad() ? sum_to(binary(BinaryOp::kSiluGradMul, a, mul(g[0], b)), a.shape()) : Tensor(),
            b.requires_grad() ? sum_to(binary(BinaryOp::kSiluMul, a, g[0]), b.shape()) : Tensor()};
      });
      break;
    case BinaryOp::kSiluGradMul:
      MT_FAIL("silu_mul: double backward is not supported (silu_grad_mul of {} and {} needs a gradient)", a.desc(),
              b.desc());
      break;
    case BinaryOp::kPow: {
      Tensor y = out.detach();
      record("PowBackward", {a, b}, out, [a, b, y](const auto& g) {
        Tensor ga = mul(g[0], mul(b, pow(a, sub(b, 1.0))));
        Tensor yy = GradMode::enabled() ? pow(a, b) : y;  // create_graph: y with history
        Tensor gb = b.requires_grad() ? mul(g[0], mul(yy, log(a))) : Tensor();
        return std::vector<Tensor>{sum_to(ga, a.shape()), gb.defined() ? sum_to(gb, b.shape()) : Tensor()};
      });
      break;
    }
    default:
      break;
  }
  return out;
}

Tensor run_unary(UnaryOp op, const Tensor& x, double alpha = 0, double beta = 0,
                 DType out_dtype = DType::kF32, bool same_dtype = true) {
  Tensor out = empty(x.shape(), x.options().with_dtype(same_dtype ? x.dtype() : out_dtype));
  UnaryParams p{op, x.view_info(), out.view_info(), alpha, beta};
  MT_KERNEL(x.device().type, unary, p);
  return out;
}

// Unary op on floating values (integral inputs become f32) with backward `back(x, y, g)`.
template <class Back>
Tensor float_unary(UnaryOp op, const char* name, const Tensor& x0, Back back, double alpha = 0) {
  MT_CHECK(x0.defined(), "{}: undefined tensor", name);
  if (x0.is_distributed()) [[unlikely]]
    return dist_dispatch1({unary_name(op), DistRule::kElementwise}, {x0},
                          MT_DIST_LOCAL(float_unary(op, name, l[0], back, alpha)));
  Tensor x = is_floating(x0.dtype()) ? x0 : x0.to(DType::kF32);
  Tensor out = run_unary(op, x, alpha);
  if (needs_grad(x)) {
    Tensor y = out.detach();
    record(name, {x}, out, [x, y, back, op, name, alpha](const auto& g) {
      // Under create_graph the saved (detached) output must be recomputed with history, else
      // the second derivative would miss its dependence on x.
      Tensor yy = GradMode::enabled() ? float_unary(op, name, x, back, alpha) : y;
      return std::vector<Tensor>{back(x, yy, g[0])};
    });
  }
  return out;
}

Tensor scalar_like(double s, const Tensor& t) { return scalar_tensor(s, t.options()); }

DType scalar_result_dtype(const Tensor& a, double s) {
  if (is_integral(a.dtype()) && s != std::floor(s)) return DType::kF32;
  return a.dtype() == DType::kBool ? DType::kI64 : a.dtype();
}

// alpha * x + beta, keeping x's dtype when the scalars allow it.
Tensor affine(const Tensor& x0, double alpha, double beta) {
  if (x0.is_distributed()) [[unlikely]] {
    // alpha * x is linear; a constant is added by one rank of each Partial mesh dim.
    if (beta == 0) return dist_dispatch1({"mul", DistRule::kLinear}, {x0}, MT_DIST_LOCAL(affine(l[0], alpha, 0)));
    return dist_dispatch1({"add", DistRule::kAffineScalar}, {x0},
                          MT_DIST_LOCAL(affine(l[0], alpha, ctx.partial_root ? beta : 0.0)));
  }
  DType t = promote(scalar_result_dtype(x0, alpha), scalar_result_dtype(x0, beta));
  Tensor x = x0.to(t);
  Tensor out = run_unary(UnaryOp::kAffine, x, alpha, beta);
  if (needs_grad(x))
    record("AffineBackward", {x}, out, [alpha](const auto& g) { return std::vector<Tensor>{mul(g[0], alpha)}; });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kAdd, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kSub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kMul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kDiv, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kMaximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kMinimum, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kPow, a, b); }
Tensor silu_mul(const Tensor& gate, const Tensor& up) {
  MT_CHECK(is_floating(gate.dtype()) && is_floating(up.dtype()), "silu_mul: floating tensors only, got {} and {}",
           gate.desc(), up.desc());
  return binary(BinaryOp::kSiluMul, gate, up);
}
Tensor add(const Tensor& a, double s) { return affine(a, 1.0, s); }
Tensor sub(const Tensor& a, double s) { return affine(a, 1.0, -s); }
Tensor rsub(double s, const Tensor& a) { return affine(a, -1.0, s); }
Tensor mul(const Tensor& a, double s) { return affine(a, s, 0.0); }
Tensor div(const Tensor& a, double s) {
  Tensor x = is_floating(a.dtype()) ? a : a.to(DType::kF32);
  return binary(BinaryOp::kDiv, x, scalar_like(s, x));
}

Tensor neg(const Tensor& x) {
  MT_CHECK(x.dtype() != DType::kBool, "neg: not defined for bool tensor {}", x.desc());
  if (x.is_distributed()) [[unlikely]] return dist_dispatch1({"neg", DistRule::kLinear}, {x}, MT_DIST_LOCAL(neg(l[0])));
  Tensor out = run_unary(UnaryOp::kNeg, x);
  if (needs_grad(x)) record("NegBackward", {x}, out, [](const auto& g) { return std::vector<Tensor>{neg(g[0])}; });
  return out;
}

Tensor abs(const Tensor& x) {
  if (x.is_distributed()) [[unlikely]] return dist_dispatch1({"abs", DistRule::kElementwise}, {x}, MT_DIST_LOCAL(abs(l[0])));
  Tensor out = run_unary(UnaryOp::kAbs, x);
  if (needs_grad(x))
    record("AbsBackward", {x}, out, [x](const auto& g) { return std::vector<Tensor>{mul(g[0], sign(x))}; });
  return out;
}

Tensor sign(const Tensor& x) {
  if (x.is_distributed()) [[unlikely]] return dist_dispatch1({"sign", DistRule::kElementwise}, {x}, MT_DIST_LOCAL(sign(l[0])));
  Tensor out = run_unary(UnaryOp::kSign, x);
  if (needs_grad(x))
    record("SignBackward", {x}, out, [](const auto& g) { return std::vector<Tensor>{zeros_like(g[0])}; });
  return out;
}

Tensor relu(const Tensor& x) {
  if (x.is_distributed()) [[unlikely]] return dist_dispatch1({"relu", DistRule::kElementwise}, {x}, MT_DIST_LOCAL(relu(l[0])));
  Tensor out = run_unary(UnaryOp::kRelu, x);
  if (needs_grad(x))
    record("ReluBackward", {x}, out, [x](const auto& g) {
      return std::vector<Tensor>{mul(g[0], gt(x, 0.0).to(g[0].dtype()))};
    });
  return out;
}

Tensor exp(const Tensor& x) {
  return float_unary(UnaryOp::kExp, "ExpBackward", x, [](const Tensor&, const Tensor& y, const Tensor& g) { return mul(g, y); });
}
Tensor log(const Tensor& x) {
  return float_unary(UnaryOp::kLog, "LogBackward", x, [](const Tensor& x, const Tensor&, const Tensor& g) { return div(g, x); });
}
Tensor sqrt(const Tensor& x) {
  return float_unary(UnaryOp::kSqrt, "SqrtBackward", x,
                     [](const Tensor&, const Tensor& y, const Tensor& g) { return div(g, mul(y, 2.0)); });
}
Tensor rsqrt(const Tensor& x) {
  return float_unary(UnaryOp::kRsqrt, "RsqrtBackward", x, [](const Tensor&, const Tensor& y, const Tensor& g) {
    return mul(g, mul(pow(y, 3.0), -0.5));
  });
}
Tensor sin(const Tensor& x) {
  return float_unary(UnaryOp::kSin, "SinBackward", x, [](const Tensor& x, const Tensor&, const Tensor& g) { return mul(g, cos(x)); });
}
Tensor cos(const Tensor& x) {
  return float_unary(UnaryOp::kCos, "CosBackward", x,
                     [](const Tensor& x, const Tensor&, const Tensor& g) { return neg(mul(g, sin(x))); });
}
Tensor reciprocal(const Tensor& x) {
  return float_unary(UnaryOp::kReciprocal, "ReciprocalBackward", x,
                     [](const Tensor&, const Tensor& y, const Tensor& g) { return neg(mul(g, mul(y, y))); });
}
Tensor square(const Tensor& x) { return pow(x, 2.0); }
Tensor pow(const Tensor& x, double e) {
  return float_unary(UnaryOp::kPowScalar, "PowScalarBackward", x, [e](const Tensor& x, const Tensor&, const Tensor& g) {
    return mul(g, mul(pow(x, e - 1), e));
  }, e);
}
Tensor tanh(const Tensor& x) {
  return float_unary(UnaryOp::kTanh, "TanhBackward", x, [](const Tensor&, const Tensor& y, const Tensor& g) {
    return mul(g, rsub(1.0, mul(y, y)));
  });
}
Tensor sigmoid(const Tensor& x) {
  return float_unary(UnaryOp::kSigmoid, "SigmoidBackward", x, [](const Tensor&, const Tensor& y, const Tensor& g) {
    return mul(g, mul(y, rsub(1.0, y)));
  });
}
namespace {
// f'(x) from a fused kernel; recorded with f''(x) when differentiated again (create_graph).
Tensor derivative(UnaryOp op, const char* name, const Tensor& x, std::function<Tensor(const Tensor&)> second) {
  Tensor d = run_unary(op, x);
  if (needs_grad(x))
    record(name, {x}, d, [x, second](const auto& g) { return std::vector<Tensor>{mul(g[0], second(x))}; });
  return d;
}
constexpr double kSqrt2OverPi = 0.7978845608028654, kGeluC = 0.044715;
}  // namespace

Tensor silu(const Tensor& x) {
  return float_unary(UnaryOp::kSilu, "SiluBackward", x, [](const Tensor& x, const Tensor&, const Tensor& g) {
    return mul(g, derivative(UnaryOp::kSiluGrad, "SiluGradBackward", x, [](const Tensor& x) {
      Tensor s = sigmoid(x);  // s (1 - s) (2 + x (1 - 2 s))
      return mul(mul(s, rsub(1.0, s)), add(mul(x, rsub(1.0, mul(s, 2.0))), 2.0));
    }));
  });
}
Tensor gelu(const Tensor& x, GeluApprox approx) {
  bool tanh_form = approx == GeluApprox::kTanh;
  return float_unary(tanh_form ? UnaryOp::kGeluTanh : UnaryOp::kGelu, "GeluBackward", x,
                     [tanh_form](const Tensor& x, const Tensor&, const Tensor& g) {
                       if (!tanh_form)
                         return mul(g, derivative(UnaryOp::kGeluGrad, "GeluGradBackward", x, [](const Tensor& x) {
                           Tensor x2 = mul(x, x);  // phi(x) (2 - x^2)
                           return mul(mul(exp(mul(x2, -0.5)), 0.3989422804014327), rsub(2.0, x2));
                         }));
                       return mul(g, derivative(UnaryOp::kGeluTanhGrad, "GeluGradBackward", x, [](const Tensor& x) {
                         // (1 - t^2) (u' - x t u'^2 + x u''/2), u = k (x + c x^3)
                         Tensor x2 = mul(x, x);
                         Tensor t = tanh(mul(add(x, mul(mul(x2, x), kGeluC)), kSqrt2OverPi));
                         Tensor du = mul(add(mul(x2, 3 * kGeluC), 1.0), kSqrt2OverPi);
                         Tensor inner = add(sub(du, mul(mul(x, t), mul(du, du))), mul(x2, 3 * kGeluC * kSqrt2OverPi));
                         return mul(rsub(1.0, mul(t, t)), inner);
                       }));
                     });
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  MT_CHECK(!(lo > hi), "clamp: lower bound {} is above upper bound {}", lo, hi);
  if (x.is_distributed()) [[unlikely]]
    return dist_dispatch1({"clamp", DistRule::kElementwise}, {x}, MT_DIST_LOCAL(clamp(l[0], lo, hi)));
  Tensor out = run_unary(UnaryOp::kClamp, x, lo, hi);
  if (needs_grad(x))
    record("ClampBackward", {x}, out, [x, lo, hi](const auto& g) {
      Tensor inside = logical_and(ge(x, lo), le(x, hi));
      return std::vector<Tensor>{mul(g[0], inside.to(g[0].dtype()))};
    });
  return out;
}

Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kEq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kNe, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kLt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kLe, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kGt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kGe, a, b); }
// Scalar comparisons compare in the tensor's dtype if the scalar fits it exactly, else in f64.
namespace {
Tensor compare_scalar(BinaryOp op, const Tensor& a, double s) {
  DType t = a.dtype();
  // Out-of-range scalars (300 for u8, 2 for bool, 1e30 for i32) would wrap when cast to t.
  auto fits = [&] {
    switch (t) {
      case DType::kBool: return s == 0 || s == 1;
      case DType::kU8: return s >= 0 && s <= 255;
      case DType::kI32: return s >= -2147483648.0 && s <= 2147483647.0;
      default: return s >= -0x1p63 && s < 0x1p63;
    }
  };
  if (is_integral(t) && (s != std::floor(s) || !fits())) t = DType::kF64;
  Tensor x = a.to(t);
  return binary(op, x, scalar_tensor(s, x.options()));
}
}  // namespace
Tensor eq(const Tensor& a, double s) { return compare_scalar(BinaryOp::kEq, a, s); }
Tensor ne(const Tensor& a, double s) { return compare_scalar(BinaryOp::kNe, a, s); }
Tensor lt(const Tensor& a, double s) { return compare_scalar(BinaryOp::kLt, a, s); }
Tensor le(const Tensor& a, double s) { return compare_scalar(BinaryOp::kLe, a, s); }
Tensor gt(const Tensor& a, double s) { return compare_scalar(BinaryOp::kGt, a, s); }
Tensor ge(const Tensor& a, double s) { return compare_scalar(BinaryOp::kGe, a, s); }

Tensor logical_not(const Tensor& x) {
  if (x.is_distributed()) [[unlikely]]
    return dist_dispatch1({"logical_not", DistRule::kElementwise}, {x}, MT_DIST_LOCAL(logical_not(l[0])));
  return run_unary(UnaryOp::kLogicalNot, x, 0, 0, DType::kBool, false);
}
Tensor logical_and(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kLogicalAnd, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kLogicalOr, a, b); }

Tensor where(const Tensor& cond, const Tensor& a0, const Tensor& b0) {
  if (any_dist(cond, a0, b0)) [[unlikely]]
    return dist_dispatch1({"where", DistRule::kElementwise}, {cond, a0, b0}, MT_DIST_LOCAL(where(l[0], l[1], l[2])));
  check_same_device(a0, b0, "where");
  check_same_device(cond, a0, "where");
  MT_CHECK(cond.dtype() == DType::kBool, "where: condition must be bool, got {}", cond.desc());
  DType t = promote(a0.dtype(), b0.dtype());
  Tensor a = a0.to(t), b = b0.to(t);
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = empty(shape, a.options());
  WhereParams p{broadcast_view(cond, shape), broadcast_view(a, shape), broadcast_view(b, shape), out.view_info()};
  MT_KERNEL(a.device().type, where, p);
  if (needs_grad(a, b)) {
    Shape sa = a.shape(), sb = b.shape();
    record("WhereBackward", {a, b}, out, [cond, sa, sb](const auto& g) {
      Tensor z = zeros(Shape{}, g[0].options());
      return std::vector<Tensor>{sum_to(where(cond, g[0], z), sa), sum_to(where(cond, z, g[0]), sb)};
    });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, double b) {
  return where(cond, a, scalar_tensor(b, a.options()));
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  MT_CHECK(mask.dtype() == DType::kBool, "masked_fill: mask must be bool, got {}", mask.desc());
  MT_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(),
           "masked_fill: mask {} would broadcast {} to a larger shape", mask.shape(), x.desc());
  return where(mask, scalar_tensor(value, x.options()), x);
}

// ---- in-place methods -------------------------------------------------------------------------

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_inplace(*this, "add_");
  if (any_dist(*this, other)) {
    check_inplace_dist(*this, other, "add_");
    local_view(*this).add_(local_view(other), alpha);
    return *this;
  }
  check_same_device(*this, other, "add_");
  MT_CHECK(broadcast_shapes(shape(), other.shape(), "add_") == shape(),
           "add_: {} does not broadcast into {}", other.desc(), desc());
  Tensor o = other.to(dtype());
  if (alpha != 1) o = mul(o, alpha).to(dtype());  // mul may promote (i64 * 2.5 -> f32)
  BinaryParams p{BinaryOp::kAdd, view_info(), broadcast_view(o, shape()), view_info()};
  MT_KERNEL(device().type, binary, p);
  bump_version(*this);
  return *this;
}

Tensor& Tensor::mul_(const Tensor& other) {
  check_inplace(*this, "mul_");
  if (any_dist(*this, other)) {
    check_inplace_dist(*this, other, "mul_");
    local_view(*this).mul_(local_view(other));
    return *this;
  }
  check_same_device(*this, other, "mul_");
  MT_CHECK(broadcast_shapes(shape(), other.shape(), "mul_") == shape(),
           "mul_: {} does not broadcast into {}", other.desc(), desc());
  Tensor o = other.to(dtype());
  BinaryParams p{BinaryOp::kMul, view_info(), broadcast_view(o, shape()), view_info()};
  MT_KERNEL(device().type, binary, p);
  bump_version(*this);
  return *this;
}

Tensor& Tensor::mul_(double value) {
  check_inplace(*this, "mul_");
  UnaryParams p{UnaryOp::kAffine, view_info(), view_info(), value, 0};
  MT_KERNEL(device().type, unary, p);
  bump_version(*this);
  return *this;
}

}  // namespace mt
