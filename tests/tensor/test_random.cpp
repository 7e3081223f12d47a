// Random numbers: Philox known answers, the documented element mapping (docs/rng.md) against a
// naive reference, single-device semantics (pieces, views and thread counts give the same bits),
// generator offsets, distribution statistics, dropout and its gradient, and argument errors.
#include <omp.h>

#include <cmath>
#include <map>

#include "kernels/philox.h"
#include "testing.h"

using namespace mt;
using mt::testing::same_bits;
using Catch::Contains;

namespace {

// The documented mapping written out naively: value of global element j.
double reference(RandomDist dist, DType dtype, uint64_t seed, uint64_t offset, double a, double b,
                 uint64_t j) {
  int lanes = 1;
  if (dist == RandomDist::kNormal || (dist == RandomDist::kUniform && dtype == DType::kF64) ||
      (dist == RandomDist::kRandint && b - a >= 4294967296.0))
    lanes = 2;
  const uint64_t per_block = 4 / lanes;
  const uint64_t blk = offset + j / per_block;
  const int lane = static_cast<int>(j % per_block) * lanes;
  philox::U32x4 r = philox::block(seed, blk);
  const uint32_t x0 = r.v[lane], x1 = lanes == 2 ? r.v[lane + 1] : 0;
  auto round_to = [&](double v) -> double {
    switch (dtype) {
      case DType::kF32: return static_cast<float>(v);
      case DType::kBF16: return static_cast<float>(BFloat16(static_cast<float>(v)));
      case DType::kF16: return static_cast<float>(Float16(static_cast<float>(v)));
      default: return v;
    }
  };
  switch (dist) {
    case RandomDist::kUniform: {
      if (dtype == DType::kF64) {
        uint64_t x = ((static_cast<uint64_t>(x1) << 32) | x0) >> 11;
        return a + (b - a) * std::ldexp(static_cast<double>(x), -53);
      }
      float u = std::ldexp(static_cast<float>(x0 >> 8), -24);
      float v = static_cast<float>(a) + (static_cast<float>(b) - static_cast<float>(a)) * u;
      return round_to(v);
    }
    case RandomDist::kNormal: {
      double u1 = 1.0 - std::ldexp(static_cast<double>(x0), -32);
      double u2 = std::ldexp(static_cast<double>(x1), -32);
      double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
      return round_to(a + b * z);
    }
    case RandomDist::kRandint: {
      uint64_t x = lanes == 2 ? ((static_cast<uint64_t>(x1) << 32) | x0) : x0;
      uint64_t range = static_cast<uint64_t>(static_cast<int64_t>(b) - static_cast<int64_t>(a));
      return round_to(static_cast<double>(static_cast<int64_t>(a) + static_cast<int64_t>(x % range)));
    }
    case RandomDist::kBernoulli:
      return std::ldexp(static_cast<double>(x0 >> 8), -24) < a ? 1 : 0;
  }
  return 0;
}

struct Case {
  RandomDist dist;
  DType dtype;
  double a, b;
  const char* name;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {
      {RandomDist::kUniform, DType::kF32, -2, 3, "uniform f32"},
      {RandomDist::kUniform, DType::kF64, -2, 3, "uniform f64"},
      {RandomDist::kUniform, DType::kBF16, 0, 1, "uniform bf16"},
      {RandomDist::kUniform, DType::kF16, -1, 1, "uniform f16"},
      {RandomDist::kNormal, DType::kF32, 1, 2, "normal f32"},
      {RandomDist::kNormal, DType::kF64, 0, 1, "normal f64"},
      {RandomDist::kNormal, DType::kBF16, 0, 1, "normal bf16"},
      {RandomDist::kRandint, DType::kI64, -5, 17, "randint i64"},
      {RandomDist::kRandint, DType::kI64, -3, 1099511627776.0, "randint i64 wide"},
      {RandomDist::kRandint, DType::kI32, 0, 1000, "randint i32"},
      {RandomDist::kBernoulli, DType::kBool, 0.3, 0, "bernoulli bool"},
      {RandomDist::kBernoulli, DType::kF32, 0.7, 0, "bernoulli f32"},
  };
  return kCases;
}

// The whole [rows, cols] tensor in one call.
Tensor whole(const Case& c, const Shape& shape, uint64_t seed, uint64_t offset) {
  Tensor t = empty(shape, c.dtype);
  fill_random(t, c.dist, c.a, c.b, seed, offset, 0, shape.contiguous_strides());
  return t;
}

}  // namespace

