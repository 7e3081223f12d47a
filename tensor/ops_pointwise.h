// Pointwise ops with numpy broadcasting and dtype promotion: arithmetic, math functions,
// activations, comparisons, where/masked_fill. All differentiable ones record autograd.
#pragma once

#include <limits>

#include "tensor/tensor.h"

namespace mt {

// Binary arithmetic (broadcasting, promotion). Scalar forms keep the tensor's dtype, except an
// integral tensor with a non-integral scalar becomes f32.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division: integral inputs give f32
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor rsub(double s, const Tensor& a);  // s - a
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);

// Unary math (floating inputs; integral inputs are promoted to f32 where the result is real).
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor square(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
inline constexpr double kNoBound = std::numeric_limits<double>::infinity();
Tensor clamp(const Tensor& x, double lo = -kNoBound, double hi = kNoBound);

// Activations.
enum class GeluApprox { kNone, kTanh };
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::kNone);
Tensor silu(const Tensor& x);
// silu(gate) * up in one pass (SwiGLU), with the bits of mul(silu(gate), up) and its gradients.
Tensor silu_mul(const Tensor& gate, const Tensor& up);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);

// Comparisons and logic: bool results, no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double s);
Tensor ne(const Tensor& a, double s);
Tensor lt(const Tensor& a, double s);
Tensor le(const Tensor& a, double s);
Tensor gt(const Tensor& a, double s);
Tensor ge(const Tensor& a, double s);
Tensor logical_not(const Tensor& x);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);

// Selection: cond is bool; a and b are promoted; gradient flows to a and b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// Operators.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(double s, const Tensor& a) { return rsub(s, a); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace mt
