// Pointwise ops against naive std:: references: broadcasting, non-contiguous inputs, dtypes,
// scalar forms, comparisons, where/masked_fill, clamp, gradchecks and error messages.
#include <cmath>
#include <functional>
#include <limits>

#include "runtime/error.h"
#include "testing.h"

using namespace mt;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

using F1 = std::function<double(double)>;
using F2 = std::function<double(double, double)>;
using V = std::vector<Tensor>;

std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }

// Naive numpy broadcasting: out[idx] = f(a[idx'], b[idx'']).
Tensor ref_binary(const Tensor& a, const Tensor& b, const F2& f) {
  int n = std::max(a.dim(), b.dim());
  Shape out = Shape::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    int ia = i - (n - a.dim()), ib = i - (n - b.dim());
    int64_t da = ia >= 0 ? a.shape()[ia] : 1, db = ib >= 0 ? b.shape()[ib] : 1;
    out[i] = da == 1 ? db : da;
  }
  std::vector<double> va = vals(a), vb = vals(b), r(static_cast<size_t>(out.numel()));
  for (int64_t flat = 0; flat < out.numel(); ++flat) {
    int64_t rem = flat, oa = 0, ob = 0, sa = 1, sb = 1;
    for (int i = n - 1; i >= 0; --i) {
      int64_t idx = rem % out[i];
      rem /= out[i];
      int ia = i - (n - a.dim()), ib = i - (n - b.dim());
      if (ia >= 0) {
        if (a.shape()[ia] != 1) oa += idx * sa;
        sa *= a.shape()[ia];
      }
      if (ib >= 0) {
        if (b.shape()[ib] != 1) ob += idx * sb;
        sb *= b.shape()[ib];
      }
    }
    r[static_cast<size_t>(flat)] = f(va[static_cast<size_t>(oa)], vb[static_cast<size_t>(ob)]);
  }
  return from_vector<double>(r, out);
}

Tensor ref_unary(const Tensor& x, const F1& f) {
  std::vector<double> v = vals(x);
  for (auto& e : v) e = f(e);
  return from_vector<double>(v, x.shape());
}

double tol_for(DType t) { return t == DType::kF64 ? 1e-12 : t == DType::kF32 ? 2e-6 : 1e-2; }

constexpr double kSqrt2OverPi = 0.7978845608028654;
double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) { return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x))); }
double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  F1 ref;
  double lo, hi;  // input domain
};

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, -3, 3},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 0.1, 5},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0.1, 5},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, 0.1, 5},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); }, -3, 3},
      {"sign", [](const Tensor& x) { return sign(x); }, [](double x) { return double((x > 0) - (x < 0)); }, -3, 3},
      {"sin", [](const Tensor& x) { return sin(x); }, [](double x) { return std::sin(x); }, -4, 4},
      {"cos", [](const Tensor& x) { return cos(x); }, [](double x) { return std::cos(x); }, -4, 4},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, [](double x) { return 1 / x; }, 0.2, 3},
      {"square", [](const Tensor& x) { return square(x); }, [](double x) { return x * x; }, -3, 3},
      {"pow3", [](const Tensor& x) { return pow(x, 3.0); }, [](double x) { return x * x * x; }, -2, 2},
      {"pow0.5", [](const Tensor& x) { return pow(x, 0.5); }, [](double x) { return std::sqrt(x); }, 0.1, 4},
      {"pow-1.5", [](const Tensor& x) { return pow(x, -1.5); }, [](double x) { return std::pow(x, -1.5); }, 0.2, 4},
      {"pow1", [](const Tensor& x) { return pow(x, 1.0); }, [](double x) { return x; }, -2, 2},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0; }, -3, 3},
      {"gelu", [](const Tensor& x) { return gelu(x); }, gelu_ref, -4, 4},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::kTanh); }, gelu_tanh_ref, -4, 4},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * sigmoid_ref(x); }, -5, 5},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, sigmoid_ref, -6, 6},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -3, 3},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.7); }, [](double x) { return std::min(std::max(x, -0.5), 0.7); }, -2, 2},
      {"clamp_lo", [](const Tensor& x) { return clamp(x, 0.25); }, [](double x) { return std::max(x, 0.25); }, -2, 2},
      {"clamp_hi", [](const Tensor& x) { return clamp(x, -kNoBound, -0.25); }, [](double x) { return std::min(x, -0.25); }, -2, 2},
      {"add_s", [](const Tensor& x) { return x + 1.5; }, [](double x) { return x + 1.5; }, -2, 2},
      {"sub_s", [](const Tensor& x) { return x - 1.5; }, [](double x) { return x - 1.5; }, -2, 2},
      {"rsub_s", [](const Tensor& x) { return 1.5 - x; }, [](double x) { return 1.5 - x; }, -2, 2},
      {"mul_s", [](const Tensor& x) { return x * -2.5; }, [](double x) { return x * -2.5; }, -2, 2},
      {"mul_s_left", [](const Tensor& x) { return 3.0 * x; }, [](double x) { return 3 * x; }, -2, 2},
      {"add_s_left", [](const Tensor& x) { return 3.0 + x; }, [](double x) { return 3 + x; }, -2, 2},
      {"div_s", [](const Tensor& x) { return x / 3.0; }, [](double x) { return x / 3; }, -2, 2},
      {"unary_minus", [](const Tensor& x) { return -x; }, [](double x) { return -x; }, -2, 2},
  };
}

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  F2 ref;
  double lo, hi;
};

