// softmax, log_softmax, rms_norm and layer_norm: values against naive per-row loops (any dim,
// non-contiguous inputs, f32/bf16, extreme values), gradients by finite differences, deterministic
// weight gradients across thread counts, error messages, and rms_norm's backward adding into the
// skip connection's gradient with the bits of the unfused sum.
#include <cmath>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "residual_norm.h"
#include "testing.h"

using namespace mt;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

// Applies f(row values) -> row values along `dim` of x (any rank), naively, in double.
template <class F>
Tensor ref_along(const Tensor& x, int dim, F&& f) {
  std::vector<double> v = x.to_vector<double>();
  const Shape s = x.shape();
  int64_t inner = 1, outer = 1;
  for (int d = dim + 1; d < s.size(); ++d) inner *= s[d];
  for (int d = 0; d < dim; ++d) outer *= s[d];
  const int64_t n = s[dim];
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<double> row(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = v[static_cast<size_t>((o * n + j) * inner + i)];
      std::vector<double> r = f(row);
      for (int64_t j = 0; j < n; ++j) out[static_cast<size_t>((o * n + j) * inner + i)] = r[static_cast<size_t>(j)];
    }
  return from_vector<double>(out, s);
}

std::vector<double> ref_softmax(const std::vector<double>& x, bool log) {
  double mx = -INFINITY;
  for (double v : x) mx = std::max(mx, v);
  double s = 0;
  for (double v : x) s += std::exp(v - mx);
  std::vector<double> y;
  for (double v : x) y.push_back(log ? v - mx - std::log(s) : std::exp(v - mx) / s);
  return y;
}

std::vector<double> values(const Tensor& t) { return t.defined() ? t.to_vector<double>() : std::vector<double>(); }

std::vector<double> ref_rms(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double r = 1 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y;
  for (size_t j = 0; j < x.size(); ++j) y.push_back(x[j] * r * (w.empty() ? 1.0 : w[j]));
  return y;
}

std::vector<double> ref_ln(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                           double eps) {
  double m = 0, var = 0;
  for (double v : x) m += v;
  m /= static_cast<double>(x.size());
  for (double v : x) var += (v - m) * (v - m);
  var /= static_cast<double>(x.size());
  double r = 1 / std::sqrt(var + eps);
  std::vector<double> y;
  for (size_t j = 0; j < x.size(); ++j)
    y.push_back((x[j] - m) * r * (w.empty() ? 1.0 : w[j]) + (b.empty() ? 0.0 : b[j]));
  return y;
}

}  // namespace

TEST_CASE("softmax and log_softmax match a naive loop over any dim", "[cpu]") {
  Tensor x = rand({3, 5, 7}, DType::kF64, 1, -3, 3);
  for (int dim = 0; dim < 3; ++dim) {
    for (bool log : {false, true}) {
      Tensor ref = ref_along(x, dim, [log](const auto& r) { return ref_softmax(r, log); });
      Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
      REQUIRE(y.shape() == x.shape());
      REQUIRE_CLOSE(y, ref, 1e-12, 1e-12);
      REQUIRE_CLOSE(log ? log_softmax(noncontig(x), dim - 3) : softmax(noncontig(x), dim - 3), ref, 1e-12, 1e-12);
      Tensor xf = x.to(DType::kF32);
      REQUIRE_CLOSE(log ? log_softmax(xf, dim) : softmax(xf, dim), ref, 1e-5, 1e-6);
      Tensor xb = x.to(DType::kBF16);
      Tensor yb = log ? log_softmax(xb, dim) : softmax(xb, dim);
      REQUIRE(yb.dtype() == DType::kBF16);
      REQUIRE_CLOSE(yb, ref_along(xb, dim, [log](const auto& r) { return ref_softmax(r, log); }), 1e-2, 1e-2);
    }
  }
}

TEST_CASE("softmax is stable for large values and handles -inf and 0-D", "[cpu]") {
  Tensor x = from_vector<double>({1000, 1001, 1002, -1000, -1001, -1002}, {2, 3}).to(DType::kF32);
  std::vector<double> r0 = ref_softmax({1000, 1001, 1002}, false), r1 = ref_softmax({-1000, -1001, -1002}, false);
  std::vector<double> ref = r0;
  ref.insert(ref.end(), r1.begin(), r1.end());
  REQUIRE_CLOSE(softmax(x, 1), ref, 1e-5, 1e-7);
  std::vector<double> l0 = ref_softmax({1000, 1001, 1002}, true), l1 = ref_softmax({-1000, -1001, -1002}, true);
  l0.insert(l0.end(), l1.begin(), l1.end());
  REQUIRE_CLOSE(log_softmax(x, 1), l0, 1e-5, 1e-5);
  Tensor m = from_vector<double>({0, -INFINITY, 1}, {3});
  REQUIRE_CLOSE(softmax(m, 0), ref_softmax({0, -INFINITY, 1}, false), 1e-12, 1e-12);
  REQUIRE(softmax(scalar_tensor(3.0, DType::kF64), 0).item() == 1.0);
  REQUIRE(softmax(rand({0, 4}), 1).shape() == Shape{0, 4});
}

