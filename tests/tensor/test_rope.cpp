// Rotary embedding: tables, both pairings, both broadcast layouts, non-contiguous x and tables,
// 16-bit inputs, gradients (including double backward) and shape errors.
#include <cmath>

#include "testing.h"

using namespace mt;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

double angle(int64_t t, int64_t i, int64_t D, double theta = 10000.0) {
  return static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
}

// Naive rotary embedding of a contiguous 4-D x; pos(i0, i1, i2) gives the position of a row.
template <class Pos>
std::vector<double> rope_ref(const std::vector<double>& x, const Shape& s, RopeStyle style, Pos pos,
                             bool inverse = false) {
  const int64_t D = s[3], half = D / 2;
  std::vector<double> y(x.size());
  for (int64_t a = 0; a < s[0]; ++a)
    for (int64_t b = 0; b < s[1]; ++b)
      for (int64_t c = 0; c < s[2]; ++c) {
        const int64_t base = ((a * s[1] + b) * s[2] + c) * D;
        const int64_t t = pos(a, b, c);
        for (int64_t i = 0; i < half; ++i) {
          double co = std::cos(angle(t, i, D)), si = std::sin(angle(t, i, D)) * (inverse ? -1 : 1);
          int64_t i0 = style == RopeStyle::kHalf ? i : 2 * i;
          int64_t i1 = style == RopeStyle::kHalf ? i + half : 2 * i + 1;
          double x0 = x[static_cast<size_t>(base + i0)], x1 = x[static_cast<size_t>(base + i1)];
          y[static_cast<size_t>(base + i0)] = x0 * co - x1 * si;
          y[static_cast<size_t>(base + i1)] = x1 * co + x0 * si;
        }
      }
  return y;
}

}  // namespace

TEST_CASE("rope_tables match the angle formula", "[cpu]") {
  const int64_t T = 7, D = 10;
  auto [c, s] = rope_tables(T, D, 500.0, DType::kF64);
  REQUIRE(c.shape() == Shape{T, D / 2});
  REQUIRE(s.shape() == Shape{T, D / 2});
  std::vector<double> ce, se;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D / 2; ++i) {
      ce.push_back(std::cos(angle(t, i, D, 500.0)));
      se.push_back(std::sin(angle(t, i, D, 500.0)));
    }
  REQUIRE_CLOSE(c, ce, 1e-14, 1e-14);
  REQUIRE_CLOSE(s, se, 1e-14, 1e-14);
  auto [c32, s32] = rope_tables(T, D, 500.0);
  REQUIRE(c32.dtype() == DType::kF32);
  REQUIRE_CLOSE(c32, ce, 1e-6, 1e-6);
  REQUIRE_CLOSE(s32, se, 1e-6, 1e-6);
}

TEST_CASE("rotary_embedding with x [B, T, H, D] and tables [T, 1, D/2]", "[cpu]") {
  const int64_t B = 2, T = 5, H = 3, D = 6;
  auto [c, s] = rope_tables(T, D, 10000.0, DType::kF64);
  Tensor c3 = c.unsqueeze(1), s3 = s.unsqueeze(1);  // [T, 1, D/2]
  Tensor x = rand({B, T, H, D}, DType::kF64, 3);
  auto pos = [](int64_t, int64_t t, int64_t) { return t; };
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    auto ref = rope_ref(x.to_vector<double>(), x.shape(), style, pos);
    REQUIRE_CLOSE(rotary_embedding(x, c3, s3, style), ref, 1e-12, 1e-12);
    REQUIRE_CLOSE(rotary_embedding(noncontig(x), noncontig(c3), noncontig(s3), style), ref, 1e-12, 1e-12);
    REQUIRE_CLOSE(rotary_embedding(x.to(DType::kF32), c3.to(DType::kF32), s3.to(DType::kF32), style), ref, 1e-5,
                  1e-5);
    Tensor y16 = rotary_embedding(x.to(DType::kBF16), c3, s3, style);
    REQUIRE(y16.dtype() == DType::kBF16);
    REQUIRE_CLOSE(y16, ref, 2e-2, 2e-2);
  }
}

TEST_CASE("rotary_embedding with x [B, H, T, D] and tables [T, D/2]", "[cpu]") {
  const int64_t B = 2, H = 3, T = 5, D = 8;
  auto [c, s] = rope_tables(T, D);  // f32 tables with an f64 x
  Tensor x = rand({B, H, T, D}, DType::kF64, 4);
  auto pos = [](int64_t, int64_t, int64_t t) { return t; };
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    auto ref = rope_ref(x.to_vector<double>(), x.shape(), style, pos);
    REQUIRE_CLOSE(rotary_embedding(noncontig(x), c, s, style), ref, 1e-6, 1e-6);
    // A transposed x (non-contiguous in a leading dim).
    Tensor xt = x.transpose(1, 2).contiguous().transpose(1, 2);
    REQUIRE_CLOSE(rotary_embedding(xt, c, s, style), ref, 1e-6, 1e-6);
    Tensor y16 = rotary_embedding(x.to(DType::kF16), c, s, style);
    REQUIRE(y16.dtype() == DType::kF16);
    REQUIRE_CLOSE(y16, ref, 5e-3, 5e-3);
  }
}