std::vector<BinaryCase> binary_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }, -2, 2},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }, -2, 2},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }, -2, 2},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }, 0.3, 2},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, [](double a, double b) { return std::max(a, b); }, -2, 2},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, [](double a, double b) { return std::min(a, b); }, -2, 2},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, [](double a, double b) { return std::pow(a, b); }, 0.3, 2},
  };
}

}  // namespace

TEST_CASE("unary ops match std:: on f64, f32, bf16, f16, contiguous and not", "[cpu]") {
  for (const auto& c : unary_cases()) {
    for (DType t : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}) {
      INFO(c.name << " " << dtype_name(t));
      Tensor x = rand({3, 17, 5}, t, 11, c.lo, c.hi);
      Tensor ref = ref_unary(x, c.ref);
      double tol = tol_for(t);
      Tensor y = c.op(x);
      REQUIRE(y.dtype() == t);
      REQUIRE_CLOSE(y, ref, tol, tol);
      REQUIRE_CLOSE(c.op(noncontig(x)), ref, tol, tol);
      REQUIRE_CLOSE(c.op(x.transpose(0, 2)), ref.transpose(0, 2), tol, tol);
      REQUIRE_CLOSE(c.op(x.slice(1, 1, 17, 3)), ref.slice(1, 1, 17, 3), tol, tol);
    }
    // 0-d and empty.
    REQUIRE_CLOSE(c.op(scalar_tensor(0.75 * c.lo + 0.25 * c.hi, DType::kF64)),
                  ref_unary(scalar_tensor(0.75 * c.lo + 0.25 * c.hi, DType::kF64), c.ref), 1e-12, 1e-12);
    REQUIRE(c.op(empty({0, 3}, DType::kF64)).shape() == Shape{0, 3});
  }
}

TEST_CASE("large inputs run in parallel with the same results", "[cpu]") {
  Tensor x = rand({301, 257}, DType::kF32, 5);
  REQUIRE_CLOSE(exp(x), ref_unary(x, [](double v) { return std::exp(v); }), 2e-6, 0);
  REQUIRE_CLOSE(exp(x.t()), ref_unary(x, [](double v) { return std::exp(v); }).t(), 2e-6, 0);
  Tensor y = rand({257}, DType::kF32, 6);
  REQUIRE_CLOSE(x * y, ref_binary(x, y, [](double a, double b) { return a * b; }), 1e-6, 0);
  Tensor col = rand({301, 1}, DType::kF32, 7);
  REQUIRE_CLOSE(x.t() + col.t(), ref_binary(x.t(), col.t(), [](double a, double b) { return a + b; }), 1e-6, 1e-7);
}

