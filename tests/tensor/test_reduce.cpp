// Reductions against naive loops: single, multiple, all and negative dims, keepdim,
// non-contiguous input, dtypes, NaN, ties, gradchecks and errors.
#include <cmath>
#include <functional>
#include <limits>

#include "runtime/error.h"
#include "testing.h"

using namespace mt;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

using V = std::vector<Tensor>;
std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }

// Naive reduction of x over `dims` (all when empty): f receives the reduced values in row-major
// order and returns the result. keep selects the output shape.
Tensor ref_reduce(const Tensor& x, std::vector<int64_t> dims, bool keep,
                  const std::function<double(const std::vector<double>&)>& f) {
  int n = x.dim();
  std::vector<bool> red(static_cast<size_t>(n), dims.empty());
  for (int64_t d : dims) red[static_cast<size_t>(d < 0 ? d + n : d)] = true;
  Shape out, kept;
  for (int i = 0; i < n; ++i) {
    if (!red[i]) out.push_back(x.shape()[i]);
    kept.push_back(red[i] ? 1 : x.shape()[i]);
  }
  std::vector<double> v = vals(x);
  std::vector<std::vector<double>> groups(static_cast<size_t>(out.numel()));
  for (int64_t flat = 0; flat < x.numel(); ++flat) {
    int64_t rem = flat, o = 0, os = 1;
    for (int i = n - 1; i >= 0; --i) {
      int64_t idx = rem % x.shape()[i];
      rem /= x.shape()[i];
      if (!red[i]) {
        o += idx * os;
        os *= x.shape()[i];
      }
    }
    groups[static_cast<size_t>(o)].push_back(v[static_cast<size_t>(flat)]);
  }
  std::vector<double> r;
  for (auto& g : groups) r.push_back(f(g));
  return from_vector<double>(r, keep ? kept : out);
}

double rsum(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double rmean(const std::vector<double>& g) { return rsum(g) / static_cast<double>(g.size()); }
double rmax(const std::vector<double>& g) {
  double m = -std::numeric_limits<double>::infinity();
  for (double v : g) {
    if (std::isnan(v)) return v;
    m = std::max(m, v);
  }
  return m;
}
double rmin(const std::vector<double>& g) {
  double m = std::numeric_limits<double>::infinity();
  for (double v : g) {
    if (std::isnan(v)) return v;
    m = std::min(m, v);
  }
  return m;
}
double rargmax(const std::vector<double>& g) {
  size_t b = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i])) return static_cast<double>(i);
    if (g[i] > g[b]) b = i;
  }
  return static_cast<double>(b);
}
double rargmin(const std::vector<double>& g) {
  size_t b = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i])) return static_cast<double>(i);
    if (g[i] < g[b]) b = i;
  }
  return static_cast<double>(b);
}
std::function<double(const std::vector<double>&)> rvar(int64_t correction) {
  return [correction](const std::vector<double>& g) {
    double m = rmean(g), ss = 0;
    for (double v : g) ss += (v - m) * (v - m);
    return ss / static_cast<double>(static_cast<int64_t>(g.size()) - correction);
  };
}

double tol_for(DType t) { return t == DType::kF64 ? 1e-12 : t == DType::kF32 ? 1e-5 : 2e-2; }

}  // namespace

