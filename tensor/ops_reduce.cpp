// Reduction front ends: normalize the dim list, move reduced dims last in the kernel view (no
// copy), pick the result dtype, and record the backward formula.
#include "tensor/ops_reduce.h"

#include <algorithm>
#include <limits>

#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/ops_pointwise.h"

namespace mt {
namespace {

const char* reduce_name(ReduceOp op) {
  static const char* kNames[] = {"sum", "mean", "max", "min", "argmax", "argmin", "var", "prod"};
  return kNames[static_cast<int>(op)];
}

std::vector<bool> reduced_mask(const Tensor& x, const std::vector<int64_t>& dims, const char* name) {
  std::vector<bool> mask(static_cast<size_t>(x.dim()), dims.empty());
  for (int64_t d : dims) {
    int w = wrap_dim(d, x.dim(), name);
    if (x.dim() == 0) continue;  // dim 0 / -1 of a 0-d tensor: nothing to reduce
    MT_CHECK(!mask[w] || dims.empty(), "{}: dim {} repeated in the dim list for {}", name, w, x.desc());
    mask[w] = true;
  }
  return mask;
}

// Output shape with reduced dims kept as 1.
Shape keep_shape(const Tensor& x, const std::vector<bool>& mask) {
  Shape s = x.shape();
  for (int i = 0; i < x.dim(); ++i)
    if (mask[i]) s[i] = 1;
  return s;
}

Tensor run_reduce(ReduceOp op, const Tensor& x, const std::vector<bool>& mask, KeepDim keep, DType out_dtype,
                  int64_t correction = 1) {
  const char* name = reduce_name(op);
  KView in = x.view_info();
  Shape kept_sizes;
  int n_reduce = 0;
  {
    Shape sizes, strides;
    for (int i = 0; i < x.dim(); ++i)
      if (!mask[i]) {
        sizes.push_back(x.shape()[i]);
        strides.push_back(x.strides()[i]);
      }
    kept_sizes = sizes;
    for (int i = 0; i < x.dim(); ++i)
      if (mask[i]) {
        sizes.push_back(x.shape()[i]);
        strides.push_back(x.strides()[i]);
        ++n_reduce;
      }
    in.sizes = sizes;
    in.strides = strides;
  }
  int64_t count = 1;
  for (int i = 0; i < x.dim(); ++i)
    if (mask[i]) count *= x.shape()[i];
  bool needs_element = op == ReduceOp::kMax || op == ReduceOp::kMin || op == ReduceOp::kArgmax ||
                       op == ReduceOp::kArgmin;
  MT_CHECK(!(needs_element && count == 0 && kept_sizes.numel() > 0),
           "{}: cannot reduce over an empty dim of {}", name, x.desc());
  Tensor out = empty(kept_sizes, x.options().with_dtype(out_dtype));
  ReduceParams p;
  p.op = op;
  p.in = in;
  p.out = out.view_info();
  p.n_reduce = n_reduce;
  p.correction = correction;
  if (out.numel() > 0) MT_KERNEL(x.device().type, reduce, p);
  if (keep == KeepDim::kYes) out = out.view(keep_shape(x, mask));
  return out;
}

DType sum_dtype(DType t) { return is_integral(t) ? DType::kI64 : t; }

Tensor float_input(const Tensor& x) { return is_floating(x.dtype()) ? x : x.to(DType::kF32); }

// Gradient g (reduced shape) broadcast back to x's shape.
Tensor expand_back(const Tensor& g, const Shape& kshape, const Shape& xshape) {
  return g.reshape(kshape).expand(xshape);
}

// DTensor dispatch of a reduction: args = (mask of reduced dims, keepdim, ReduceOp).
Tensor dist_reduce(ReduceOp op, const Tensor& x, const std::vector<bool>& mask, KeepDim keep, DistLocalFn local) {
  DistOp d{reduce_name(op), DistRule::kReduce};
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i]) d.args[0] |= int64_t{1} << i;
  d.args[1] = keep == KeepDim::kYes;
  d.args[2] = static_cast<int64_t>(op);
  return dist_dispatch1(d, {x}, local);
}

