// Cross-entropy: per-row losses against a naive log-sum-exp, the three reductions, ignore_index,
// stability with large logits, 16-bit logits, gradients and target/shape errors.
#include <cmath>

#include "testing.h"

using namespace mt;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

// Naive per-row losses of contiguous logits [N, V]; ignored rows give 0.
std::vector<double> ce_ref(const std::vector<double>& x, const std::vector<int64_t>& tgt, int64_t V,
                           int64_t ignore) {
  std::vector<double> out;
  for (size_t n = 0; n < tgt.size(); ++n) {
    if (tgt[n] == ignore) {
      out.push_back(0);
      continue;
    }
    double m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, x[n * V + v]);
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[n * V + v] - m);
    out.push_back(m + std::log(s) - x[n * V + tgt[n]]);
  }
  return out;
}

// Naive gradient of the mean loss.
std::vector<double> ce_grad_ref(const std::vector<double>& x, const std::vector<int64_t>& tgt, int64_t V,
                                int64_t ignore, double scale) {
  std::vector<double> g(x.size(), 0.0);
  for (size_t n = 0; n < tgt.size(); ++n) {
    if (tgt[n] == ignore) continue;
    double m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, x[n * V + v]);
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[n * V + v] - m);
    for (int64_t v = 0; v < V; ++v)
      g[n * V + v] = scale * (std::exp(x[n * V + v] - m) / s - (v == tgt[n] ? 1.0 : 0.0));
  }
  return g;
}

double total(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

const int64_t kV = 11;
// [3, 4] targets with three ignored (-100) rows.
const std::vector<int64_t> kTargets = {0, 10, -100, 5, 3, 3, -100, 7, 1, 9, -100, 2};

}  // namespace

TEST_CASE("cross_entropy values for every reduction", "[cpu]") {
  Tensor logits = rand({3, 4, kV}, DType::kF64, 1, -3, 3);
  Tensor target = from_vector<int64_t>(kTargets, {3, 4});
  auto ref = ce_ref(logits.to_vector<double>(), kTargets, kV, -100);

  Tensor none = cross_entropy(logits, target, -100, Reduction::kNone);
  REQUIRE(none.shape() == Shape{3, 4});
  REQUIRE(none.dtype() == DType::kF64);
  REQUIRE_CLOSE(none, ref, 1e-12, 1e-12);
  REQUIRE(cross_entropy(logits, target, -100, Reduction::kSum).item() == Approx(total(ref)).epsilon(1e-12));
  REQUIRE(cross_entropy(logits, target).item() == Approx(total(ref) / 9).epsilon(1e-12));

  // Non-contiguous logits, i32 targets, a non-default ignore_index.
  Tensor t32 = target.to(DType::kI32);
  std::vector<int64_t> t3 = kTargets;
  for (auto& t : t3)
    if (t == -100) t = 4;  // not ignored now
  Tensor target3 = from_vector<int64_t>(t3, {3, 4}, DType::kI32);
  auto ref_ig3 = ce_ref(logits.to_vector<double>(), t3, kV, 3);
  REQUIRE_CLOSE(cross_entropy(noncontig(logits), target3, 3, Reduction::kNone), ref_ig3, 1e-12, 1e-12);
  REQUIRE(cross_entropy(noncontig(logits), target3, 3).item() == Approx(total(ref_ig3) / 10).epsilon(1e-12));
  REQUIRE_CLOSE(cross_entropy(logits, t32, -100, Reduction::kNone), ref, 1e-12, 1e-12);

  // Transposed logits: [4, 3, V] viewed through a transpose.
  Tensor lt = logits.transpose(0, 1).contiguous().transpose(0, 1);
  REQUIRE_CLOSE(cross_entropy(lt, target, -100, Reduction::kNone), ref, 1e-12, 1e-12);
}

TEST_CASE("cross_entropy in f32 and 16-bit floats computes in f32", "[cpu]") {
  Tensor logits = rand({3, 4, kV}, DType::kF64, 2, -3, 3);
  Tensor target = from_vector<int64_t>(kTargets, {3, 4});
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor l = logits.to(dt);
    auto ref = ce_ref(l.to_vector<double>(), kTargets, kV, -100);  // on the rounded inputs
    Tensor none = cross_entropy(l, target, -100, Reduction::kNone);
    REQUIRE(none.dtype() == DType::kF32);
    REQUIRE_CLOSE(none, ref, 1e-5, 1e-5);
    Tensor mean = cross_entropy(l, target);
    REQUIRE(mean.dtype() == DType::kF32);
    REQUIRE(mean.item() == Approx(total(ref) / 9).epsilon(1e-5));

    Tensor lg = l.detach().requires_grad_();
    cross_entropy(lg, target).backward();
    REQUIRE(lg.grad().dtype() == dt);
    double tol = dt == DType::kF32 ? 1e-6 : 1e-2;
    REQUIRE_CLOSE(lg.grad(), ce_grad_ref(l.to_vector<double>(), kTargets, kV, -100, 1.0 / 9), tol, tol);
  }
}