TEST_CASE("binary ops match std:: with broadcasting and non-contiguous inputs", "[cpu]") {
  for (const auto& c : binary_cases()) {
    for (DType t : {DType::kF64, DType::kF32, DType::kBF16}) {
      INFO(c.name << " " << dtype_name(t));
      double tol = tol_for(t);
      Tensor a = rand({3, 1, 5}, t, 21, c.lo, c.hi);
      Tensor b = rand({4, 1}, t, 22, c.lo, c.hi);
      Tensor r = c.op(a, b);
      REQUIRE(r.shape() == Shape{3, 4, 5});
      REQUIRE(r.dtype() == t);
      REQUIRE_CLOSE(r, ref_binary(a, b, c.ref), tol, tol);
      REQUIRE_CLOSE(c.op(b, a), ref_binary(b, a, c.ref), tol, tol);
      // Same shapes, non-contiguous, transposed.
      Tensor x = rand({6, 7}, t, 23, c.lo, c.hi), y = rand({6, 7}, t, 24, c.lo, c.hi);
      REQUIRE_CLOSE(c.op(noncontig(x), y), ref_binary(x, y, c.ref), tol, tol);
      REQUIRE_CLOSE(c.op(x.t(), noncontig(y).t()), ref_binary(x, y, c.ref).t(), tol, tol);
      // Tensor with 0-d tensor, both ways.
      Tensor s = rand({}, t, 25, c.lo, c.hi);
      REQUIRE_CLOSE(c.op(x, s), ref_binary(x, s, c.ref), tol, tol);
      REQUIRE_CLOSE(c.op(s, x), ref_binary(s, x, c.ref), tol, tol);
      REQUIRE(c.op(s, s).dim() == 0);
      // Broadcast against an expanded view and a row.
      Tensor row = rand({7}, t, 26, c.lo, c.hi);
      REQUIRE_CLOSE(c.op(x, row.expand({6, 7})), ref_binary(x, row, c.ref), tol, tol);
      REQUIRE_CLOSE(c.op(row, noncontig(x)), ref_binary(row, x, c.ref), tol, tol);
      // Empty broadcasts.
      REQUIRE(c.op(empty({0, 1}, t), row).shape() == Shape{0, 7});
    }
  }
}

TEST_CASE("mixed dtypes promote", "[cpu]") {
  Tensor a = rand({4}, DType::kF32, 1), b = rand({4}, DType::kF64, 2);
  REQUIRE((a + b).dtype() == DType::kF64);
  REQUIRE_CLOSE(a * b, ref_binary(a, b, [](double x, double y) { return x * y; }), 1e-12, 0);
  Tensor h = rand({4}, DType::kBF16, 3), f = rand({4}, DType::kF16, 4);
  REQUIRE((h + f).dtype() == DType::kF32);
  REQUIRE_CLOSE(h + f, ref_binary(h, f, [](double x, double y) { return x + y; }), 1e-6, 1e-7);
  Tensor i = from_vector<int64_t>({1, -2, 3, 4}, {4});
  REQUIRE((i * a).dtype() == DType::kF32);
  REQUIRE_CLOSE(i * a, ref_binary(i, a, [](double x, double y) { return x * y; }), 1e-6, 0);
}