Tensor reduce_minmax(ReduceOp op, const Tensor& x, const std::vector<bool>& mask, KeepDim keep);

// A DTensor's local term of max/min: a shard empty along a reduced dim (5 rows over 4 ranks leave
// one rank none) contributes the reduction's identity (-inf for max, +inf for min; an integer
// dtype's lowest and highest value) to the Partial(max/min) result, so the other ranks' values win.
// It threw on that rank only, and the others waited in the next collective until its timeout
// (before 2026-11-28; integer dtypes until the next session).
Tensor local_minmax(ReduceOp op, const Tensor& l, const std::vector<bool>& mask, KeepDim keep) {
  bool empty_reduced = false;
  for (int i = 0; i < l.dim(); ++i) empty_reduced = empty_reduced || (mask[static_cast<size_t>(i)] && l.shape()[i] == 0);
  if (!empty_reduced) return reduce_minmax(op, l, mask, keep);
  Shape ks = keep_shape(l, mask), out;
  if (keep == KeepDim::kYes) {
    out = ks;
  } else {
    std::vector<int64_t> dims;
    for (int i = 0; i < l.dim(); ++i)
      if (!mask[static_cast<size_t>(i)]) dims.push_back(l.shape()[i]);
    out = Shape(dims);
  }
  const bool mx = op == ReduceOp::kMax;
  if (is_floating(l.dtype())) {
    const double inf = std::numeric_limits<double>::infinity();
    return full(out, mx ? -inf : inf, l.options());
  }
  // Integers: the dtype's lowest / highest value (int64's highest has no double: filled on the host).
  if (l.dtype() == DType::kI64) {
    const int64_t v = mx ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
    return from_vector<int64_t>(std::vector<int64_t>(static_cast<size_t>(out.numel()), v), out,
                                TensorOptions(DType::kI64))
        .to(l.device());
  }
  double lo = 0, hi = 1;  // bool
  if (l.dtype() == DType::kI32) {
    lo = std::numeric_limits<int32_t>::min();
    hi = std::numeric_limits<int32_t>::max();
  } else if (l.dtype() == DType::kU8) {
    hi = 255;
  }
  return full(out, mx ? lo : hi, l.options());
}