TEST_CASE("sum, mean, var over single, multiple, all and negative dims", "[cpu]") {
  std::vector<std::vector<int64_t>> dim_sets = {{0}, {1}, {2}, {-1}, {-3}, {0, 2}, {2, 0}, {-1, -2}, {0, 1, 2}, {}};
  for (DType t : {DType::kF64, DType::kF32, DType::kBF16}) {
    Tensor x = rand({3, 7, 5}, t, 7, -1, 1);
    double tol = tol_for(t);
    for (const auto& dims : dim_sets) {
      for (bool keep : {false, true}) {
        INFO(dtype_name(t) << " dims " << fmt::format("{}", fmt::join(dims, ",")) << " keep " << keep);
        KeepDim k = keep ? KeepDim::kYes : KeepDim::kNo;
        Tensor s = sum(x, dims, k);
        REQUIRE(s.dtype() == t);
        REQUIRE_CLOSE(s, ref_reduce(x, dims, keep, rsum), tol, tol);
        REQUIRE_CLOSE(sum(noncontig(x), dims, k), ref_reduce(x, dims, keep, rsum), tol, tol);
        REQUIRE_CLOSE(mean(x, dims, k), ref_reduce(x, dims, keep, rmean), tol, tol);
        REQUIRE_CLOSE(mean(noncontig(x), dims, k), ref_reduce(x, dims, keep, rmean), tol, tol);
        REQUIRE_CLOSE(var(x, dims, 1, k), ref_reduce(x, dims, keep, rvar(1)), tol, tol);
        REQUIRE_CLOSE(var(noncontig(x), dims, 0, k), ref_reduce(x, dims, keep, rvar(0)), tol, tol);
      }
    }
    // Permuted input (reduced dims not innermost in memory).
    Tensor p = x.permute({2, 0, 1});
    REQUIRE_CLOSE(sum(p, {1}), ref_reduce(p, {1}, false, rsum), tol, tol);
    REQUIRE_CLOSE(var(p, {0, 2}), ref_reduce(p, {0, 2}, false, rvar(1)), tol, tol);
    REQUIRE_CLOSE(mean(p.slice(2, 0, 7, 3), {-1}), ref_reduce(p.slice(2, 0, 7, 3), {-1}, false, rmean), tol, tol);
  }
  Tensor x = rand({4, 6}, DType::kF64, 8);
  REQUIRE(sum(x).dim() == 0);
  REQUIRE(sum(x).item() == Approx(rsum(vals(x))));
  REQUIRE(mean(x).item() == Approx(rmean(vals(x))));
  REQUIRE(sum(x, {}, KeepDim::kYes).shape() == Shape{1, 1});
  // Large reductions, both layouts, run in parallel with the same result.
  Tensor big = rand({600, 129}, DType::kF32, 9);
  REQUIRE_CLOSE(sum(big, {1}), ref_reduce(big, {1}, false, rsum), 1e-5, 1e-5);
  REQUIRE_CLOSE(sum(big, {0}), ref_reduce(big, {0}, false, rsum), 1e-5, 1e-5);
  REQUIRE_CLOSE(sum(big.t(), {0}), ref_reduce(big, {1}, false, rsum), 1e-5, 1e-5);
}