TEST_CASE("integer arithmetic", "[cpu]") {
  Tensor a = from_vector<int64_t>({7, -7, 3, 0, 100}, {5});
  Tensor b = from_vector<int64_t>({2, 2, -4, 5, 7}, {5});
  REQUIRE((a + b).dtype() == DType::kI64);
  REQUIRE((a + b).to_vector<int64_t>() == std::vector<int64_t>{9, -5, -1, 5, 107});
  REQUIRE((a - b).to_vector<int64_t>() == std::vector<int64_t>{5, -9, 7, -5, 93});
  REQUIRE((a * b).to_vector<int64_t>() == std::vector<int64_t>{14, -14, -12, 0, 700});
  REQUIRE(maximum(a, b).to_vector<int64_t>() == std::vector<int64_t>{7, 2, 3, 5, 100});
  REQUIRE(minimum(a, b).to_vector<int64_t>() == std::vector<int64_t>{2, -7, -4, 0, 7});
  // True division gives f32.
  Tensor q = a / b;
  REQUIRE(q.dtype() == DType::kF32);
  REQUIRE_CLOSE(q, std::vector<double>{3.5, -3.5, -0.75, 0, 100.0 / 7}, 1e-6, 0);
  REQUIRE((a / 2.0).dtype() == DType::kF32);
  REQUIRE_CLOSE(a / 2.0, std::vector<double>{3.5, -3.5, 1.5, 0, 50}, 1e-6, 0);
  // Scalars: integral scalars keep the dtype, fractional ones give f32.
  REQUIRE((a + 2.0).dtype() == DType::kI64);
  REQUIRE((a + 2.0).to_vector<int64_t>() == std::vector<int64_t>{9, -5, 5, 2, 102});
  REQUIRE((a * 3.0).to_vector<int64_t>() == std::vector<int64_t>{21, -21, 9, 0, 300});
  REQUIRE((10.0 - a).to_vector<int64_t>() == std::vector<int64_t>{3, 17, 7, 10, -90});
  REQUIRE((a + 0.5).dtype() == DType::kF32);
  REQUIRE_CLOSE(a + 0.5, std::vector<double>{7.5, -6.5, 3.5, 0.5, 100.5}, 0, 0);
  REQUIRE_CLOSE(a * 0.5, std::vector<double>{3.5, -3.5, 1.5, 0, 50}, 0, 0);
  // Large i64 values stay exact.
  int64_t big = (int64_t{1} << 55) + 1;
  Tensor bt = from_vector<int64_t>({big}, {1});
  REQUIRE((bt + 1.0).to_vector<int64_t>()[0] == big + 1);
  REQUIRE((bt + bt).to_vector<int64_t>()[0] == 2 * big);
  REQUIRE((bt * 2.0).to_vector<int64_t>()[0] == 2 * big);
  REQUIRE(neg(bt).to_vector<int64_t>()[0] == -big);
  REQUIRE(clamp(bt, 0).to_vector<int64_t>()[0] == big);
  REQUIRE(clamp(bt, -kNoBound, 5).to_vector<int64_t>()[0] == 5);
  // i32 and u8 keep their dtype; mixed promote.
  Tensor c = from_vector<int32_t>({1, 2, 3}, {3});
  REQUIRE((c + c).dtype() == DType::kI32);
  REQUIRE((c + from_vector<int64_t>({1, 1, 1}, {3})).dtype() == DType::kI64);
  Tensor u = from_vector<uint8_t>({250, 3, 0}, {3});
  REQUIRE((u + from_vector<uint8_t>({10, 1, 0}, {3})).to_vector<uint8_t>() == std::vector<uint8_t>{4, 4, 0});
  REQUIRE(abs(from_vector<int32_t>({-3, 4}, {2})).to_vector<int32_t>() == std::vector<int32_t>{3, 4});
  REQUIRE(neg(c).to_vector<int32_t>() == std::vector<int32_t>{-1, -2, -3});
  REQUIRE(relu(from_vector<int32_t>({-3, 4}, {2})).to_vector<int32_t>() == std::vector<int32_t>{0, 4});
  REQUIRE(sign(from_vector<int64_t>({-3, 0, 4}, {3})).to_vector<int64_t>() == std::vector<int64_t>{-1, 0, 1});
  REQUIRE(clamp(from_vector<int32_t>({-3, 0, 4}, {3}), -1, 2).to_vector<int32_t>() == std::vector<int32_t>{-1, 0, 2});
  // Floating math on integers computes in f32.
  REQUIRE(exp(c).dtype() == DType::kF32);
  REQUIRE_CLOSE(sqrt(c), std::vector<double>{1, std::sqrt(2.0), std::sqrt(3.0)}, 1e-6, 0);
  // Bool arithmetic: add is logical or; bool + scalar gives i64.
  Tensor t = from_vector<uint8_t>({0, 1, 1}, {3}).to(DType::kBool);
  Tensor f = from_vector<uint8_t>({0, 0, 1}, {3}).to(DType::kBool);
  REQUIRE((t + f).dtype() == DType::kBool);
  REQUIRE((t + f).to_vector<uint8_t>() == std::vector<uint8_t>{0, 1, 1});
  REQUIRE((t + 1.0).dtype() == DType::kI64);
  REQUIRE((t + 1.0).to_vector<int64_t>() == std::vector<int64_t>{1, 2, 2});
  REQUIRE((t * f).to_vector<uint8_t>() == std::vector<uint8_t>{0, 0, 1});
}