TEST_CASE("philox4x32-10 matches the Random123 known answers", "[cpu]") {
  auto check = [](philox::U32x4 ctr, uint32_t k0, uint32_t k1, std::array<uint32_t, 4> want) {
    philox::U32x4 r = philox::philox4x32_10(ctr, k0, k1);
    for (int i = 0; i < 4; ++i) REQUIRE(r.v[i] == want[i]);
  };
  check({{0, 0, 0, 0}}, 0, 0, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  check({{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff,
        {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  check({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0,
        {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
  // block(): key = (lo, hi) of the seed, counter = (lo, hi) of the block index.
  philox::U32x4 r = philox::block(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull);
  philox::U32x4 e = philox::philox4x32_10({{0x243f6a88, 0x85a308d3, 0, 0}}, 0xa4093822, 0x299f31d0);
  for (int i = 0; i < 4; ++i) REQUIRE(r.v[i] == e.v[i]);
}

TEST_CASE("conversions from uint32 are exact and in range", "[cpu]") {
  REQUIRE(philox::unit_f24(0) == 0.0f);
  REQUIRE(philox::unit_f24(0xffffffffu) == 1.0f - std::ldexp(1.0f, -24));
  REQUIRE(philox::unit_f24(0x80000000u) == 0.5f);
  REQUIRE(philox::unit_f53(0, 0) == 0.0);
  REQUIRE(philox::unit_f53(0xffffffffu, 0xffffffffu) == 1.0 - std::ldexp(1.0, -53));
  REQUIRE(philox::unit_f53(0, 0x80000000u) == 0.5);
  REQUIRE(philox::unit_f32_as_double(0xffffffffu) == 1.0 - std::ldexp(1.0, -32));
  // normal with x0 = 0 (u1 = 1) gives exactly the mean; the largest x0 stays finite.
  REQUIRE(philox::normal_f64(3, 2, 0, 123) == 3.0);
  REQUIRE(std::isfinite(philox::normal_f64(0, 1, 0xffffffffu, 0)));
}

TEST_CASE("every distribution follows the documented mapping bit for bit", "[cpu]") {
  const Shape shape{7, 13};
  for (const Case& c : cases()) {
    SECTION(c.name) {
      const uint64_t seed = 0x0123456789abcdefull, offset = 5;
      Tensor t = whole(c, shape, seed, offset);
      auto got = t.to_vector<double>();
      for (int64_t j = 0; j < shape.numel(); ++j) {
        INFO("element " << j);
        REQUIRE(got[j] == reference(c.dist, c.dtype, seed, offset, c.a, c.b, j));
      }
    }
  }
}

TEST_CASE("same seed and offset give the same tensor; the factories use the generator", "[cpu]") {
  Generator g1(42), g2(42), g3(43);
  Tensor a = uniform({5, 9}, -1, 1, DType::kF32, &g1);
  Tensor b = uniform({5, 9}, -1, 1, DType::kF32, &g2);
  Tensor c = uniform({5, 9}, -1, 1, DType::kF32, &g3);
  REQUIRE(same_bits(a, b));
  REQUIRE_FALSE(same_bits(a, c));
  // The next draw continues the stream: different values, and equal to fill_random at offset 12.
  Tensor d = uniform({5, 9}, -1, 1, DType::kF32, &g1);
  REQUIRE_FALSE(same_bits(a, d));
  Tensor e = empty({5, 9}, DType::kF32);
  fill_random(e, RandomDist::kUniform, -1, 1, 42, 12, 0, Shape{9, 1});
  REQUIRE(same_bits(d, e));

  manual_seed(7);
  Tensor n1 = normal({33}, 0, 1, DType::kF64);
  Tensor n2 = normal({33}, 0, 1, DType::kF64);
  REQUIRE_FALSE(same_bits(n1, n2));
  REQUIRE(default_generator().seed() == 7);
  REQUIRE(default_generator().offset() == 2 * 17);
  manual_seed(7);
  REQUIRE(default_generator().offset() == 0);
  REQUIRE(same_bits(normal({33}, 0, 1, DType::kF64), n1));

  Generator g4(9);
  Tensor r = uniform({4}, 0, 1, TensorOptions(DType::kF32).with_grad(), &g4);
  REQUIRE(r.requires_grad());
  REQUIRE(r.is_leaf());
}

TEST_CASE("the generator offset advances by ceil(numel / E)", "[cpu]") {
  Generator g(1);
  auto advance = [&](auto&& op) {
    uint64_t before = g.offset();
    op();
    return g.offset() - before;
  };
  // 91 elements: E = 4 -> 23 blocks, E = 2 -> 46 blocks.
  REQUIRE(advance([&] { uniform({7, 13}, 0, 1, DType::kF32, &g); }) == 23);
  REQUIRE(advance([&] { uniform({7, 13}, 0, 1, DType::kBF16, &g); }) == 23);
  REQUIRE(advance([&] { uniform({7, 13}, 0, 1, DType::kF64, &g); }) == 46);
  REQUIRE(advance([&] { normal({7, 13}, 0, 1, DType::kF32, &g); }) == 46);
  REQUIRE(advance([&] { normal({7, 13}, 0, 1, DType::kF64, &g); }) == 46);
  REQUIRE(advance([&] { randint(0, 10, {7, 13}, DType::kI64, &g); }) == 23);
  REQUIRE(advance([&] { randint(0, int64_t{1} << 32, {7, 13}, DType::kI64, &g); }) == 46);
  REQUIRE(advance([&] { randint(0, (int64_t{1} << 32) - 1, {7, 13}, DType::kI64, &g); }) == 23);
  REQUIRE(advance([&] { bernoulli({7, 13}, 0.5, DType::kBool, &g); }) == 23);
  REQUIRE(advance([&] { bernoulli({0}, 0.5, DType::kBool, &g); }) == 0);
  REQUIRE(advance([&] { uniform({}, 0, 1, DType::kF32, &g); }) == 1);
  Tensor t = empty({6, 4}, DType::kF32);
  REQUIRE(advance([&] { uniform_(t, 0, 1, &g); }) == 6);
  REQUIRE(advance([&] { normal_(t, 0, 1, &g); }) == 12);
  REQUIRE(random_blocks(RandomDist::kUniform, DType::kF32, 8) == 2);
  REQUIRE(random_blocks(RandomDist::kUniform, DType::kF32, 9) == 3);
  REQUIRE(random_blocks(RandomDist::kNormal, DType::kF16, 9) == 5);
}

TEST_CASE("a tensor generated in pieces equals the one generated whole", "[cpu]") {
  const Shape shape{7, 13};
  const Shape gs{13, 1};
  const uint64_t seed = 77, offset = 1000;
  for (const Case& c : cases()) {
    SECTION(c.name) {
      Tensor ref = whole(c, shape, seed, offset);

      // Row slices [0, 3), [3, 4), [4, 7) as separate contiguous locals.
      std::vector<std::pair<int64_t, int64_t>> rows = {{0, 3}, {3, 4}, {4, 7}};
      for (auto [r0, r1] : rows) {
        Tensor local = empty({r1 - r0, 13}, c.dtype);
        fill_random(local, c.dist, c.a, c.b, seed, offset, r0 * 13, gs);
        REQUIRE(same_bits(local, ref.narrow(0, r0, r1 - r0).contiguous()));
      }

      // Column slices written through non-contiguous views of one buffer.
      Tensor buf = zeros(shape, c.dtype);
      std::vector<std::pair<int64_t, int64_t>> cols = {{0, 5}, {5, 6}, {6, 13}};
      for (auto [c0, c1] : cols) {
        Tensor local = buf.narrow(1, c0, c1 - c0);
        REQUIRE_FALSE(local.is_contiguous());
        fill_random(local, c.dist, c.a, c.b, seed, offset, c0, gs);
      }
      REQUIRE(same_bits(buf, ref));

      // A 2x3 block in the middle, as its own tensor.
      Tensor blk = empty({2, 3}, c.dtype);
      fill_random(blk, c.dist, c.a, c.b, seed, offset, 3 * 13 + 4, gs);
      REQUIRE(same_bits(blk, ref.narrow(0, 3, 2).narrow(1, 4, 3).contiguous()));

      // Transposed views: the global tensor written through a transposed layout, and a local
      // stored transposed ([13, 7]) whose global strides are swapped.
      Tensor tbuf = empty({13, 7}, c.dtype);
      Tensor tview = tbuf.t();
      fill_random(tview, c.dist, c.a, c.b, seed, offset, 0, gs);
      REQUIRE(same_bits(tview.contiguous(), ref));
      Tensor tloc = empty({13, 7}, c.dtype);
      fill_random(tloc, c.dist, c.a, c.b, seed, offset, 0, Shape{1, 13});
      REQUIRE(same_bits(tloc.t().contiguous(), ref));
    }
  }
}

TEST_CASE("in-place fills use the view's own row-major order", "[cpu]") {
  Generator g1(5), g2(5);
  Tensor base = zeros({13, 14}, DType::kF32);
  Tensor view = base.slice(1, 0, 14, 2).t();  // [7, 13], non-contiguous
  uniform_(view, -3, 3, &g1);
  Tensor ref = uniform({7, 13}, -3, 3, DType::kF32, &g2);
  REQUIRE(same_bits(view.contiguous(), ref));
  // The untouched odd columns stay zero.
  auto odd = base.slice(1, 1, 14, 2).contiguous().to_vector<float>();
  for (float v : odd) REQUIRE(v == 0.0f);

  Tensor n = empty({26, 7}, DType::kBF16).t();
  normal_(n, 1, 0.5, &g1);
  REQUIRE(same_bits(n.contiguous(), normal({7, 26}, 1, 0.5, DType::kBF16, &g2)));
}

TEST_CASE("results do not depend on the OpenMP thread count", "[cpu]") {
  const int saved = omp_get_max_threads();
  const Shape shape{317, 331};  // ~105k elements: many parallel chunks
  for (const Case& c : cases()) {
    SECTION(c.name) {
      omp_set_num_threads(1);
      Tensor one = whole(c, shape, 3, 17);
      omp_set_num_threads(2);
      Tensor two = whole(c, shape, 3, 17);
      omp_set_num_threads(3);
      Tensor three = empty({331, 317}, c.dtype).t();
      fill_random(three, c.dist, c.a, c.b, 3, 17, 0, shape.contiguous_strides());
      omp_set_num_threads(saved);
      REQUIRE(same_bits(one, two));
      REQUIRE(same_bits(one, three.contiguous()));
    }
  }
  omp_set_num_threads(saved);
}

TEST_CASE("distribution statistics", "[cpu]") {
  const int64_t n = 100000;
  const double sn = std::sqrt(static_cast<double>(n));
  Generator g(2024);
  auto moments = [](const std::vector<double>& v) {
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= static_cast<double>(v.size());
    for (double x : v) s += (x - m) * (x - m);
    return std::pair<double, double>{m, s / static_cast<double>(v.size())};
  };

  SECTION("uniform") {
    for (DType dt : {DType::kF32, DType::kF64}) {
      auto v = uniform({n}, 2, 5, dt, &g).to_vector<double>();
      for (double x : v) REQUIRE((x >= 2 && x <= 5));  // hi itself only by float rounding
      auto [m, var] = moments(v);
      // On [0, 1): mean 1/2 (sd sqrt(1/12/n)), variance 1/12 (sd sqrt(1/180/n)); scaled by 3.
      REQUIRE(std::fabs(m - 3.5) < 4 * 3 * std::sqrt(1.0 / 12) / sn);
      REQUIRE(std::fabs(var - 9.0 / 12) < 4 * 9 * std::sqrt(1.0 / 180) / sn);
    }
  }
  SECTION("normal") {
    for (DType dt : {DType::kF32, DType::kF64}) {
      auto v = normal({n}, -1, 3, dt, &g).to_vector<double>();
      auto [m, var] = moments(v);
      REQUIRE(std::fabs(m + 1) < 4 * 3 / sn);
      REQUIRE(std::fabs(std::sqrt(var) - 3) < 4 * 3 / std::sqrt(2.0 * n));
      // Tails: about 4.55% beyond 2 sigma.
      int64_t tail = 0;
      for (double x : v) tail += std::fabs(x + 1) > 6;
      const double q = 0.0455;
      REQUIRE(std::fabs(static_cast<double>(tail) / n - q) < 4 * std::sqrt(q * (1 - q) / n));
    }
  }
  SECTION("bernoulli") {
    for (double p : {0.0, 0.1, 0.5, 0.93, 1.0}) {
      auto v = bernoulli({n}, p, DType::kF32, &g).to_vector<double>();
      double ones = 0;
      for (double x : v) {
        REQUIRE((x == 0 || x == 1));
        ones += x;
      }
      REQUIRE(std::fabs(ones / n - p) <= 4 * std::sqrt(p * (1 - p) / n));
    }
  }
  SECTION("randint") {
    auto v = randint(-3, 7, {n}, DType::kI64, &g).to_vector<int64_t>();
    std::map<int64_t, int64_t> count;
    for (int64_t x : v) {
      REQUIRE((x >= -3 && x < 7));
      ++count[x];
    }
    REQUIRE(count.size() == 10);
    for (auto [k, c] : count) REQUIRE(std::fabs(c / double(n) - 0.1) < 4 * std::sqrt(0.09 / n));
    // Wide range: values spread over the whole range.
    const int64_t hi = int64_t{1} << 40;
    auto w = randint(0, hi, {1000}, DType::kI64, &g).to_vector<int64_t>();
    int64_t above = 0;
    for (int64_t x : w) {
      REQUIRE((x >= 0 && x < hi));
      above += x >= hi / 2;
    }
    REQUIRE((above > 400 && above < 600));
    auto b = randint(0, 2, {1000}, DType::kBool, &g).to_vector<int64_t>();
    int64_t t = 0;
    for (int64_t x : b) t += x;
    REQUIRE((t > 400 && t < 600));
  }
}

TEST_CASE("dropout", "[cpu]") {
  const double p = 0.3;
  SECTION("zero fraction, scale and same mask for the same seed") {
    Generator g1(11), g2(11);
    Tensor x = full({400, 250}, 2.0, DType::kF32);
    Tensor y = dropout(x, p, &g1);
    auto v = y.to_vector<float>();
    const float kept = static_cast<float>(2.0 / (1 - p));
    int64_t zeros = 0;
    for (float e : v) {
      if (e == 0) ++zeros;
      else REQUIRE(e == Approx(kept).epsilon(1e-6));
    }
    const double n = static_cast<double>(v.size());
    REQUIRE(std::fabs(zeros / n - p) < 4 * std::sqrt(p * (1 - p) / n));
    REQUIRE(same_bits(dropout(x, p, &g2), y));
    // The mask is bernoulli(1 - p) from the same generator state.
    Generator g3(11);
    Tensor mask = bernoulli({400, 250}, 1 - p, DType::kF32, &g3);
    auto m = mask.to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) REQUIRE((v[i] == 0) == (m[i] == 0));
    // bf16 input keeps its dtype.
    Tensor yb = dropout(x.to(DType::kBF16), p, &g1);
    REQUIRE(yb.dtype() == DType::kBF16);
  }
  SECTION("p = 0 is the identity") {
    Generator g(1);
    Tensor x = testing::rand({3, 4}, DType::kF32);
    Tensor y = dropout(x, 0, &g);
    REQUIRE(y.same(x));
    REQUIRE(g.offset() == 0);
  }
  SECTION("gradient is mask / (1 - p)") {
    Generator g(12);
    Tensor x = testing::rand({37, 11}, DType::kF64, 3, 1, 2).requires_grad_();
    Tensor y = dropout(x, p, &g);
    Tensor w = testing::rand({37, 11}, DType::kF64, 4);
    sum(mul(y, w)).backward();
    auto yv = y.to_vector<double>(), xv = x.to_vector<double>(), wv = w.to_vector<double>();
    auto gv = x.grad().to_vector<double>();
    for (size_t i = 0; i < yv.size(); ++i) {
      const double mask = yv[i] != 0 ? 1 : 0;
      REQUIRE(gv[i] == Approx(wv[i] * mask / (1 - p)).margin(1e-15));
      REQUIRE(yv[i] == Approx(xv[i] * mask / (1 - p)).margin(1e-15));
    }
  }
  SECTION("finite differences on a non-contiguous input") {
    Tensor x = testing::noncontig(testing::rand({5, 7}, DType::kF64, 8)).requires_grad_();
    REQUIRE_GRADCHECK(
        [](const std::vector<Tensor>& in) {
          Generator g(99);  // the same mask every call
          return dropout(in[0], 0.4, &g);
        },
        {x});
  }
  SECTION("errors") {
    Tensor x = testing::rand({3, 4}, DType::kF32);
    REQUIRE_THROWS_WITH(dropout(x, 1.0), Contains("dropout") && Contains("[0, 1)"));
    REQUIRE_THROWS_WITH(dropout(x, -0.1), Contains("dropout"));
    REQUIRE_THROWS_WITH(dropout(zeros({3}, DType::kI64), 0.5), Contains("dropout") && Contains("i64"));
  }
}

TEST_CASE("random ops reject bad arguments", "[cpu]") {
  Generator g(1);
  REQUIRE_THROWS_WITH(uniform({3}, 0, 1, DType::kI32, &g), Contains("uniform") && Contains("i32"));
  REQUIRE_THROWS_WITH(uniform({3}, 2, 1, DType::kF32, &g), Contains("uniform") && Contains("low <= high"));
  REQUIRE_THROWS_WITH(normal({3}, 0, -1, DType::kF32, &g), Contains("normal") && Contains("std"));
  REQUIRE_THROWS_WITH(normal({3}, 0, 1, DType::kI64, &g), Contains("normal"));
  REQUIRE_THROWS_WITH(bernoulli({3}, 1.5, DType::kF32, &g), Contains("bernoulli") && Contains("1.5"));
  REQUIRE_THROWS_WITH(randint(5, 5, {3}, DType::kI64, &g), Contains("randint") && Contains("low < high"));
  REQUIRE_THROWS_WITH(randint(0, 300, {3}, DType::kU8, &g), Contains("randint") && Contains("u8"));
  REQUIRE_THROWS_WITH(randint(0, int64_t{1} << 60, {3}, DType::kI64, &g), Contains("2^53"));
  REQUIRE(g.offset() == 0);  // failed ops consume nothing

  Tensor t = empty({4, 5}, DType::kF32);
  REQUIRE_THROWS_WITH(fill_random(t, RandomDist::kUniform, 0, 1, 1, 0, 0, Shape{5}),
                      Contains("fill_random") && Contains("[4, 5]"));
  REQUIRE_THROWS_WITH(fill_random(t, RandomDist::kUniform, 0, 1, 1, 0, -1, Shape{5, 1}),
                      Contains("fill_random") && Contains("negative global base"));
  Tensor ex = empty({1, 5}, DType::kF32).expand({4, 5});
  REQUIRE_THROWS_WITH(fill_random(ex, RandomDist::kUniform, 0, 1, 1, 0, 0, Shape{5, 1}),
                      Contains("fill_random") && Contains("overlaps"));
  Tensor meta = empty({4, 5}, TensorOptions(DType::kF32).with_device(Device::meta()));
  REQUIRE_THROWS_WITH(fill_random(meta, RandomDist::kUniform, 0, 1, 1, 0, 0, Shape{5, 1}),
                      Contains("fill_random") && Contains("meta"));
  REQUIRE_THROWS_WITH(uniform_(meta, 0, 1, &g), Contains("uniform_") && Contains("meta"));

  Tensor w = zeros({3}, DType::kF32).requires_grad_();
  REQUIRE_THROWS_WITH(uniform_(w, 0, 1, &g), Contains("uniform_") && Contains("requires grad"));
  {
    NoGradGuard no_grad;
    uniform_(w, 0, 1, &g);  // parameter init
  }
  REQUIRE(w.requires_grad());
}
