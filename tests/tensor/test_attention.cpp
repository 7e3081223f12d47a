// Scaled dot-product attention: values against a naive triple loop (grouped kv heads, causal with
// S == T, S > T and S < T, non-causal, Dv != D, custom scale), non-contiguous and 16-bit inputs,
// finite-difference gradients and shape errors.
#include <cmath>

#include "testing.h"

using namespace mt;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

// Naive attention on contiguous f64 copies; rows with no visible key give zeros.
std::vector<double> attn_ref(const Tensor& qt, const Tensor& kt, const Tensor& vt, bool causal, double scale) {
  auto q = qt.to_vector<double>(), k = kt.to_vector<double>(), v = vt.to_vector<double>();
  const int64_t B = qt.size(0), Hq = qt.size(1), T = qt.size(2), D = qt.size(3);
  const int64_t Hkv = kt.size(1), S = kt.size(2), Dv = vt.size(3);
  if (scale == 0) scale = 1 / std::sqrt(static_cast<double>(D));
  std::vector<double> out(static_cast<size_t>(B * Hq * T * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> sc(static_cast<size_t>(S));
        std::vector<bool> ok(static_cast<size_t>(S));
        double m = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          ok[s] = !causal || s <= t + (S - T);
          double d = 0;
          for (int64_t i = 0; i < D; ++i) d += q[((b * Hq + h) * T + t) * D + i] * k[((b * Hkv + g) * S + s) * D + i];
          sc[s] = d * scale;
          if (ok[s]) m = std::max(m, sc[s]);
        }
        double z = 0;
        for (int64_t s = 0; s < S; ++s) z += ok[s] ? std::exp(sc[s] - m) : 0.0;
        for (int64_t s = 0; s < S; ++s) {
          if (!ok[s]) continue;
          double p = std::exp(sc[s] - m) / z;
          for (int64_t j = 0; j < Dv; ++j)
            out[((b * Hq + h) * T + t) * Dv + j] += p * v[((b * Hkv + g) * S + s) * Dv + j];
        }
      }
    }
  return out;
}

struct Case {
  int64_t B, Hq, Hkv, T, S, D, Dv;
  Causal causal;
  double scale;
};

const Case kCases[] = {
    {2, 6, 2, 5, 5, 7, 7, Causal::kYes, 0},    // GQA, square causal
    {2, 6, 2, 5, 5, 7, 7, Causal::kNo, 0},     // GQA, full
    {2, 6, 2, 5, 8, 7, 7, Causal::kYes, 0},    // S > T: the causal diagonal is offset by S - T
    {1, 3, 3, 6, 4, 5, 3, Causal::kYes, 0.7},  // S < T: the first rows see no key; Dv != D
    {2, 4, 1, 3, 9, 2, 5, Causal::kNo, 0},     // multi-query, Dv != D
};

}  // namespace

TEST_CASE("scaled_dot_product_attention values", "[cpu]") {
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    INFO("B " << c.B << " Hq " << c.Hq << " Hkv " << c.Hkv << " T " << c.T << " S " << c.S << " D " << c.D);
    Tensor q = rand({c.B, c.Hq, c.T, c.D}, DType::kF64, seed++, -2, 2);
    Tensor k = rand({c.B, c.Hkv, c.S, c.D}, DType::kF64, seed++, -2, 2);
    Tensor v = rand({c.B, c.Hkv, c.S, c.Dv}, DType::kF64, seed++);
    auto ref = attn_ref(q, k, v, c.causal == Causal::kYes, c.scale);
    Tensor out = scaled_dot_product_attention(q, k, v, c.causal, c.scale);
    REQUIRE(out.shape() == Shape{c.B, c.Hq, c.T, c.Dv});
    REQUIRE_CLOSE(out, ref, 1e-12, 1e-12);
    REQUIRE_CLOSE(scaled_dot_product_attention(noncontig(q), noncontig(k), noncontig(v), c.causal, c.scale), ref,
                  1e-12, 1e-12);
    // [B, T, H, D] storage seen as [B, H, T, D], as a model's projections produce it.
    Tensor qt = q.transpose(1, 2).contiguous().transpose(1, 2);
    Tensor kt = k.transpose(1, 2).contiguous().transpose(1, 2);
    Tensor vt = v.transpose(1, 2).contiguous().transpose(1, 2);
    REQUIRE_CLOSE(scaled_dot_product_attention(qt, kt, vt, c.causal, c.scale), ref, 1e-12, 1e-12);

    Tensor o32 = scaled_dot_product_attention(q.to(DType::kF32), k.to(DType::kF32), v.to(DType::kF32), c.causal,
                                              c.scale);
    REQUIRE(o32.dtype() == DType::kF32);
    REQUIRE_CLOSE(o32, ref, 1e-5, 1e-5);
    Tensor qb = q.to(DType::kBF16), kb = k.to(DType::kBF16), vb = v.to(DType::kBF16);
    Tensor ob = scaled_dot_product_attention(qb, kb, vb, c.causal, c.scale);
    REQUIRE(ob.dtype() == DType::kBF16);
    REQUIRE_CLOSE(ob, attn_ref(qb, kb, vb, c.causal == Causal::kYes, c.scale), 1e-2, 1e-2);
  }
}