TEST_CASE("comparisons and logical ops", "[cpu]") {
  struct Cmp {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> op;
    std::function<Tensor(const Tensor&, double)> sop;
    std::function<bool(double, double)> ref;
  };
  std::vector<Cmp> cmps = {
      {"eq", [](auto& a, auto& b) { return eq(a, b); }, [](auto& a, double s) { return eq(a, s); }, [](double a, double b) { return a == b; }},
      {"ne", [](auto& a, auto& b) { return ne(a, b); }, [](auto& a, double s) { return ne(a, s); }, [](double a, double b) { return a != b; }},
      {"lt", [](auto& a, auto& b) { return lt(a, b); }, [](auto& a, double s) { return lt(a, s); }, [](double a, double b) { return a < b; }},
      {"le", [](auto& a, auto& b) { return le(a, b); }, [](auto& a, double s) { return le(a, s); }, [](double a, double b) { return a <= b; }},
      {"gt", [](auto& a, auto& b) { return gt(a, b); }, [](auto& a, double s) { return gt(a, s); }, [](double a, double b) { return a > b; }},
      {"ge", [](auto& a, auto& b) { return ge(a, b); }, [](auto& a, double s) { return ge(a, s); }, [](double a, double b) { return a >= b; }},
      {"and", [](auto& a, auto& b) { return logical_and(a, b); }, nullptr, [](double a, double b) { return a != 0 && b != 0; }},
      {"or", [](auto& a, auto& b) { return logical_or(a, b); }, nullptr, [](double a, double b) { return a != 0 || b != 0; }},
  };
  // Small integers in floating tensors make ties frequent.
  std::vector<double> av = {0, 1, 2, -1, 2, 0, 3, -2, 1, 1, 0, 2, 5, -3, 2};
  for (const auto& c : cmps) {
    for (DType t : {DType::kF64, DType::kF32, DType::kBF16, DType::kI64, DType::kI32, DType::kU8}) {
      INFO(c.name << " " << dtype_name(t));
      std::vector<double> aa = av;
      if (t == DType::kU8)
        for (auto& e : aa) e = std::fabs(e);
      Tensor a = from_vector<double>(aa, {3, 1, 5}, t);
      Tensor b = from_vector<double>({1, 0, 2, 5}, {4, 1}, t);
      Tensor r = c.op(a, b);
      REQUIRE(r.dtype() == DType::kBool);
      REQUIRE(r.shape() == Shape{3, 4, 5});
      Tensor ref = ref_binary(a, b, [&](double x, double y) { return double(c.ref(x, y)); });
      REQUIRE(vals(r) == vals(ref));
      REQUIRE(vals(c.op(noncontig(a), b)) == vals(ref));
      if (c.sop) {
        for (double s : {1.0, 0.0, 1.5, -0.5, 2.0}) {
          INFO("scalar " << s);
          REQUIRE(vals(c.sop(a, s)) == vals(ref_unary(a, [&](double x) { return double(c.ref(x, s)); })));
        }
      }
    }
  }
  // Scalars outside the tensor's integer range compare by value, not after wrapping.
  Tensor u = from_vector<uint8_t>({44, 255, 0}, {3});
  REQUIRE(eq(u, 300.0).to_vector<uint8_t>() == std::vector<uint8_t>{0, 0, 0});
  REQUIRE(lt(u, 256.0).to_vector<uint8_t>() == std::vector<uint8_t>{1, 1, 1});
  REQUIRE(gt(u, -1.0).to_vector<uint8_t>() == std::vector<uint8_t>{1, 1, 1});
  Tensor i = from_vector<int32_t>({5, -5}, {2});
  REQUIRE(lt(i, 1e30).to_vector<uint8_t>() == std::vector<uint8_t>{1, 1});
  REQUIRE(gt(i, -1e30).to_vector<uint8_t>() == std::vector<uint8_t>{1, 1});
  REQUIRE(eq(i, 4294967301.0).to_vector<uint8_t>() == std::vector<uint8_t>{0, 0});  // 2^32 + 5
  Tensor bl = from_vector<uint8_t>({0, 1}, {2}).to(DType::kBool);
  REQUIRE(eq(bl, 2.0).to_vector<uint8_t>() == std::vector<uint8_t>{0, 0});
  REQUIRE(eq(bl, 1.0).to_vector<uint8_t>() == std::vector<uint8_t>{0, 1});
  REQUIRE(lt(bl, 0.5).to_vector<uint8_t>() == std::vector<uint8_t>{1, 0});
  // NaN compares unequal to everything, including itself.
  Tensor n = from_vector<double>({std::nan(""), 1}, {2});
  REQUIRE(eq(n, n).to_vector<uint8_t>() == std::vector<uint8_t>{0, 1});
  REQUIRE(ne(n, n).to_vector<uint8_t>() == std::vector<uint8_t>{1, 0});
  REQUIRE(lt(n, 2.0).to_vector<uint8_t>() == std::vector<uint8_t>{0, 1});
  // logical_not on every dtype.
  REQUIRE(logical_not(from_vector<double>({0, -2, 0.5}, {3})).to_vector<uint8_t>() == std::vector<uint8_t>{1, 0, 0});
  REQUIRE(logical_not(bl).to_vector<uint8_t>() == std::vector<uint8_t>{1, 0});
  REQUIRE(logical_not(noncontig(from_vector<int64_t>({0, 3, 0, 0}, {2, 2}))).to_vector<uint8_t>() ==
          std::vector<uint8_t>{1, 0, 1, 1});
  REQUIRE(logical_not(bl).dtype() == DType::kBool);
  // Comparisons are not differentiable.
  Tensor x = rand({3}).requires_grad_();
  REQUIRE_FALSE(gt(x, 0.0).requires_grad());
  REQUIRE_FALSE(eq(x, x).requires_grad());
}

