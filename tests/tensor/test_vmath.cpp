// kernels/cpu/vmath.h: the vectorizable f32 exp against libm in double (within 1 ulp, special
// values), the same bits whether a kernel runs it vectorized or element by element and wherever an
// element sits in memory, and the fixed lane order of lane_sum / lane_max.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/vmath.h"
#include "testing.h"

using namespace mt;
using mt::cpu::exp_f32;
using mt::testing::rand;

namespace {

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// |y - exact| in units of the last place of the correctly rounded result.
double ulp_error(float x, float y) {
  const double exact = std::exp(static_cast<double>(x));
  const float rounded = static_cast<float>(exact);
  const double ulp = static_cast<double>(std::nextafter(rounded, HUGE_VALF)) - rounded;
  return std::fabs(static_cast<double>(y) - exact) / ulp;
}

}  // namespace

TEST_CASE("exp_f32 is within 1 ulp over its normal range", "[cpu]") {
  // Every 61st float of [-87.3, 88.7] by bit pattern (about 37 million values; every float was
  // checked once when the kernel was written: 0.98 ulp at worst).
  double worst = 0;
  float worst_x = 0;
  int64_t checked = 0;
  for (float lo_hi : {-87.3f, 88.7f}) {
    const uint32_t end = bits_of(lo_hi);
    for (uint32_t b = lo_hi < 0 ? 0x80000000u : 0u; b <= end; b += 61) {
      float x;
      std::memcpy(&x, &b, sizeof x);
      const double e = ulp_error(x, exp_f32(x));
      if (e > worst) {
        worst = e;
        worst_x = x;
      }
      ++checked;
    }
  }
  INFO("worst " << worst << " ulp at x = " << worst_x << " over " << checked << " values");
  REQUIRE(checked > 36'000'000);
  REQUIRE(worst <= 1.0);
}

TEST_CASE("exp_f32 special values", "[cpu]") {
  const float inf = std::numeric_limits<float>::infinity();
  REQUIRE(exp_f32(0.0f) == 1.0f);
  REQUIRE(exp_f32(-0.0f) == 1.0f);
  REQUIRE(exp_f32(inf) == inf);
  REQUIRE(exp_f32(88.73f) == inf);  // overflows, as std::exp
  REQUIRE(exp_f32(88.72f) == std::exp(88.72f));
  REQUIRE(exp_f32(-inf) == 0.0f);
  REQUIRE(exp_f32(-100.0f) == 0.0f);  // std::exp: a subnormal; flushed to 0
  REQUIRE(exp_f32(-87.3f) > 0.0f);
  REQUIRE(ulp_error(-87.3f, exp_f32(-87.3f)) <= 1.0);
  REQUIRE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("exp and silu give the same bits contiguous, strided and element by element", "[cpu]") {
  // Contiguous rows of odd length run vectorized with scalar tails; the transposed view runs the
  // strided loop; the reference calls exp_f32 one value at a time.
  const Tensor x = rand({37, 29}, DType::kF32, 3, -30, 30);
  const std::vector<float> xs = x.to_vector<float>();
  const std::vector<float> ex = exp(x).to_vector<float>();
  const std::vector<float> ext = exp(x.t()).t().contiguous().to_vector<float>();
  const std::vector<float> silu_x = silu(x).to_vector<float>();
  const std::vector<float> silu_xt = silu(x.t()).t().contiguous().to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) {
    INFO("element " << i << " x = " << xs[i]);
    REQUIRE(bits_of(ex[i]) == bits_of(exp_f32(xs[i])));
    REQUIRE(bits_of(ext[i]) == bits_of(ex[i]));
    REQUIRE(bits_of(silu_xt[i]) == bits_of(silu_x[i]));
    REQUIRE(bits_of(silu_x[i]) == bits_of(xs[i] / (1.0f + exp_f32(-xs[i]))));
  }
  // An element's value does not depend on its offset: the same values one element further on.
  const Tensor shifted = cat({rand({1}, DType::kF32, 4), x.reshape({x.numel()})}, 0).slice(0, 1, 1 + x.numel());
  REQUIRE_CLOSE(exp(shifted), exp(x).reshape({x.numel()}), 0, 0);
}

TEST_CASE("lane_sum and lane_max use the documented lanes", "[cpu]") {
  for (int64_t n : {0, 1, 7, 8, 9, 16, 23, 100}) {
    INFO("n = " << n);
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 1.0 / (3.0 + static_cast<double>(i)) * (i % 3 ? 1e8 : 1e-8);
    double lanes[8] = {};
    for (int64_t i = 0; i < n; ++i) lanes[i % 8] += v[static_cast<size_t>(i)];
    const double expect = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    const double got = cpu::lane_sum(n, [&](int64_t i) { return v[static_cast<size_t>(i)]; });
    REQUIRE(std::memcmp(&got, &expect, sizeof got) == 0);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> m{1, nan, -3, 7.5f, 2, nan, 7.25f, -1, 0, 4};
  REQUIRE(cpu::lane_max(10, [&](int64_t i) { return m[static_cast<size_t>(i)]; }) == 7.5f);
  REQUIRE(cpu::lane_max(0, [](int64_t) { return 1.0f; }) == -std::numeric_limits<float>::infinity());
}