Tensor reduce_minmax(ReduceOp op, const Tensor& x, const std::vector<bool>& mask, KeepDim keep) {
  if (x.is_distributed()) [[unlikely]]
    return dist_reduce(op, x, mask, keep, MT_DIST_LOCAL(local_minmax(op, l[0], mask, keep)));
  Tensor out = run_reduce(op, x, mask, keep, x.dtype());
  if (needs_grad(x)) {
    Shape ks = keep_shape(x, mask), xs = x.shape();
    std::vector<int64_t> dims;
    for (int i = 0; i < x.dim(); ++i)
      if (mask[i]) dims.push_back(i);
    Tensor y = out.detach();
    record(op == ReduceOp::kMax ? "MaxBackward" : "MinBackward", {x}, out, [x, y, ks, xs, dims](const auto& g) {
      // Ties share the gradient evenly.
      Tensor hit = eq(x, y.reshape(ks)).to(x.dtype());
      Tensor n = dims.empty() ? hit : sum(hit, dims, KeepDim::kYes);
      return std::vector<Tensor>{div(mul(hit, expand_back(g[0], ks, xs)), n)};
    });
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, KeepDim keep) {
  auto mask = reduced_mask(x, dims, "sum");
  if (x.is_distributed()) [[unlikely]]
    return dist_reduce(ReduceOp::kSum, x, mask, keep, MT_DIST_LOCAL(sum(l[0], dims, keep)));
  Tensor out = run_reduce(ReduceOp::kSum, x, mask, keep, sum_dtype(x.dtype()));
  if (needs_grad(x)) {
    Shape ks = keep_shape(x, mask), xs = x.shape();
    record("SumBackward", {x}, out, [ks, xs](const auto& g) { return std::vector<Tensor>{expand_back(g[0], ks, xs)}; });
  }
  return out;
}

Tensor sum(const Tensor& x) { return sum(x, {}, KeepDim::kNo); }

Tensor mean(const Tensor& x0, const std::vector<int64_t>& dims, KeepDim keep) {
  Tensor x = float_input(x0);
  auto mask = reduced_mask(x, dims, "mean");
  if (x.is_distributed()) [[unlikely]] {
    // sum / (global count): a sum over a sharded dim is Partial, and so is its mean.
    Shape ks = keep_shape(x, mask);
    double count = static_cast<double>(std::max<int64_t>(x.numel() / std::max<int64_t>(ks.numel(), 1), 1));
    return div(sum(x, dims, keep), count);
  }
  Tensor out = run_reduce(ReduceOp::kMean, x, mask, keep, x.dtype());
  if (needs_grad(x)) {
    Shape ks = keep_shape(x, mask), xs = x.shape();
    double count = static_cast<double>(std::max<int64_t>(x.numel() / std::max<int64_t>(ks.numel(), 1), 1));
    record("MeanBackward", {x}, out, [ks, xs, count](const auto& g) {
      return std::vector<Tensor>{expand_back(div(g[0], count), ks, xs)};
    });
  }
  return out;
}

Tensor mean(const Tensor& x) { return mean(x, {}, KeepDim::kNo); }

Tensor max(const Tensor& x) { return reduce_minmax(ReduceOp::kMax, x, reduced_mask(x, {}, "max"), KeepDim::kNo); }
Tensor min(const Tensor& x) { return reduce_minmax(ReduceOp::kMin, x, reduced_mask(x, {}, "min"), KeepDim::kNo); }
Tensor max(const Tensor& x, int64_t dim, KeepDim keep) {
  return reduce_minmax(ReduceOp::kMax, x, reduced_mask(x, {dim}, "max"), keep);
}
Tensor min(const Tensor& x, int64_t dim, KeepDim keep) {
  return reduce_minmax(ReduceOp::kMin, x, reduced_mask(x, {dim}, "min"), keep);
}

Tensor argmax(const Tensor& x, int64_t dim, KeepDim keep) {
  if (x.is_distributed()) [[unlikely]]
    return dist_reduce(ReduceOp::kArgmax, x, reduced_mask(x, {dim}, "argmax"), keep, MT_DIST_LOCAL(argmax(l[0], dim, keep)));
  return run_reduce(ReduceOp::kArgmax, x, reduced_mask(x, {dim}, "argmax"), keep, DType::kI64);
}
Tensor argmin(const Tensor& x, int64_t dim, KeepDim keep) {
  if (x.is_distributed()) [[unlikely]]
    return dist_reduce(ReduceOp::kArgmin, x, reduced_mask(x, {dim}, "argmin"), keep, MT_DIST_LOCAL(argmin(l[0], dim, keep)));
  return run_reduce(ReduceOp::kArgmin, x, reduced_mask(x, {dim}, "argmin"), keep, DType::kI64);
}

Tensor var(const Tensor& x0, const std::vector<int64_t>& dims, int64_t correction, KeepDim keep) {
  Tensor x = float_input(x0);
  auto mask = reduced_mask(x, dims, "var");
  if (x.is_distributed()) [[unlikely]]
    return dist_reduce(ReduceOp::kVar, x, mask, keep, MT_DIST_LOCAL(var(l[0], dims, correction, keep)));
  Tensor out = run_reduce(ReduceOp::kVar, x, mask, keep, x.dtype(), correction);
  if (needs_grad(x)) {
    Shape ks = keep_shape(x, mask), xs = x.shape();
    std::vector<int64_t> rdims;
    for (int i = 0; i < x.dim(); ++i)
      if (mask[i]) rdims.push_back(i);
    double n = static_cast<double>(x.numel() / std::max<int64_t>(ks.numel(), 1));
    record("VarBackward", {x}, out, [x, ks, xs, rdims, n, correction](const auto& g) {
      Tensor centered = sub(x, mean(x, rdims, KeepDim::kYes));
      return std::vector<Tensor>{mul(expand_back(g[0], ks, xs), mul(centered, 2.0 / (n - static_cast<double>(correction))))};
    });
  }
  return out;
}

}  // namespace mt
