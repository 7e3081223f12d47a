// Random tensors with single-device semantics (docs/rng.md): every op reads the generator offset
// at its start, advances it by random_blocks(global element count) and fills its output through
// fill_random, which gives element j of the global row-major order the same value however the
// tensor is split, viewed or threaded. dropout lives here too: its mask is a bernoulli draw.
#include "tensor/random.h"

#include <cmath>

#include "kernels/philox.h"
#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_pointwise.h"

namespace mt {

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().set_seed(seed); }

namespace {

const char* dist_name(RandomDist dist) {
  switch (dist) {
    case RandomDist::kUniform: return "uniform";
    case RandomDist::kNormal: return "normal";
    case RandomDist::kRandint: return "randint";
    case RandomDist::kBernoulli: return "bernoulli";
  }
  return "random";
}

constexpr double kMaxExactInt = 9007199254740992.0;  // 2^53

// Throws unless (a, b) are valid parameters of `dist` with output dtype `dtype`.
void check_params(const char* op, RandomDist dist, double a, double b, DType dtype) {
  switch (dist) {
    case RandomDist::kUniform:
      MT_CHECK(is_floating(dtype), "{}: output dtype must be floating, got {}", op, dtype);
      MT_CHECK(std::isfinite(a) && std::isfinite(b) && a <= b,
               "{}: bounds must be finite with low <= high, got [{}, {})", op, a, b);
      break;
    case RandomDist::kNormal:
      MT_CHECK(is_floating(dtype), "{}: output dtype must be floating, got {}", op, dtype);
      MT_CHECK(std::isfinite(a) && std::isfinite(b) && b >= 0,
               "{}: mean must be finite and std finite and >= 0, got mean {} std {}", op, a, b);
      break;
    case RandomDist::kRandint: {
      MT_CHECK(a == std::floor(a) && b == std::floor(b) && std::fabs(a) <= kMaxExactInt &&
                   std::fabs(b) <= kMaxExactInt && a < b,
               "{}: bounds must be integers with |bound| <= 2^53 and low < high, got [{}, {})", op, a, b);
      double lo = 0, hi = 0;  // representable range of an integral dtype
      switch (dtype) {
        case DType::kBool: hi = 1; break;
        case DType::kU8: hi = 255; break;
        case DType::kI32: lo = -2147483648.0; hi = 2147483647.0; break;
        default: lo = -kMaxExactInt; hi = kMaxExactInt; break;
      }
      MT_CHECK(a >= lo && b - 1 <= hi, "{}: range [{}, {}) does not fit dtype {}", op, a, b, dtype);
      break;
    }
    case RandomDist::kBernoulli:
      MT_CHECK(a >= 0 && a <= 1, "{}: probability must be in [0, 1], got {}", op, a);
      break;
  }
}

// Allocates a tensor of `shape` and fills it as the whole (global) tensor from the generator.
Tensor make_random(const char* op, const Shape& shape, RandomDist dist, double a, double b,
                   const TensorOptions& opts, Generator* gen) {
  check_params(op, dist, a, b, opts.dtype);
  MT_CHECK(!opts.requires_grad || is_floating(opts.dtype), "{}: only floating tensors can require grad, not {}",
           op, opts.dtype);
  Generator& g = gen ? *gen : default_generator();
  Tensor out = empty(shape, opts.with_grad(false));
  const uint64_t offset = g.reserve(random_blocks(dist, opts.dtype, shape.numel(), a, b));
  fill_random(out, dist, a, b, g.seed(), offset, 0, shape.contiguous_strides());
  if (opts.requires_grad) out.requires_grad_();
  return out;
}

// Fills t in place as a whole tensor: its own row-major order is the global order.
Tensor& fill_inplace(const char* op, Tensor& t, RandomDist dist, double a, double b, Generator* gen) {
  MT_CHECK(t.defined(), "{}: undefined tensor", op);
  check_inplace(t, op);
  check_params(op, dist, a, b, t.dtype());
  Generator& g = gen ? *gen : default_generator();
  // Every rank reserves the blocks of the global tensor (numel() of a DTensor is global).
  const uint64_t offset = g.reserve(random_blocks(dist, t.dtype(), t.numel(), a, b));
  if (t.is_distributed()) {  // each rank fills its shard with the global tensor's values there
    DistRandomFill fill{dist, a, b, g.seed(), offset};
    DistOp d{op, DistRule::kRandomFill};
    d.extra = &fill;
    dist_dispatch(d, {t}, MT_DIST_LOCAL());
    return t;
  }
  fill_random(t, dist, a, b, g.seed(), offset, 0, t.shape().contiguous_strides());
  return t;
}

}  // namespace