TEST_CASE("maximum/minimum propagate NaN", "[cpu]") {
  Tensor a = from_vector<double>({std::nan(""), 1, 2}, {3});
  Tensor b = from_vector<double>({0, std::nan(""), 1}, {3});
  std::vector<double> mx = vals(maximum(a, b)), mn = vals(minimum(a, b));
  REQUIRE(std::isnan(mx[0]));
  REQUIRE(std::isnan(mx[1]));
  REQUIRE(mx[2] == 2);
  REQUIRE(std::isnan(mn[0]));
  REQUIRE(std::isnan(mn[1]));
  REQUIRE(mn[2] == 1);
  REQUIRE(std::isnan(vals(clamp(a, 0, 1))[0]));
  REQUIRE(std::isnan(vals(relu(a))[0]) == false);  // relu(NaN): NaN > 0 is false
}

TEST_CASE("where and masked_fill", "[cpu]") {
  Tensor cond = from_vector<uint8_t>({1, 0, 0, 1}, {4, 1}).to(DType::kBool);
  Tensor a = rand({3, 1, 5}, DType::kF64, 1);
  Tensor b = rand({5}, DType::kF64, 2);
  Tensor w = where(cond, a, b);
  REQUIRE(w.shape() == Shape{3, 4, 5});
  std::vector<double> va = vals(a), vb = vals(b), vw = vals(w);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 5; ++k) {
        bool c = j == 0 || j == 3;
        REQUIRE(vw[(i * 4 + j) * 5 + k] == (c ? va[i * 5 + k] : vb[k]));
      }
  REQUIRE(vals(where(noncontig(cond), noncontig(a), b)) == vw);
  // Promotion and the scalar form.
  Tensor wi = where(cond, from_vector<int64_t>({1, 2, 3, 4}, {4, 1}), from_vector<float>({9.5f}, {1}));
  REQUIRE(wi.dtype() == DType::kF32);
  REQUIRE(vals(wi) == std::vector<double>{1, 9.5, 9.5, 4});
  REQUIRE(vals(where(cond, from_vector<double>({1, 2, 3, 4}, {4, 1}), -1.0)) == std::vector<double>{1, -1, -1, 4});
  // masked_fill.
  Tensor x = rand({4, 3}, DType::kF32, 3);
  Tensor m = masked_fill(x, cond, -100);
  std::vector<double> vx = vals(x), vm = vals(m);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) REQUIRE(vm[i * 3 + j] == ((i == 0 || i == 3) ? -100 : vx[i * 3 + j]));
  REQUIRE(m.dtype() == DType::kF32);
  REQUIRE(vals(masked_fill(x.t(), cond.t(), 7).t()) == vals(masked_fill(x, cond, 7)));
  REQUIRE(vals(masked_fill(x, cond, -kNoBound))[0] == -std::numeric_limits<double>::infinity());
  // Errors.
  REQUIRE_THROWS_WITH(where(ones({4, 1}), a, b), Catch::Contains("where") && Catch::Contains("bool"));
  REQUIRE_THROWS_WITH(where(cond, rand({3, 2}), b), Catch::Contains("where") && Catch::Contains("[3, 2]"));
  REQUIRE_THROWS_WITH(masked_fill(x, ones({4, 1}), 0), Catch::Contains("masked_fill") && Catch::Contains("bool"));
  REQUIRE_THROWS_WITH(masked_fill(x, cond.expand({2, 4, 3}), 0),
                      Catch::Contains("masked_fill") && Catch::Contains("[2, 4, 3]"));
  REQUIRE_THROWS_WITH(masked_fill(x, ones({5}, DType::kBool), 0), Catch::Contains("masked_fill") && Catch::Contains("[5]"));
}

TEST_CASE("clamp", "[cpu]") {
  Tensor x = from_vector<double>({-2, -0.5, 0, 0.5, 2}, {5});
  REQUIRE(vals(clamp(x, -1, 1)) == std::vector<double>{-1, -0.5, 0, 0.5, 1});
  REQUIRE(vals(clamp(x, 0)) == std::vector<double>{0, 0, 0, 0.5, 2});
  REQUIRE(vals(clamp(x, -kNoBound, 0)) == std::vector<double>{-2, -0.5, 0, 0, 0});
  REQUIRE(vals(clamp(x, 0.25, 0.25)) == std::vector<double>(5, 0.25));
  REQUIRE(vals(clamp(x)) == vals(x));
  REQUIRE_THROWS_WITH(clamp(x, 1, -1), Catch::Contains("clamp") && Catch::Contains("1") && Catch::Contains("-1"));
}