TEST_CASE("cross_entropy is stable for large logits", "[cpu]") {
  Tensor base = rand({5, kV}, DType::kF64, 3, -3, 3);
  std::vector<int64_t> t = {1, 2, 3, 4, 5};
  Tensor target = from_vector<int64_t>(t, {5});
  auto ref = ce_ref(base.to_vector<double>(), t, kV, -100);
  REQUIRE_CLOSE(cross_entropy(add(base, 1000.0), target, -100, Reduction::kNone), ref, 1e-9, 1e-9);
  REQUIRE_CLOSE(cross_entropy(add(base, -1000.0).to(DType::kF32), target, -100, Reduction::kNone), ref, 1e-3,
                1e-3);
}

TEST_CASE("cross_entropy with 1-D logits and a 0-D target", "[cpu]") {
  Tensor logits = rand({kV}, DType::kF64, 4);
  Tensor target = scalar_tensor(6, DType::kI64);
  auto ref = ce_ref(logits.to_vector<double>(), {6}, kV, -100);
  REQUIRE(cross_entropy(logits, target, -100, Reduction::kNone).shape() == Shape{});
  REQUIRE(cross_entropy(logits, target).item() == Approx(ref[0]).epsilon(1e-12));
}

TEST_CASE("cross_entropy gradients", "[cpu]") {
  Tensor target = from_vector<int64_t>(kTargets, {3, 4});
  for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    Tensor logits = noncontig(rand({3, 4, kV}, DType::kF64, 5, -2, 2)).requires_grad_();
    REQUIRE_GRADCHECK([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], target, -100, red); },
                      {logits});
  }
  Tensor logits = rand({3, 4, kV}, DType::kF64, 6).requires_grad_();
  cross_entropy(logits, target).backward();
  REQUIRE_CLOSE(logits.grad(), ce_grad_ref(logits.to_vector<double>(), kTargets, kV, -100, 1.0 / 9), 1e-12, 1e-12);
  // Logits reached through a transpose get their gradient back in their own layout.
  Tensor lt = rand({4, 3, kV}, DType::kF64, 7).requires_grad_();
  REQUIRE_GRADCHECK([&](const std::vector<Tensor>& in) { return cross_entropy(in[0].transpose(0, 1), target); },
                    {lt});
}

TEST_CASE("cross_entropy with every target ignored", "[cpu]") {
  Tensor logits = rand({2, kV}, DType::kF64, 8).requires_grad_();
  Tensor target = from_vector<int64_t>({-100, -100}, {2});
  REQUIRE(std::isnan(cross_entropy(logits, target).item()));  // 0 / 0, like PyTorch
  Tensor s = cross_entropy(logits, target, -100, Reduction::kSum);
  REQUIRE(s.item() == 0);
  s.backward();
  REQUIRE_CLOSE(logits.grad(), zeros({2, kV}, DType::kF64), 0, 0);
}

TEST_CASE("cross_entropy errors name the op, the value and the shapes", "[cpu]") {
  Tensor logits = rand({3, 4, kV}, DType::kF32);
  Tensor target = from_vector<int64_t>(kTargets, {3, 4});
  std::vector<int64_t> bad = kTargets;
  bad[5] = 11;
  REQUIRE_THROWS_WITH(cross_entropy(logits, from_vector<int64_t>(bad, {3, 4})),
                      Catch::Contains("cross_entropy") && Catch::Contains("11") && Catch::Contains("11 classes"));
  bad[5] = -1;
  REQUIRE_THROWS_WITH(cross_entropy(logits, from_vector<int64_t>(bad, {3, 4})),
                      Catch::Contains("cross_entropy") && Catch::Contains("-1"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, target.reshape({4, 3})),
                      Catch::Contains("cross_entropy") && Catch::Contains("[4, 3]") && Catch::Contains("[3, 4, 11]"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, target.to(DType::kF32)),
                      Catch::Contains("cross_entropy") && Catch::Contains("f32"));
  REQUIRE_THROWS_WITH(cross_entropy(target, target), Catch::Contains("cross_entropy") && Catch::Contains("i64"));
}

TEST_CASE("cross_entropy on sizes that run in parallel", "[cpu]") {
  const int64_t N = 4099, V = 37;
  Tensor logits = rand({N, V}, DType::kF32, 9, -4, 4);
  std::vector<int64_t> t(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) t[static_cast<size_t>(n)] = n % 5 == 0 ? -100 : (n * 7) % V;
  Tensor target = from_vector<int64_t>(t, {N});
  auto ref = ce_ref(logits.to_vector<double>(), t, V, -100);
  REQUIRE_CLOSE(cross_entropy(logits, target, -100, Reduction::kNone), ref, 1e-5, 1e-5);
  Tensor lg = logits.detach().requires_grad_();
  cross_entropy(lg, target, -100, Reduction::kSum).backward();
  REQUIRE_CLOSE(lg.grad(), ce_grad_ref(logits.to_vector<double>(), t, V, -100, 1.0), 1e-6, 1e-6);
}