uint64_t random_blocks(RandomDist dist, DType dtype, int64_t numel, double a, double b) {
  MT_CHECK(numel >= 0, "random_blocks: negative element count {}", numel);
  const auto per_block = static_cast<uint64_t>(4 / philox::lanes_per_element(dist, dtype, a, b));
  return (static_cast<uint64_t>(numel) + per_block - 1) / per_block;
}

Tensor uniform(const Shape& shape, double lo, double hi, TensorOptions opts, Generator* gen) {
  return make_random("uniform", shape, RandomDist::kUniform, lo, hi, opts, gen);
}

Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts, Generator* gen) {
  return make_random("normal", shape, RandomDist::kNormal, mean, std, opts, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  return make_random("randint", shape, RandomDist::kRandint, static_cast<double>(low),
                     static_cast<double>(high), opts, gen);
}

Tensor bernoulli(const Shape& shape, double p, TensorOptions opts, Generator* gen) {
  return make_random("bernoulli", shape, RandomDist::kBernoulli, p, 0, opts, gen);
}

Tensor& uniform_(Tensor& t, double lo, double hi, Generator* gen) {
  return fill_inplace("uniform_", t, RandomDist::kUniform, lo, hi, gen);
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  return fill_inplace("normal_", t, RandomDist::kNormal, mean, std, gen);
}

void fill_random(Tensor& local, RandomDist dist, double a, double b, uint64_t seed, uint64_t offset,
                 int64_t global_base, const Shape& global_strides) {
  const char* op = "fill_random";
  MT_CHECK(local.defined(), "{}: undefined tensor", op);
  check_inplace(local, op);
  check_params(dist_name(dist), dist, a, b, local.dtype());
  MT_CHECK(global_strides.size() == local.dim(), "{}: {} global strides {} for local tensor {} of shape {}",
           op, global_strides.size(), global_strides, local.desc(), local.shape());
  MT_CHECK(global_base >= 0, "{}: negative global base {}", op, global_base);
  for (int d = 0; d < local.dim(); ++d) {
    MT_CHECK(global_strides[d] >= 0, "{}: negative global stride {} in dim {} (global strides {})", op,
             global_strides[d], d, global_strides);
    MT_CHECK(local.size(d) <= 1 || local.stride(d) != 0,
             "{}: local tensor {} with strides {} overlaps itself (expanded dim {})", op, local.desc(),
             local.strides(), d);
  }
  RandomParams p;
  p.dist = dist;
  p.out = local.view_info();
  p.seed = seed;
  p.offset = offset;
  p.a = a;
  p.b = b;
  p.global_base = global_base;
  p.global_strides = global_strides;
  MT_KERNEL(local.device().type, random, p);
  bump_version(local);
}

Tensor dropout(const Tensor& x, double p, Generator* gen) {
  MT_CHECK(x.defined(), "dropout: undefined tensor");
  MT_CHECK(p >= 0 && p < 1, "dropout: probability must be in [0, 1), got {} (input {})", p, x.desc());
  MT_CHECK(is_floating(x.dtype()), "dropout: input must be floating, got {}", x.desc());
  if (p == 0) return x;
  const double keep = 1 - p;
  if (x.is_distributed()) [[unlikely]] {
    // The mask is the global tensor's mask, drawn shard by shard; the product is dispatched.
    Tensor mask = empty(x.local_shape(), x.options().with_grad(false));
    mask.impl()->dist = x.impl()->dist;
    fill_inplace("dropout", mask, RandomDist::kBernoulli, keep, 0, gen);
    return div(mul(x, mask), keep);
  }
  Tensor mask = bernoulli(x.shape(), keep, x.options().with_grad(false), gen);
  Tensor out;
  {
    NoGradGuard no_grad;  // recorded below as one node
    out = div(mul(x, mask), keep);
  }
  if (needs_grad(x))
    record("DropoutBackward", {x}, out, [mask, keep](const auto& g) {
      return std::vector<Tensor>{div(mul(g[0], mask), keep)};
    });
  return out;
}

}  // namespace mt