TEST_CASE("gradcheck every differentiable pointwise op (f64, non-contiguous)", "[cpu]") {
  for (const auto& c : unary_cases()) {
    INFO(c.name);
    // Keep away from kinks (abs/relu at 0, clamp bounds) where finite differences disagree.
    Tensor x = noncontig(rand({3, 4}, DType::kF64, 31, c.lo, c.hi));
    {
      NoGradGuard ng;
      std::string n = c.name;
      if (n == "abs" || n == "relu" || n == "sign") x.copy_(add(x, mul(sign(x), 0.1)));
      if (n.rfind("clamp", 0) == 0) {
        for (double bound : {-0.5, 0.7, 0.25, -0.25}) {
          Tensor near = lt(abs(sub(x, bound)), 0.05);
          x.copy_(where(near, add(x, 0.1), x));
        }
      }
    }
    x.requires_grad_();
    REQUIRE_GRADCHECK([&](const V& in) { return c.op(in[0]); }, {x});
    REQUIRE_GRADCHECK([&](const V& in) { return c.op(in[0].t()); }, {x});
  }
  for (const auto& c : binary_cases()) {
    INFO(c.name);
    Tensor a = noncontig(rand({3, 1, 5}, DType::kF64, 41, c.lo, c.hi)).requires_grad_();
    Tensor b = noncontig(rand({4, 1}, DType::kF64, 42, c.lo, c.hi)).requires_grad_();
    REQUIRE_GRADCHECK([&](const V& in) { return c.op(in[0], in[1]); }, {a, b});
    REQUIRE_GRADCHECK([&](const V& in) { return c.op(in[1], in[0]); }, {a, b});
    // Only one side requires grad.
    Tensor bc = rand({4, 1}, DType::kF64, 43, c.lo, c.hi);
    REQUIRE_GRADCHECK([&](const V& in) { return c.op(in[0], in[1]); }, {a, bc});
    REQUIRE_GRADCHECK([&](const V& in) { return c.op(in[1], in[0]); }, {a, bc});
    // With a 0-d tensor.
    Tensor s = rand({}, DType::kF64, 44, c.lo, c.hi).requires_grad_();
    REQUIRE_GRADCHECK([&](const V& in) { return c.op(in[0], in[1]); }, {a, s});
  }
  // where / masked_fill (broadcast condition), mixed precision inputs.
  Tensor cond = from_vector<uint8_t>({1, 0, 0, 1}, {4, 1}).to(DType::kBool);
  Tensor a = noncontig(rand({3, 1, 5}, DType::kF64, 51)).requires_grad_();
  Tensor b = noncontig(rand({5}, DType::kF64, 52)).requires_grad_();
  REQUIRE_GRADCHECK([&](const V& in) { return where(cond, in[0], in[1]); }, {a, b});
  REQUIRE_GRADCHECK([&](const V& in) { return where(cond, in[0], 2.0); }, {a});
  Tensor x = noncontig(rand({4, 3}, DType::kF64, 53)).requires_grad_();
  REQUIRE_GRADCHECK([&](const V& in) { return masked_fill(in[0], cond, -3.0) * in[0]; }, {x});
}

TEST_CASE("maximum/minimum split the gradient evenly on ties", "[cpu]") {
  Tensor a = from_vector<double>({1, 2, 3}, {3}).requires_grad_();
  Tensor b = from_vector<double>({1, 5, 0}, {3}).requires_grad_();
  sum(maximum(a, b)).backward();
  REQUIRE(vals(a.grad()) == std::vector<double>{0.5, 0, 1});
  REQUIRE(vals(b.grad()) == std::vector<double>{0.5, 1, 0});
  a.set_grad(Tensor());
  b.set_grad(Tensor());
  sum(minimum(a, b)).backward();
  REQUIRE(vals(a.grad()) == std::vector<double>{0.5, 1, 0});
  REQUIRE(vals(b.grad()) == std::vector<double>{0.5, 0, 1});
  // relu passes no gradient at 0; clamp passes it at the bounds.
  Tensor z = from_vector<double>({-1, 0, 1}, {3}).requires_grad_();
  sum(relu(z)).backward();
  REQUIRE(vals(z.grad()) == std::vector<double>{0, 0, 1});
  z.set_grad(Tensor());
  sum(clamp(z, 0, 1)).backward();
  REQUIRE(vals(z.grad()) == std::vector<double>{0, 1, 1});
}