TEST_CASE("rotary_embedding with per-batch positions [B, 1, T, D/2]", "[cpu]") {
  // Table rows picked per batch: batch 0 at positions 0..T-1, batch 1 at positions 3..T+2.
  const int64_t B = 2, H = 3, T = 4, D = 6;
  auto [c, s] = rope_tables(T + 3, D, 10000.0, DType::kF64);
  Tensor cb = zeros({B, 1, T, D / 2}, DType::kF64), sb = zeros({B, 1, T, D / 2}, DType::kF64);
  cb.select(0, 0).select(0, 0).copy_(c.narrow(0, 0, T));
  cb.select(0, 1).select(0, 0).copy_(c.narrow(0, 3, T));
  sb.select(0, 0).select(0, 0).copy_(s.narrow(0, 0, T));
  sb.select(0, 1).select(0, 0).copy_(s.narrow(0, 3, T));
  Tensor x = rand({B, H, T, D}, DType::kF64, 5);
  auto pos = [](int64_t b, int64_t, int64_t t) { return t + 3 * b; };
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    auto ref = rope_ref(x.to_vector<double>(), x.shape(), style, pos);
    REQUIRE_CLOSE(rotary_embedding(x, cb, sb, style), ref, 1e-12, 1e-12);
  }
}

TEST_CASE("rotary_embedding gradients", "[cpu]") {
  // Not a structured binding: the lambdas below capture c and s, which clang < 16 refuses.
  const auto tables = rope_tables(5, 6, 10000.0, DType::kF64);
  Tensor c = tables.first, s = tables.second;
  Tensor c3 = c.unsqueeze(1), s3 = s.unsqueeze(1);
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    Tensor x = noncontig(rand({2, 5, 3, 6}, DType::kF64, 6)).requires_grad_();
    REQUIRE_GRADCHECK([&](const std::vector<Tensor>& in) { return rotary_embedding(in[0], c3, s3, style); }, {x});
    Tensor x2 = noncontig(rand({2, 3, 5, 6}, DType::kF64, 7)).requires_grad_();
    REQUIRE_GRADCHECK([&](const std::vector<Tensor>& in) { return rotary_embedding(in[0], c, s, style); }, {x2});

    // The backward is the inverse rotation: grad of sum(w * rope(x)) is rope^-1(w).
    Tensor x3 = rand({2, 3, 5, 6}, DType::kF64, 8).requires_grad_();
    Tensor w = rand({2, 3, 5, 6}, DType::kF64, 9);
    sum(mul(rotary_embedding(x3, c, s, style), w)).backward();
    auto pos = [](int64_t, int64_t, int64_t t) { return t; };
    REQUIRE_CLOSE(x3.grad(), rope_ref(w.to_vector<double>(), w.shape(), style, pos, true), 1e-12, 1e-12);

    // Double backward goes through the recorded inverse rotation: with y = R x and
    // L = sum(u * y^2), g = dL/dx = R^T (2 u * R x), and d sum(w * g)/dx = R^T (2 u * R w).
    Tensor x4 = rand({1, 2, 5, 6}, DType::kF64, 10).requires_grad_();
    Tensor u = rand({1, 2, 5, 6}, DType::kF64, 11), w4 = rand({1, 2, 5, 6}, DType::kF64, 12);
    Tensor y4 = rotary_embedding(x4, c, s, style);
    Tensor g4 = mt::grad({sum(mul(u, mul(y4, y4)))}, {x4}, {}, false, true)[0];
    sum(mul(g4, w4)).backward();
    auto rw = rope_ref(w4.to_vector<double>(), w4.shape(), style, pos);
    auto uv = u.to_vector<double>();
    for (size_t i = 0; i < rw.size(); ++i) rw[i] *= 2 * uv[i];
    REQUIRE_CLOSE(x4.grad(), rope_ref(rw, w4.shape(), style, pos, true), 1e-12, 1e-12);
  }
}

TEST_CASE("rotary_embedding errors name the op and the shapes", "[cpu]") {
  auto [c, s] = rope_tables(5, 6);
  Tensor x = rand({2, 5, 3, 6}, DType::kF32);
  REQUIRE_THROWS_WITH(rotary_embedding(rand({2, 5, 3, 7}, DType::kF32), c, s),
                      Catch::Contains("rotary_embedding") && Catch::Contains("[2, 5, 3, 7]"));
  // [T, D/2] against x [B, T, H, D] lines T up with H: 5 vs 3.
  REQUIRE_THROWS_WITH(rotary_embedding(x, c, s),
                      Catch::Contains("rotary_embedding") && Catch::Contains("[5, 3]") &&
                          Catch::Contains("[2, 5, 3, 6]"));
  REQUIRE_THROWS_WITH(rotary_embedding(x, c.unsqueeze(1).narrow(2, 0, 2), s.unsqueeze(1)),
                      Catch::Contains("rotary_embedding") && Catch::Contains("[5, 1, 2]"));
  REQUIRE_THROWS_WITH(rotary_embedding(rand({6}, DType::kF32), c, s), Catch::Contains("rotary_embedding"));
  REQUIRE_THROWS_WITH(rotary_embedding(zeros({2, 5, 3, 6}, DType::kI64), c.unsqueeze(1), s.unsqueeze(1)),
                      Catch::Contains("rotary_embedding") && Catch::Contains("i64"));
  REQUIRE_THROWS_WITH(rope_tables(4, 7), Catch::Contains("rope_tables") && Catch::Contains("7"));
}

TEST_CASE("rotary_embedding on sizes that run in parallel", "[cpu]") {
  const int64_t B = 3, T = 67, H = 5, D = 64;
  auto [c, s] = rope_tables(T, D, 10000.0, DType::kF64);
  Tensor x = rand({B, T, H, D}, DType::kF32, 13);
  auto pos = [](int64_t, int64_t t, int64_t) { return t; };
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved})
    REQUIRE_CLOSE(rotary_embedding(x, c.unsqueeze(1), s.unsqueeze(1), style),
                  rope_ref(x.to_vector<double>(), x.shape(), style, pos), 1e-5, 1e-5);
}