TEST_CASE("max, min, argmax, argmin", "[cpu]") {
  for (DType t : {DType::kF64, DType::kF32, DType::kBF16, DType::kI64, DType::kI32}) {
    // Few distinct values so that ties occur; argmax/argmin must return the first one.
    Tensor x = from_vector<double>(vals(mul(rand({3, 7, 5}, DType::kF64, 5, -3, 3), 1.0).to(DType::kI64)),
                                   {3, 7, 5}, t);
    for (int64_t d : {0, 1, 2, -1, -2}) {
      for (bool keep : {false, true}) {
        INFO(dtype_name(t) << " dim " << d << " keep " << keep);
        KeepDim k = keep ? KeepDim::kYes : KeepDim::kNo;
        REQUIRE(max(x, d, k).dtype() == t);
        REQUIRE(vals(max(x, d, k)) == vals(ref_reduce(x, {d}, keep, rmax)));
        REQUIRE(vals(min(noncontig(x), d, k)) == vals(ref_reduce(x, {d}, keep, rmin)));
        Tensor am = argmax(x, d, k);
        REQUIRE(am.dtype() == DType::kI64);
        REQUIRE(am.shape() == ref_reduce(x, {d}, keep, rargmax).shape());
        REQUIRE(vals(am) == vals(ref_reduce(x, {d}, keep, rargmax)));
        REQUIRE(vals(argmin(noncontig(x), d, k)) == vals(ref_reduce(x, {d}, keep, rargmin)));
        REQUIRE(vals(argmax(x.transpose(0, 2), d, k)) == vals(ref_reduce(x.transpose(0, 2), {d}, keep, rargmax)));
      }
    }
    REQUIRE(max(x).dim() == 0);
    REQUIRE(max(x).item() == rmax(vals(x)));
    REQUIRE(min(x).item() == rmin(vals(x)));
  }
  // Values known to be ties.
  Tensor ties = from_vector<double>({1, 3, 3, 0, 0, -1}, {2, 3});
  REQUIRE(argmax(ties, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  REQUIRE(argmin(ties, 1).to_vector<int64_t>() == std::vector<int64_t>{0, 2});
  REQUIRE(argmax(ties, 0).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
  // 0-d input.
  Tensor s = scalar_tensor(4.0, DType::kF64);
  REQUIRE(max(s).item() == 4);
  REQUIRE(max(s, 0).item() == 4);
  REQUIRE(argmax(s, 0).item() == 0);
  REQUIRE(sum(s, {0}).item() == 4);
  REQUIRE(sum(s, {-1}, KeepDim::kYes).dim() == 0);
  REQUIRE(mean(s, {0}).item() == 4);
}

TEST_CASE("NaN propagates through max/min/argmax and sums", "[cpu]") {
  double nan = std::nan("");
  Tensor x = from_vector<double>({1, nan, 3, 5, 2, 0}, {2, 3});
  std::vector<double> mx = vals(max(x, 1)), mn = vals(min(x, 1));
  REQUIRE(std::isnan(mx[0]));
  REQUIRE(mx[1] == 5);
  REQUIRE(std::isnan(mn[0]));
  REQUIRE(mn[1] == 0);
  REQUIRE(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  REQUIRE(argmin(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  REQUIRE(std::isnan(max(x).item()));
  REQUIRE(std::isnan(sum(x).item()));
  REQUIRE(std::isnan(vals(mean(x, {1}))[0]));
  REQUIRE(vals(mean(x, {1}))[1] == Approx(7.0 / 3));
  // NaN first in the row.
  Tensor y = from_vector<double>({nan, 1, 2}, {3}, DType::kF32);
  REQUIRE(std::isnan(max(y).item()));
  REQUIRE(argmin(y, 0).item_int() == 0);
}

TEST_CASE("integer and bool sums give i64; mean of integers is floating", "[cpu]") {
  Tensor i = from_vector<int32_t>({2000000000, 2000000000, -5, 7}, {2, 2});
  Tensor s = sum(i, {0});
  REQUIRE(s.dtype() == DType::kI64);
  REQUIRE(s.to_vector<int64_t>() == std::vector<int64_t>{1999999995, 2000000007});
  REQUIRE(sum(i).to_vector<int64_t>()[0] == 4000000002);
  Tensor u = from_vector<uint8_t>({200, 200, 200}, {3});
  REQUIRE(sum(u).dtype() == DType::kI64);
  REQUIRE(sum(u).item_int() == 600);
  Tensor b = from_vector<uint8_t>({1, 0, 1, 1}, {4}).to(DType::kBool);
  REQUIRE(sum(b).dtype() == DType::kI64);
  REQUIRE(sum(b).item_int() == 3);
  int64_t big = (int64_t{1} << 60) + 1;
  REQUIRE(sum(from_vector<int64_t>({big, 2}, {2})).item_int() == big + 2);
  Tensor m = mean(from_vector<int64_t>({1, 2}, {2}));
  REQUIRE(is_floating(m.dtype()));
  REQUIRE(m.item() == 1.5);
  REQUIRE_CLOSE(var(from_vector<int64_t>({1, 2, 3, 4}, {4}), {0}), std::vector<double>{5.0 / 3}, 1e-6, 0);
  REQUIRE(max(from_vector<uint8_t>({3, 250, 7}, {3})).item() == 250);
}

TEST_CASE("empty reductions", "[cpu]") {
  REQUIRE(sum(empty({0}, DType::kF64)).item() == 0);
  REQUIRE(std::isnan(mean(empty({0}, DType::kF64)).item()));
  REQUIRE(vals(sum(empty({2, 0}, DType::kF64), {1})) == std::vector<double>{0, 0});
  REQUIRE(sum(empty({0, 3}), {1}).shape() == Shape{0});
  REQUIRE(max(empty({0, 3}), 1).shape() == Shape{0});  // nothing to reduce per output
  REQUIRE_THROWS_WITH(max(empty({0})), Catch::Contains("max") && Catch::Contains("empty") && Catch::Contains("[0]"));
  REQUIRE_THROWS_WITH(min(empty({3, 0}), 1), Catch::Contains("min") && Catch::Contains("[3, 0]"));
  REQUIRE_THROWS_WITH(argmax(empty({3, 0}), 1), Catch::Contains("argmax"));
  REQUIRE_THROWS_WITH(argmin(empty({0}), 0), Catch::Contains("argmin"));
}

TEST_CASE("reduction errors name the op, the dim and the tensor", "[cpu]") {
  Tensor x = ones({2, 3});
  REQUIRE_THROWS_WITH(sum(x, {2}), Catch::Contains("sum") && Catch::Contains("dim 2") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(sum(x, {-3}), Catch::Contains("sum") && Catch::Contains("-3"));
  REQUIRE_THROWS_WITH(mean(x, {0, 0}), Catch::Contains("mean") && Catch::Contains("repeated"));
  REQUIRE_THROWS_WITH(sum(x, {1, -1}), Catch::Contains("sum") && Catch::Contains("repeated") && Catch::Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(var(x, {0, -2}), Catch::Contains("var") && Catch::Contains("repeated"));
  REQUIRE_THROWS_WITH(max(x, 5), Catch::Contains("max") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(argmin(x, -3), Catch::Contains("argmin"));
  REQUIRE_THROWS_WITH(sum(scalar_tensor(1.0), {1}), Catch::Contains("sum"));
}

TEST_CASE("reduction gradchecks (f64, non-contiguous)", "[cpu]") {
  Tensor x = noncontig(rand({3, 4, 5}, DType::kF64, 71)).requires_grad_();
  std::vector<std::vector<int64_t>> dim_sets = {{0}, {-1}, {0, 2}, {}};
  for (const auto& dims : dim_sets) {
    for (KeepDim k : {KeepDim::kNo, KeepDim::kYes}) {
      INFO(fmt::format("dims {} keep {}", fmt::join(dims, ","), k == KeepDim::kYes));
      REQUIRE_GRADCHECK([&](const V& in) { return sum(in[0], dims, k); }, {x});
      REQUIRE_GRADCHECK([&](const V& in) { return mean(in[0], dims, k); }, {x});
      REQUIRE_GRADCHECK([&](const V& in) { return var(in[0], dims, 1, k); }, {x});
      REQUIRE_GRADCHECK([&](const V& in) { return var(in[0], dims, 0, k); }, {x});
    }
  }
  for (int64_t d : {0, 1, -1}) {
    REQUIRE_GRADCHECK([&](const V& in) { return max(in[0], d); }, {x});
    REQUIRE_GRADCHECK([&](const V& in) { return min(in[0], d, KeepDim::kYes); }, {x});
  }
  REQUIRE_GRADCHECK([&](const V& in) { return max(in[0]); }, {x});
  REQUIRE_GRADCHECK([&](const V& in) { return min(in[0].transpose(0, 2)); }, {x});
  REQUIRE_GRADCHECK([&](const V& in) { return sum(in[0].expand({2, 3, 4, 5}), {0, 2}); }, {x});
  // Second derivatives through var and mean.
  Tensor y = noncontig(rand({3, 4}, DType::kF64, 72)).requires_grad_();
  REQUIRE_GRADCHECK([&](const V& in) {
    GradModeGuard on(true);
    return mt::grad({sum(var(in[0], {1}) * mean(in[0], {1}))}, {in[0]}, {}, false, true)[0];
  }, {y});
}

TEST_CASE("max/min gradient splits evenly among ties", "[cpu]") {
  Tensor x = from_vector<double>({1, 3, 3, 2, 2, 2}, {2, 3}).requires_grad_();
  sum(max(x, 1)).backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{0, 0.5, 0.5, 1.0 / 3, 1.0 / 3, 1.0 / 3});
  x.set_grad(Tensor());
  max(x).backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{0, 0.5, 0.5, 0, 0, 0});
  x.set_grad(Tensor());
  min(x).backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 0, 0, 0, 0, 0});
  x.set_grad(Tensor());
  sum(min(x, 0, KeepDim::kYes) * from_vector<double>({1, 10, 100}, {1, 3})).backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 0, 0, 0, 10, 100});
  // Argmax/argmin are not differentiable.
  REQUIRE_FALSE(argmax(x, 0).requires_grad());
}