TEST_CASE("pointwise errors name the op, shapes and devices", "[cpu]") {
  Tensor a = ones({2, 3}), b = ones({4, 3});
  REQUIRE_THROWS_WITH(add(a, b), Catch::Contains("add") && Catch::Contains("[2, 3]") && Catch::Contains("[4, 3]"));
  REQUIRE_THROWS_WITH(mul(b, a), Catch::Contains("mul") && Catch::Contains("[4, 3]") && Catch::Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(maximum(a, ones({3, 2})), Catch::Contains("maximum"));
  REQUIRE_THROWS_WITH(lt(a, b), Catch::Contains("lt") && Catch::Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(logical_and(a, b), Catch::Contains("logical_and"));
  REQUIRE_THROWS_WITH(pow(a, b), Catch::Contains("pow"));
  Tensor m = empty({2, 3}, TensorOptions().with_device(Device::meta()));
  REQUIRE_THROWS_WITH(add(a, m), Catch::Contains("add") && Catch::Contains("cpu") && Catch::Contains("meta"));
  REQUIRE_THROWS_WITH(where(ones({2, 3}, DType::kBool), a, m), Catch::Contains("where") && Catch::Contains("meta"));
  REQUIRE_THROWS_WITH(add(a, Tensor()), Catch::Contains("add") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(neg(ones({2}, DType::kBool)), Catch::Contains("neg") && Catch::Contains("bool"));
  REQUIRE_THROWS_WITH(-ones({2}, DType::kBool), Catch::Contains("neg"));
  REQUIRE_THROWS_WITH(exp(Tensor()), Catch::Contains("Exp"));
}

TEST_CASE("double backward through every differentiable unary op", "[cpu]") {
  // Gradcheck of the first derivative (computed with create_graph) checks the second.
  for (const auto& c : unary_cases()) {
    std::string n = c.name;
    if (n == "abs" || n == "relu" || n == "sign" || n.rfind("clamp", 0) == 0) continue;
    INFO(c.name);
    Tensor x = noncontig(rand({2, 3}, DType::kF64, 61, c.lo, c.hi)).requires_grad_();
    auto op = c.op;
    // (+ 0 * x keeps the result differentiable where f' is a constant.)
    REQUIRE_GRADCHECK([op](const V& in) {
      GradModeGuard on(true);  // the finite-difference evaluations run under no_grad
      return mt::grad({sum(op(in[0]))}, {in[0]}, {}, false, true)[0] + in[0] * 0.0;
    }, {x});
  }
  for (const auto& c : binary_cases()) {
    INFO(c.name);
    std::string n = c.name;
    if (n == "maximum" || n == "minimum") continue;
    Tensor a = noncontig(rand({3, 1}, DType::kF64, 62, c.lo, c.hi)).requires_grad_();
    Tensor b = rand({4}, DType::kF64, 63, c.lo, c.hi).requires_grad_();
    auto op = c.op;
    REQUIRE_GRADCHECK([op](const V& in) {
      GradModeGuard on(true);
      auto g = mt::grad({sum(op(in[0], in[1]) * op(in[0], in[1]))}, {in[0], in[1]}, {}, false, true);
      return g[0] * 2.0 + sum(g[1]);
    }, {a, b});
  }
}

TEST_CASE("silu_mul gives the bits of mul(silu(a), b) and of its gradients", "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}) {
    INFO(dtype_name(dt));
    for (const Shape& sb : {Shape{6, 37}, Shape{37}}) {  // same shape, and b broadcast over rows
      const Tensor a0 = rand({6, 37}, dt, 11, -6, 6), b0 = rand(sb, dt, 12, -2, 2), g = rand({6, 37}, dt, 13);
      Tensor a1 = a0.clone().requires_grad_(), b1 = b0.clone().requires_grad_();
      Tensor a2 = a0.clone().requires_grad_(), b2 = b0.clone().requires_grad_();
      Tensor fused = silu_mul(a1, b1), plain = mul(silu(a2), b2);
      REQUIRE(fused.dtype() == dt);
      REQUIRE_CLOSE(fused, plain, 0, 0);
      fused.backward(g);
      plain.backward(g);
      REQUIRE_CLOSE(a1.grad(), a2.grad(), 0, 0);
      REQUIRE_CLOSE(b1.grad(), b2.grad(), 0, 0);
    }
  }
  // Non-contiguous operands, and gradients checked against finite differences in f64.
  const Tensor a = noncontig(rand({5, 8}, DType::kF64, 14, -3, 3)), b = noncontig(rand({5, 8}, DType::kF64, 15));
  REQUIRE_CLOSE(silu_mul(a, b), mul(silu(a), b), 0, 0);
  REQUIRE_GRADCHECK([](const V& in) { return silu_mul(in[0], in[1]); },
                    {a.clone().requires_grad_(), b.clone().requires_grad_()});
  REQUIRE_THROWS_WITH(silu_mul(ones({3}, DType::kI64), ones({3}, DType::kI64)), Catch::Contains("silu_mul"));
}