TEST_CASE("rms_norm and layer_norm match a naive loop", "[cpu]") {
  Tensor x = rand({3, 5, 7}, DType::kF64, 1, -2, 2);
  Tensor w = rand({7}, DType::kF64, 2), b = rand({7}, DType::kF64, 3);
  for (const Tensor& wt : {w, Tensor()}) {
    std::vector<double> vw = values(wt);
    Tensor ref = ref_along(x, 2, [&](const auto& r) { return ref_rms(r, vw, 1e-6); });
    REQUIRE_CLOSE(rms_norm(x, wt), ref, 1e-12, 1e-12);
    REQUIRE_CLOSE(rms_norm(noncontig(x), wt.defined() ? noncontig(wt) : wt), ref, 1e-12, 1e-12);
    REQUIRE_CLOSE(rms_norm(x.to(DType::kF32), wt.defined() ? wt.to(DType::kF32) : wt), ref, 1e-5, 1e-5);
    Tensor xb = x.to(DType::kBF16);
    Tensor yb = rms_norm(xb, wt.defined() ? wt.to(DType::kBF16) : wt);
    REQUIRE(yb.dtype() == DType::kBF16);
    REQUIRE_CLOSE(yb, ref, 2e-2, 2e-2);
    for (const Tensor& bt : {b, Tensor()}) {
      std::vector<double> vb = values(bt);
      Tensor lref = ref_along(x, 2, [&](const auto& r) { return ref_ln(r, vw, vb, 1e-5); });
      REQUIRE_CLOSE(layer_norm(x, wt, bt), lref, 1e-12, 1e-12);
      REQUIRE_CLOSE(layer_norm(noncontig(x).transpose(0, 1).contiguous().transpose(0, 1), wt, bt), lref, 1e-12, 1e-12);
      REQUIRE_CLOSE(layer_norm(x.to(DType::kF32), wt, bt), lref, 1e-5, 1e-5);  // f64 weight takes x's dtype
      Tensor lb = layer_norm(xb, wt, bt);
      REQUIRE(lb.dtype() == DType::kBF16);
      REQUIRE_CLOSE(lb, lref, 2e-2, 3e-2);
    }
  }
  // eps matters for small rows; a 1-D input is a single row.
  Tensor tiny = from_vector<double>({1e-3, -1e-3}, {2});
  REQUIRE_CLOSE(rms_norm(tiny, Tensor(), 1e-2), ref_rms({1e-3, -1e-3}, {}, 1e-2), 1e-12, 1e-14);
  REQUIRE_CLOSE(layer_norm(tiny, Tensor(), Tensor(), 0.5), ref_ln({1e-3, -1e-3}, {}, {}, 0.5), 1e-12, 1e-14);
  // layer_norm with a large offset: the two-pass variance does not cancel.
  Tensor off = add(rand({4, 9}, DType::kF32, 5), 1e4);
  REQUIRE_CLOSE(layer_norm(off, Tensor(), Tensor()),
                ref_along(off, 1, [](const auto& r) { return ref_ln(r, {}, {}, 1e-5); }), 2e-3, 2e-3);
}

TEST_CASE("softmax and log_softmax gradients by finite differences", "[cpu]") {
  Tensor x = noncontig(rand({3, 4, 5}, DType::kF64, 1)).requires_grad_();
  for (int64_t dim : {-1, 0, 1}) {
    REQUIRE_GRADCHECK([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {x});
    REQUIRE_GRADCHECK([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {x});
  }
}

TEST_CASE("rms_norm and layer_norm gradients by finite differences", "[cpu]") {
  Tensor x = noncontig(rand({3, 4, 5}, DType::kF64, 1)).requires_grad_();
  Tensor w = noncontig(rand({5}, DType::kF64, 2, 0.5, 1.5)).requires_grad_();
  Tensor b = rand({5}, DType::kF64, 3).requires_grad_();
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-3); }, {x, w});
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return rms_norm(in[0], Tensor(), 1e-3); }, {x});
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); },
                    {rand({4, 5}, DType::kF64, 4), w});  // weight only
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2], 1e-3); }, {x, w, b});
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], Tensor(), 1e-3); }, {x, w});
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), in[1], 1e-3); }, {x, b});
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-3); }, {x});
  // Weight and bias only (x constant), and more columns than one column block of the kernel.
  Tensor wx = rand({70}, DType::kF64, 5).requires_grad_(), bx = rand({70}, DType::kF64, 6).requires_grad_();
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); },
                    {rand({3, 70}, DType::kF64, 7), wx, bx});
}

