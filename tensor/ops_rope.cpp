// Rotary embedding front end: builds the cos/sin tables, checks that the tables broadcast against
// x's leading dims, and runs the rope kernel. The backward is the same rotation by -angle, itself
// recorded, so higher-order gradients work. cos/sin are treated as constants (no gradient).
#include <cmath>
#include <vector>

#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/ops_nn.h"
#include "tensor/pointwise_util.h"

namespace mt {

std::pair<Tensor, Tensor> rope_tables(int64_t T, int64_t D, double theta, DType dtype) {
  MT_CHECK(T >= 0, "rope_tables: T must be >= 0, got {}", T);
  MT_CHECK(D > 0 && D % 2 == 0, "rope_tables: head dim D must be positive and even, got {}", D);
  MT_CHECK(theta > 0, "rope_tables: theta must be positive, got {}", theta);
  MT_CHECK(is_floating(dtype), "rope_tables: dtype must be floating, got {}", dtype);
  const int64_t half = D / 2;
  std::vector<double> c(static_cast<size_t>(T * half)), s(c.size());
  for (int64_t i = 0; i < half; ++i) {
    double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    for (int64_t t = 0; t < T; ++t) {
      double a = static_cast<double>(t) * inv_freq;
      c[static_cast<size_t>(t * half + i)] = std::cos(a);
      s[static_cast<size_t>(t * half + i)] = std::sin(a);
    }
  }
  return {from_vector<double>(c, Shape{T, half}, dtype), from_vector<double>(s, Shape{T, half}, dtype)};
}

namespace {

// x contiguous-able, cos/sin already validated and of x's compute dtype.
Tensor rope_apply(const Tensor& x0, const Tensor& cos, const Tensor& sin, RopeStyle style, bool inverse) {
  Tensor x = x0.contiguous();
  Tensor out = empty(x.shape(), x.options().with_grad(false));
  Shape tshape = x.shape();
  tshape[tshape.size() - 1] /= 2;
  RopeParams p;
  p.x = x.view_info();
  p.cos = broadcast_view(cos, tshape);
  p.sin = broadcast_view(sin, tshape);
  p.out = out.view_info();
  p.style = style;
  p.inverse = inverse;
  if (out.numel() > 0) MT_KERNEL(x.device().type, rope, p);
  if (needs_grad(x)) {
    record("RotaryEmbeddingBackward", {x}, out, [cos, sin, style, inverse](const auto& g) {
      return std::vector<Tensor>{rope_apply(g[0], cos, sin, style, !inverse)};
    });
  }
  return out;
}

void check_table(const Tensor& x, const Tensor& t, const char* which, const Tensor& cos, const Tensor& sin) {
  const int64_t D = x.shape().back();
  bool ok = t.dim() >= 1 && t.dim() <= x.dim() && t.shape().back() == D / 2;
  for (int i = 0; ok && i < t.dim() - 1; ++i) {
    int64_t ts = t.shape()[i], xs = x.shape()[x.dim() - t.dim() + i];
    ok = ts == 1 || ts == xs;
  }
  MT_CHECK(ok,
           "rotary_embedding: {} {} does not broadcast against x {}: expected x's leading dims "
           "(right-aligned, size 1 to broadcast) and last dim D/2 = {} (cos {}, sin {})",
           which, t.shape(), x.shape(), D / 2, cos.shape(), sin.shape());
  MT_CHECK(is_floating(t.dtype()), "rotary_embedding: {} must be floating, got {}", which, t.desc());
}

}  // namespace

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style) {
  if (any_dist(x, cos, sin)) [[unlikely]]
    return dist_dispatch1({"rotary_embedding", DistRule::kRope}, {x, cos, sin},
                          MT_DIST_LOCAL(rotary_embedding(l[0], l[1], l[2], style)));
  check_same_device(x, cos, "rotary_embedding");
  check_same_device(x, sin, "rotary_embedding");
  MT_CHECK(is_floating(x.dtype()), "rotary_embedding: x must be floating, got {}", x.desc());
  MT_CHECK(x.dim() >= 1 && x.shape().back() % 2 == 0,
           "rotary_embedding: x's last dim must be even, got x {} (cos {}, sin {})", x.shape(), cos.shape(),
           sin.shape());
  check_table(x, cos, "cos", cos, sin);
  check_table(x, sin, "sin", cos, sin);
  // The kernel reads tables in x's compute type; they get no gradient.
  DType tdt = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor c = cos.detach().to(tdt), s = sin.detach().to(tdt);
  return rope_apply(x, c, s, style, false);
}

}  // namespace mt