TEST_CASE("scaled_dot_product_attention is stable for large scores", "[cpu]") {
  Tensor q = rand({1, 2, 4, 3}, DType::kF64, 20), k = rand({1, 2, 4, 3}, DType::kF64, 21);
  Tensor v = rand({1, 2, 4, 3}, DType::kF64, 22);
  auto ref = attn_ref(q, k, v, true, 300.0);
  Tensor out = scaled_dot_product_attention(q.to(DType::kF32), k.to(DType::kF32), v.to(DType::kF32), Causal::kYes,
                                            300.0);
  REQUIRE_CLOSE(out, ref, 1e-4, 1e-4);
}

TEST_CASE("scaled_dot_product_attention gradients", "[cpu]") {
  uint64_t seed = 30;
  for (const Case& c : kCases) {
    INFO("B " << c.B << " Hq " << c.Hq << " Hkv " << c.Hkv << " T " << c.T << " S " << c.S << " D " << c.D);
    Tensor q = noncontig(rand({c.B, c.Hq, c.T, c.D}, DType::kF64, seed++)).requires_grad_();
    Tensor k = noncontig(rand({c.B, c.Hkv, c.S, c.D}, DType::kF64, seed++)).requires_grad_();
    Tensor v = noncontig(rand({c.B, c.Hkv, c.S, c.Dv}, DType::kF64, seed++)).requires_grad_();
    REQUIRE_GRADCHECK(
        [&](const std::vector<Tensor>& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], c.causal, c.scale);
        },
        {q, k, v});
  }
  // Only some inputs requiring grad; a transposed layout.
  Tensor q = rand({2, 5, 6, 3}, DType::kF64, 40).requires_grad_();
  Tensor k = rand({2, 3, 6, 3}, DType::kF64, 41);
  Tensor v = rand({2, 6, 3, 3}, DType::kF64, 42).requires_grad_();
  REQUIRE_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0].transpose(1, 2), in[1], in[2].transpose(1, 2));
      },
      {q, k, v});
}

TEST_CASE("scaled_dot_product_attention backward in bf16", "[cpu]") {
  Tensor q64 = rand({1, 4, 5, 7}, DType::kF64, 50), k64 = rand({1, 2, 5, 7}, DType::kF64, 51);
  Tensor v64 = rand({1, 2, 5, 7}, DType::kF64, 52);
  Tensor q = q64.to(DType::kBF16).requires_grad_(), k = k64.to(DType::kBF16).requires_grad_();
  Tensor v = v64.to(DType::kBF16).requires_grad_();
  sum(scaled_dot_product_attention(q, k, v)).backward();
  Tensor qr = q.to(DType::kF64).detach().requires_grad_(), kr = k.to(DType::kF64).detach().requires_grad_();
  Tensor vr = v.to(DType::kF64).detach().requires_grad_();
  sum(scaled_dot_product_attention(qr, kr, vr)).backward();
  REQUIRE(q.grad().dtype() == DType::kBF16);
  REQUIRE_CLOSE(q.grad(), qr.grad(), 2e-2, 2e-2);
  REQUIRE_CLOSE(k.grad(), kr.grad(), 2e-2, 2e-2);
  REQUIRE_CLOSE(v.grad(), vr.grad(), 2e-2, 2e-2);
}

TEST_CASE("scaled_dot_product_attention errors name the op and the shapes", "[cpu]") {
  Tensor q = rand({2, 6, 5, 7}, DType::kF32), k = rand({2, 2, 5, 7}, DType::kF32), v = rand({2, 2, 5, 7}, DType::kF32);
  auto op = Catch::Contains("scaled_dot_product_attention");
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(q.select(0, 0), k, v), op && Catch::Contains("[6, 5, 7]"));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(q, rand({2, 4, 5, 7}, DType::kF32), rand({2, 4, 5, 7}, DType::kF32)),
                      op && Catch::Contains("Hq = 6") && Catch::Contains("Hkv = 4") && Catch::Contains("[2, 4, 5, 7]"));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(q, rand({2, 2, 5, 6}, DType::kF32), v),
                      op && Catch::Contains("[2, 6, 5, 7]") && Catch::Contains("[2, 2, 5, 6]"));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(q, k, rand({2, 2, 4, 7}, DType::kF32)),
                      op && Catch::Contains("[2, 2, 4, 7]"));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(q, k, rand({3, 2, 5, 7}, DType::kF32)),
                      op && Catch::Contains("[3, 2, 5, 7]"));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(q, k.to(DType::kF64), v),
                      op && Catch::Contains("f32") && Catch::Contains("f64"));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(zeros({2, 6, 5, 7}, DType::kI64), k, v), op && Catch::Contains("i64"));
}

TEST_CASE("scaled_dot_product_attention on sizes that run in parallel", "[cpu]") {
  // Big enough for the OpenMP paths of both kernels; gradients must be bitwise reproducible.
  Tensor q = rand({2, 4, 48, 16}, DType::kF32, 60), k = rand({2, 2, 64, 16}, DType::kF32, 61);
  Tensor v = rand({2, 2, 64, 16}, DType::kF32, 62);
  REQUIRE_CLOSE(scaled_dot_product_attention(q, k, v), attn_ref(q, k, v, true, 0), 1e-5, 1e-5);
  std::vector<std::vector<float>> first;
  for (int rep = 0; rep < 2; ++rep) {
    Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
    sum(mul(scaled_dot_product_attention(qg, kg, vg), rand({2, 4, 48, 16}, DType::kF32, 63))).backward();
    std::vector<std::vector<float>> grads = {qg.grad().to_vector<float>(), kg.grad().to_vector<float>(),
                                             vg.grad().to_vector<float>()};
    if (rep == 0)
      first = grads;
    else
      REQUIRE(grads == first);
  }
}