TEST_CASE("norm backward in f32 and bf16 agrees with f64", "[cpu]") {
  Tensor x64 = rand({33, 130}, DType::kF64, 1, -2, 2), w64 = rand({130}, DType::kF64, 2), b64 = rand({130}, DType::kF64, 3);
  Tensor gy = rand({33, 130}, DType::kF64, 4);
  auto grads = [&](DType dt, bool layer) {
    Tensor x = x64.to(dt).detach().requires_grad_(), w = w64.to(dt).detach().requires_grad_();
    Tensor b = b64.to(dt).detach().requires_grad_();
    Tensor y = layer ? layer_norm(x, w, b) : rms_norm(x, w);
    sum(mul(y, gy.to(dt))).backward();
    std::vector<Tensor> g{x.grad(), w.grad()};
    if (layer) g.push_back(b.grad());
    return g;
  };
  for (bool layer : {false, true}) {
    auto ref = grads(DType::kF64, layer), f32 = grads(DType::kF32, layer), bf = grads(DType::kBF16, layer);
    for (size_t i = 0; i < ref.size(); ++i) {
      REQUIRE(f32[i].dtype() == DType::kF32);
      REQUIRE(bf[i].dtype() == DType::kBF16);
      REQUIRE_CLOSE(f32[i], ref[i], 1e-4, 1e-4);
      REQUIRE_CLOSE(bf[i], ref[i], 5e-2, 0.3);  // bf16 inputs and gradient: ~3 significant digits
    }
  }
}

TEST_CASE("norm weight gradients do not depend on the thread count", "[cpu]") {
#ifdef _OPENMP
  Tensor x = rand({4000, 96}, DType::kF32, 1), w = rand({96}, DType::kF32, 2), b = rand({96}, DType::kF32, 3);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Tensor wl = w.clone().requires_grad_(), bl = b.clone().requires_grad_(), wr = w.clone().requires_grad_();
    sum(mul(layer_norm(x, wl, bl), x)).backward();
    sum(mul(rms_norm(x, wr), x)).backward();
    return std::vector<std::vector<float>>{wl.grad().to_vector<float>(), bl.grad().to_vector<float>(),
                                           wr.grad().to_vector<float>()};
  };
  const int prev = omp_get_max_threads();
  auto one = run(1), many = run(3);
  omp_set_num_threads(prev);
  REQUIRE(one == many);
#endif
}

TEST_CASE("softmax and norms reject bad arguments", "[cpu]") {
  REQUIRE_THROWS_WITH(softmax(ones({2, 3}, DType::kI64), 1), Catch::Contains("softmax") && Catch::Contains("i64"));
  REQUIRE_THROWS_WITH(log_softmax(rand({2, 3}), 2), Catch::Contains("log_softmax"));
  Tensor x = rand({2, 3, 5});
  REQUIRE_THROWS_WITH(rms_norm(x, rand({4})), Catch::Contains("rms_norm") && Catch::Contains("[4]") &&
                                                  Catch::Contains("[2, 3, 5]"));
  REQUIRE_THROWS_WITH(rms_norm(x, rand({1, 5})), Catch::Contains("rms_norm") && Catch::Contains("[1, 5]"));
  REQUIRE_THROWS_WITH(layer_norm(x, rand({5}), rand({3})), Catch::Contains("layer_norm") && Catch::Contains("bias") &&
                                                                Catch::Contains("[3]"));
  REQUIRE_THROWS_WITH(layer_norm(x, rand({6}), Tensor()), Catch::Contains("layer_norm") && Catch::Contains("[6]"));
  REQUIRE_THROWS_WITH(layer_norm(ones({2, 3}, DType::kI32), Tensor(), Tensor()), Catch::Contains("layer_norm"));
  REQUIRE_THROWS_WITH(rms_norm(scalar_tensor(1.0), Tensor()), Catch::Contains("rms_norm"));
}

// The residual stream's gradient sum, fused (tensor/autograd.h, grad_accumulation_target): the
// result must have the bits of the out-of-place sum, with one add fewer; a gradient that something
// else holds (a hook kept it) is never written (tests/common/residual_norm.h).
TEST_CASE("rms_norm's backward adds into the skip connection's gradient with the unfused sum's bits", "[cpu]") {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64}) {
    INFO(dtype_name(dt));
    mt::testing::check_residual_norm_fusion(rand({6, 40}, dt, 31), rand({40}, dt, 32, 0.5, 1.5), rand({6, 40}, dt, 33));
  }
}
