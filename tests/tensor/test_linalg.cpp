// matmul, bmm and linear: values against a naive triple loop (odd sizes, transposed, strided,
// broadcast and 1-D operands, f64/f32/bf16), the GEMM kernel's alpha/beta, gradients by finite
// differences, and error messages.
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/registry.h"
#include "testing.h"

using namespace mt;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

// Naive numpy-style matmul on row-major values: a [..., M, K] @ b [..., K, N] with broadcast batch
// dims, 1-D operands promoted and their inserted dim removed afterwards.
Tensor ref_matmul(const Tensor& a, const Tensor& b) {
  std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  std::vector<int64_t> sa = a.shape().vec(), sb = b.shape().vec();
  const bool a_vec = sa.size() == 1, b_vec = sb.size() == 1;
  if (a_vec) sa.insert(sa.begin(), 1);
  if (b_vec) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  std::vector<int64_t> ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const size_t nb = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), nb - ba.size(), 1);
  bb.insert(bb.begin(), nb - bb.size(), 1);
  std::vector<int64_t> bo(nb);
  int64_t batch = 1;
  for (size_t d = 0; d < nb; ++d) {
    bo[d] = std::max(ba[d], bb[d]);
    batch *= bo[d];
  }
  std::vector<double> out(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t i = 0; i < batch; ++i) {
    int64_t rem = i, ia = 0, ib = 0, sta = 1, stb = 1;
    for (int d = static_cast<int>(nb) - 1; d >= 0; --d) {
      int64_t idx = rem % bo[d];
      rem /= bo[d];
      ia += (ba[d] == 1 ? 0 : idx) * sta;
      ib += (bb[d] == 1 ? 0 : idx) * stb;
      sta *= ba[d];
      stb *= bb[d];
    }
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        double acc = 0;
        for (int64_t t = 0; t < k; ++t)
          acc += va[static_cast<size_t>(ia * m * k + r * k + t)] * vb[static_cast<size_t>(ib * k * n + t * n + c)];
        out[static_cast<size_t>((i * m + r) * n + c)] = acc;
      }
  }
  std::vector<int64_t> so = bo;
  if (!a_vec) so.push_back(m);
  if (!b_vec) so.push_back(n);
  return from_vector<double>(out, Shape(so));
}

// A random tensor of `shape` laid out column-major in its last two dims (a transposed view).
Tensor rand_t(const Shape& shape, DType dt, uint64_t seed) {
  Shape s = shape;
  std::swap(s[s.size() - 1], s[s.size() - 2]);
  return rand(s, dt, seed).transpose(-1, -2);
}

}  // namespace

TEST_CASE("matmul of odd-sized 2-D and batched operands matches a naive loop", "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32}) {
    double tol = dt == DType::kF64 ? 1e-12 : 1e-5;
    Tensor a = rand({3, 5}, dt, 1), b = rand({5, 7}, dt, 2);
    Tensor c = matmul(a, b);
    REQUIRE(c.dtype() == dt);
    REQUIRE_CLOSE(c, ref_matmul(a, b), tol, tol);
    Tensor a3 = rand({3, 5, 7}, dt, 3), b3 = rand({3, 7, 4}, dt, 4);
    REQUIRE_CLOSE(matmul(a3, b3), ref_matmul(a3, b3), tol, tol);
    REQUIRE_CLOSE(bmm(a3, b3), ref_matmul(a3, b3), tol, tol);
  }
}

TEST_CASE("matmul broadcasts batch dims", "[cpu]") {
  Tensor a = rand({2, 1, 3, 5}, DType::kF64, 1), b = rand({4, 5, 6}, DType::kF64, 2);
  Tensor c = matmul(a, b);
  REQUIRE(c.shape() == Shape{2, 4, 3, 6});
  REQUIRE_CLOSE(c, ref_matmul(a, b), 1e-12, 1e-12);
  // Batched a with a 2-D b (contiguous a folds into one GEMM; strided a runs per batch).
  Tensor a2 = rand({2, 3, 3, 5}, DType::kF32, 3), w = rand({5, 7}, DType::kF32, 4);
  REQUIRE_CLOSE(matmul(a2, w), ref_matmul(a2, w), 1e-5, 1e-5);
  REQUIRE_CLOSE(matmul(noncontig(a2), w), ref_matmul(a2, w), 1e-5, 1e-5);
  REQUIRE_CLOSE(matmul(a2.transpose(1, 2), w), ref_matmul(a2.transpose(1, 2), w), 1e-5, 1e-5);
  // 2-D a with batched b; batch dims of size 1 on both sides.
  Tensor b3 = rand({3, 1, 5, 2}, DType::kF64, 5), a3 = rand({1, 4, 3, 5}, DType::kF64, 6);
  REQUIRE_CLOSE(matmul(a3, b3), ref_matmul(a3, b3), 1e-12, 1e-12);
  REQUIRE_CLOSE(matmul(rand({3, 5}, DType::kF64, 7), b3), ref_matmul(rand({3, 5}, DType::kF64, 7), b3), 1e-12);
}

TEST_CASE("matmul takes transposed, strided and expanded operands", "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32}) {
    double tol = dt == DType::kF64 ? 1e-12 : 1e-5;
    Tensor at = rand_t({3, 5}, dt, 1), bt = rand_t({5, 7}, dt, 2);
    Tensor a = rand({3, 5}, dt, 3), b = rand({5, 7}, dt, 4);
    REQUIRE_CLOSE(matmul(at, b), ref_matmul(at, b), tol, tol);
    REQUIRE_CLOSE(matmul(a, bt), ref_matmul(a, bt), tol, tol);
    REQUIRE_CLOSE(matmul(at, bt), ref_matmul(at, bt), tol, tol);
    // No unit stride in either dim: made contiguous.
    REQUIRE_CLOSE(matmul(noncontig(a), noncontig(b)), ref_matmul(a, b), tol, tol);
    // Unit stride with a row stride larger than the row (a narrowed view).
    Tensor wide = rand({3, 9}, dt, 5).narrow(1, 2, 5);
    REQUIRE_CLOSE(matmul(wide, b), ref_matmul(wide, b), tol, tol);
    // Batched transposes, and a batch dim that is not outermost in memory.
    Tensor a3 = rand_t({4, 3, 5}, dt, 6), b3 = rand({5, 4, 7}, dt, 7).permute({1, 0, 2});
    REQUIRE_CLOSE(matmul(a3, b3), ref_matmul(a3, b3), tol, tol);
    // Stride 0 inside a matrix (an expanded row) and in a batch dim.
    Tensor row = rand({1, 5}, dt, 8).expand({3, 5});
    REQUIRE_CLOSE(matmul(row, b), ref_matmul(row, b), tol, tol);
    Tensor eb = rand({5, 7}, dt, 9).unsqueeze(0).expand({4, 5, 7});
    Tensor ea = rand({4, 3, 5}, dt, 10);
    REQUIRE_CLOSE(bmm(ea, eb), ref_matmul(ea, eb), tol, tol);
  }
}

TEST_CASE("matmul with 1-D operands follows numpy", "[cpu]") {
  Tensor v = rand({5}, DType::kF64, 1), w = rand({5}, DType::kF64, 2);
  Tensor m = rand({5, 3}, DType::kF64, 3), m4 = rand({4, 5}, DType::kF64, 4);
  Tensor bm = rand({2, 5, 3}, DType::kF64, 5), bl = rand({2, 4, 5}, DType::kF64, 6);
  Tensor dot = matmul(v, w);
  REQUIRE(dot.dim() == 0);
  REQUIRE_CLOSE(dot, ref_matmul(v, w), 1e-12, 1e-12);
  REQUIRE(matmul(v, m).shape() == Shape{3});
  REQUIRE_CLOSE(matmul(v, m), ref_matmul(v, m), 1e-12, 1e-12);
  REQUIRE(matmul(m4, v).shape() == Shape{4});
  REQUIRE_CLOSE(matmul(m4, v), ref_matmul(m4, v), 1e-12, 1e-12);
  REQUIRE(matmul(v, bm).shape() == Shape{2, 3});
  REQUIRE_CLOSE(matmul(v, bm), ref_matmul(v, bm), 1e-12, 1e-12);
  REQUIRE(matmul(bl, v).shape() == Shape{2, 4});
  REQUIRE_CLOSE(matmul(bl, v), ref_matmul(bl, v), 1e-12, 1e-12);
  REQUIRE_CLOSE(matmul(noncontig(v), noncontig(w)), ref_matmul(v, w), 1e-12, 1e-12);
}

TEST_CASE("matmul of larger and many small matrices (threaded paths)", "[cpu]") {
  Tensor a = rand({131, 257}, DType::kF32, 1), b = rand({257, 99}, DType::kF32, 2);
  REQUIRE_CLOSE(matmul(a, b), ref_matmul(a, b), 1e-4, 1e-4);
  REQUIRE_CLOSE(matmul(b.t(), a.t()), ref_matmul(b.t(), a.t()), 1e-4, 1e-4);
  Tensor sa = rand({300, 9, 11}, DType::kF64, 3), sb = rand({300, 11, 7}, DType::kF64, 4);
  REQUIRE_CLOSE(bmm(sa, sb), ref_matmul(sa, sb), 1e-12, 1e-12);
  Tensor ma = rand({3, 120, 130}, DType::kF64, 5), mb = rand({3, 130, 110}, DType::kF64, 6);
  REQUIRE_CLOSE(bmm(ma, mb), ref_matmul(ma, mb), 1e-11, 1e-11);
}

TEST_CASE("matmul does not depend on the thread count (OpenBLAS or Eigen)", "[cpu]") {
#ifdef _OPENMP
  // Shapes of a training step (thin weight gradients, transposed operands) and odd ones, f32 and
  // f64, each at 1 and 3 threads: the same bits (the CPU backend's promise, docs/decisions.md).
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{256, 512}, {512, 1376}}, {{300, 700}, {700, 500}}, {{67, 131}, {131, 29}}, {{1, 513}, {513, 1025}},
      {{300, 96}, {96, 100}}, {{1024, 64}, {64, 64}}, {{1100, 48}, {48, 1200}}, {{2100, 40}, {40, 70}}};
  // (a @ b splits by rows for the last four, into four blocks, one short, at 2100 rows)
  const int prev = omp_get_max_threads();
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (const auto& [sa, sb] : shapes) {
      Tensor a = rand(sa, dt, 11), b = rand(sb, dt, 12);
      Tensor at = rand(Shape{sa[1], sa[0]}, dt, 13).transpose(0, 1);  // a weight gradient's dy^T
      auto run = [&](int threads) {
        omp_set_num_threads(threads);
        return std::vector<Tensor>{matmul(a, b), matmul(at, b), matmul(b.transpose(0, 1), a.transpose(0, 1))};
      };
      const auto one = run(1), many = run(3);
      for (size_t i = 0; i < one.size(); ++i) {
        INFO(fmt::format("{} {} x {} product {}", dtype_name(dt), sa, sb, i));
        REQUIRE(one[i].to_vector<double>() == many[i].to_vector<double>());
      }
    }
  }
  omp_set_num_threads(prev);
#endif
}

TEST_CASE("matmul with empty dims", "[cpu]") {
  Tensor c = matmul(rand({0, 3}), rand({3, 4}));
  REQUIRE(c.shape() == Shape{0, 4});
  Tensor z = matmul(rand({2, 0}), rand({0, 3}));
  REQUIRE(z.shape() == Shape{2, 3});
  REQUIRE_CLOSE(z, std::vector<double>(6, 0.0));
  REQUIRE(bmm(rand({0, 2, 3}), rand({0, 3, 4})).shape() == Shape{0, 2, 4});
}

TEST_CASE("matmul in bf16 and f16 computes in f32 and rounds once", "[cpu]") {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    Tensor a = rand({3, 5, 7}, dt, 1), b = rand_t({3, 7, 4}, dt, 2);
    Tensor c = matmul(a, b);
    REQUIRE(c.dtype() == dt);
    REQUIRE_CLOSE(c, ref_matmul(a, b), 2e-2, 2e-2);
    Tensor l = linear(a, rand({6, 7}, dt, 3), rand({6}, dt, 4));
    REQUIRE(l.dtype() == dt);
  }
  // Mixed precision promotes: bf16 @ f32 gives f32.
  Tensor a = rand({3, 5}, DType::kBF16, 1), b = rand({5, 2}, DType::kF32, 2);
  Tensor c = matmul(a, b);
  REQUIRE(c.dtype() == DType::kF32);
  REQUIRE_CLOSE(c, ref_matmul(a, b), 1e-5, 1e-5);
}

TEST_CASE("linear with a 16-bit weight gives the bits of its f32 copy, forward and backward", "[cpu]") {
  // The CPU kernel widens a bf16/f16 weight block by block (kernels/cpu/matmul.cpp,
  // matmul_widen_b) instead of the front end making an f32 copy: the output and both gradients
  // equal, bit for bit, those computed from explicit f32 copies and rounded as the 16-bit path
  // rounds them. Widths of 1, 4 and 6 column blocks, a bias, and x as a 3-D batch; 296 rows with
  // 40 outputs split by rows (the weight widened once for all row blocks).
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (auto [bt, out_f] : {std::pair<int64_t, int64_t>{2, 40}, {2, 600}, {2, 1376}, {8, 40}}) {
      INFO(dtype_name(dt) << " batch " << bt << " out " << out_f);
      const Tensor x0 = rand({bt, 37, 96}, dt, 21), w0 = rand({out_f, 96}, dt, 22), b0 = rand({out_f}, dt, 23);
      const Tensor gy = rand({bt, 37, out_f}, dt, 24);
      Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
      Tensor y = linear(x, w, b);
      y.backward(gy);
      // The reference: f32 leaves, the same products, each result rounded to dt once.
      Tensor xf = x0.to(DType::kF32).requires_grad_(), wf = w0.to(DType::kF32).requires_grad_();
      Tensor bf = b0.to(DType::kF32).requires_grad_();
      Tensor yf = linear(xf, wf, bf);
      yf.backward(gy.to(DType::kF32));
      REQUIRE_CLOSE(y, yf.to(dt), 0, 0);
      REQUIRE_CLOSE(x.grad(), xf.grad().to(dt), 0, 0);
      REQUIRE_CLOSE(w.grad(), wf.grad().to(dt), 0, 0);
      REQUIRE(w.grad().dtype() == dt);
#ifdef _OPENMP
      const int prev = omp_get_max_threads();
      omp_set_num_threads(prev == 1 ? 2 : 1);  // and the other thread count gives the same bits
      Tensor w2 = w0.clone().requires_grad_();
      Tensor y2 = linear(x0, w2, b0);
      y2.backward(gy);
      omp_set_num_threads(prev);
      REQUIRE_CLOSE(y2, y, 0, 0);
      REQUIRE_CLOSE(w2.grad(), w.grad(), 0, 0);
#endif
    }
  }
}

TEST_CASE("the matmul kernel computes alpha * a @ b + beta * out", "[cpu]") {
  Tensor a = rand({2, 3, 4}, DType::kF64, 1), b = rand_t({2, 4, 5}, DType::kF64, 2);
  Tensor c0 = rand({2, 3, 5}, DType::kF64, 3);
  Tensor out = c0.clone();
  MatmulParams p;
  p.a = a.view_info();
  p.b = b.view_info();
  p.out = out.view_info();
  p.alpha = 0.5;
  p.beta = -2;
  kernels(DeviceType::kCPU).matmul(p);
  std::vector<double> r = ref_matmul(a, b).to_vector<double>(), c = c0.to_vector<double>();
  for (size_t i = 0; i < r.size(); ++i) r[i] = 0.5 * r[i] - 2 * c[i];
  REQUIRE_CLOSE(out, r, 1e-12, 1e-12);
}

TEST_CASE("linear = x @ weight^T + bias", "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32}) {
    double tol = dt == DType::kF64 ? 1e-12 : 1e-5;
    Tensor x = rand({2, 3, 5}, dt, 1), w = rand({4, 5}, dt, 2), bias = rand({4}, dt, 3);
    std::vector<double> ref = ref_matmul(x, w.t()).to_vector<double>(), vb = bias.to_vector<double>();
    std::vector<double> with_bias = ref;
    for (size_t i = 0; i < ref.size(); ++i) with_bias[i] += vb[i % 4];
    Tensor y = linear(x, w, bias);
    REQUIRE(y.shape() == Shape{2, 3, 4});
    REQUIRE_CLOSE(y, with_bias, tol, tol);
    REQUIRE_CLOSE(linear(x, w), ref, tol, tol);
    REQUIRE_CLOSE(linear(noncontig(x), noncontig(w), noncontig(bias)), with_bias, tol, tol);
    REQUIRE_CLOSE(linear(x.transpose(0, 1), w), ref_matmul(x.transpose(0, 1), w.t()), tol, tol);
    Tensor v = rand({5}, dt, 4);
    REQUIRE(linear(v, w, bias).shape() == Shape{4});
    REQUIRE_CLOSE(linear(v, w), ref_matmul(v, w.t()), tol, tol);
  }
}

TEST_CASE("linear over an empty inner dim gives the bias and empty gradients", "[cpu]") {
  // A tensor-parallel slice of the inner dim can be empty (intermediate 3 over 4 ranks: the row
  // split of down_proj leaves the last rank none); its partial product is zero.
  for (DType dt : {DType::kF64, DType::kF32}) {
    Tensor x = zeros({2, 3, 0}, dt).requires_grad_(), w = zeros({4, 0}, dt).requires_grad_();
    Tensor bias = rand({4}, dt, 3).requires_grad_();
    Tensor y = linear(x, w, bias);
    REQUIRE(y.shape() == Shape{2, 3, 4});
    const std::vector<double> b = bias.to_vector<double>();
    std::vector<double> want;
    for (int i = 0; i < 6; ++i) want.insert(want.end(), b.begin(), b.end());
    REQUIRE(y.to_vector<double>() == want);
    REQUIRE(linear(x, w).to_vector<double>() == std::vector<double>(24, 0.0));
    sum(y).backward();
    REQUIRE(x.grad().shape() == Shape{2, 3, 0});
    REQUIRE(w.grad().shape() == Shape{4, 0});
    REQUIRE(bias.grad().to_vector<double>() == std::vector<double>(4, 6.0));
  }
}

TEST_CASE("matmul of [B, M, K] by [K, N] with K or N empty, and its gradients", "[cpu]") {
  // An uneven column or contraction split leaves a rank K or N of 0; the one-GEMM paths viewed
  // the rows as [-1, K] or [-1, N], ambiguous when that dim is 0, and threw until 2026-12-07 (the
  // other ranks then waited in the gradient's collective).
  for (auto [k, n] : {std::pair<int64_t, int64_t>{0, 5}, {4, 0}}) {
    INFO("K " << k << " N " << n);
    Tensor a = rand({2, 3, k}, DType::kF64, 1).requires_grad_(), b = rand({k, n}, DType::kF64, 2).requires_grad_();
    Tensor y = matmul(a, b);
    REQUIRE(y.shape() == Shape{2, 3, n});
    REQUIRE(y.to_vector<double>() == std::vector<double>(static_cast<size_t>(6 * n), 0.0));
    sum(y).backward();
    REQUIRE(a.grad().shape() == Shape{2, 3, k});
    REQUIRE(b.grad().shape() == Shape{k, n});
    REQUIRE(a.grad().to_vector<double>() == std::vector<double>(static_cast<size_t>(6 * k), 0.0));
  }
}

TEST_CASE("matmul gradients by finite differences", "[cpu]") {
  auto mm = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  SECTION("2-D non-contiguous") {
    REQUIRE_GRADCHECK(mm, {noncontig(rand({3, 4}, DType::kF64, 1)).requires_grad_(),
                           noncontig(rand({4, 5}, DType::kF64, 2)).requires_grad_()});
  }
  SECTION("transposed") {
    REQUIRE_GRADCHECK(mm, {rand_t({3, 4}, DType::kF64, 1).requires_grad_(),
                           rand_t({2, 4, 5}, DType::kF64, 2).requires_grad_()});
  }
  SECTION("broadcast batch dims") {
    REQUIRE_GRADCHECK(mm, {rand({2, 1, 3, 4}, DType::kF64, 1).requires_grad_(),
                           noncontig(rand({3, 4, 2}, DType::kF64, 2)).requires_grad_()});
  }
  SECTION("batched a with a 2-D b, contiguous and strided") {
    REQUIRE_GRADCHECK(mm, {rand({2, 3, 4}, DType::kF64, 1).requires_grad_(), rand({4, 3}, DType::kF64, 2).requires_grad_()});
    REQUIRE_GRADCHECK(mm, {noncontig(rand({2, 3, 4}, DType::kF64, 3)).requires_grad_(),
                           rand_t({4, 3}, DType::kF64, 4).requires_grad_()});
  }
  SECTION("2-D a with batched b") {
    REQUIRE_GRADCHECK(mm, {rand({3, 4}, DType::kF64, 1).requires_grad_(), rand({2, 4, 3}, DType::kF64, 2).requires_grad_()});
  }
  SECTION("1-D operands") {
    Tensor v = noncontig(rand({4}, DType::kF64, 1)).requires_grad_();
    Tensor w = rand({4}, DType::kF64, 2).requires_grad_();
    REQUIRE_GRADCHECK(mm, {v, w});
    REQUIRE_GRADCHECK(mm, {v, rand({4, 3}, DType::kF64, 3).requires_grad_()});
    REQUIRE_GRADCHECK(mm, {rand({3, 4}, DType::kF64, 4).requires_grad_(), w});
    REQUIRE_GRADCHECK(mm, {v, rand({2, 4, 3}, DType::kF64, 5).requires_grad_()});
    REQUIRE_GRADCHECK(mm, {rand({2, 3, 4}, DType::kF64, 6).requires_grad_(), w});
  }
  SECTION("only one operand needs grad") {
    Tensor a = rand({3, 4}, DType::kF64, 1).requires_grad_();
    REQUIRE_GRADCHECK(mm, {a, rand({4, 2}, DType::kF64, 2)});
    REQUIRE_GRADCHECK(mm, {rand({2, 3}, DType::kF64, 3), rand({3, 4}, DType::kF64, 4).requires_grad_()});
  }
}

TEST_CASE("bmm and linear gradients by finite differences", "[cpu]") {
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return bmm(in[0], in[1]); },
                    {noncontig(rand({2, 3, 4}, DType::kF64, 1)).requires_grad_(),
                     rand_t({2, 4, 3}, DType::kF64, 2).requires_grad_()});
  auto lin = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
  auto lin_nb = [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); };
  Tensor w = noncontig(rand({3, 4}, DType::kF64, 2)).requires_grad_();
  Tensor b = noncontig(rand({3}, DType::kF64, 3)).requires_grad_();
  REQUIRE_GRADCHECK(lin, {noncontig(rand({2, 5, 4}, DType::kF64, 1)).requires_grad_(), w, b});
  REQUIRE_GRADCHECK(lin, {rand({4}, DType::kF64, 4).requires_grad_(), w, b});
  REQUIRE_GRADCHECK(lin_nb, {rand({5, 4}, DType::kF64, 5).requires_grad_(), w});
  REQUIRE_GRADCHECK(lin, {rand({5, 4}, DType::kF64, 6), w, b});  // x needs no grad
}

TEST_CASE("bf16 matmul passes gradients back in bf16", "[cpu]") {
  Tensor a = rand({3, 4}, DType::kBF16, 1).requires_grad_(), b = rand({4, 2}, DType::kBF16, 2).requires_grad_();
  sum(matmul(a, b)).backward();
  REQUIRE(a.grad().dtype() == DType::kBF16);
  REQUIRE(b.grad().dtype() == DType::kBF16);
  // d/da sum(a @ b) = row sums of b, broadcast over rows.
  std::vector<double> vb = b.to_vector<double>(), ga = a.grad().to_vector<double>();
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 4; ++k) REQUIRE(std::abs(ga[i * 4 + k] - (vb[k * 2] + vb[k * 2 + 1])) < 2e-2);
}

TEST_CASE("matmul, bmm and linear reject bad shapes and dtypes", "[cpu]") {
  Tensor a = rand({2, 3}), b = rand({4, 5});
  REQUIRE_THROWS_WITH(matmul(a, b), Catch::Contains("matmul") && Catch::Contains("[2, 3]") && Catch::Contains("[4, 5]"));
  REQUIRE_THROWS_WITH(matmul(rand({2, 3, 4}), rand({3, 5, 2})), Catch::Contains("matmul") && Catch::Contains("[2, 3, 4]"));
  REQUIRE_THROWS_WITH(matmul(rand({2, 3, 4}), rand({3, 4, 2})), Catch::Contains("matmul") && Catch::Contains("[2, 3, 4]") &&
                                                                    Catch::Contains("[3, 4, 2]"));
  REQUIRE_THROWS_WITH(matmul(rand({5}), rand({4})), Catch::Contains("matmul") && Catch::Contains("[5]"));
  REQUIRE_THROWS_WITH(matmul(scalar_tensor(1.0), rand({3})), Catch::Contains("matmul"));
  Tensor ia = ones({2, 3}, DType::kI64), ib = ones({3, 2}, DType::kI64);
  REQUIRE_THROWS_WITH(matmul(ia, ib), Catch::Contains("matmul") && Catch::Contains("integer"));
  REQUIRE_THROWS_WITH(matmul(rand({2, 3}), ib), Catch::Contains("matmul") && Catch::Contains("i64"));
  REQUIRE_THROWS_WITH(bmm(rand({2, 3}), rand({3, 2})), Catch::Contains("bmm") && Catch::Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(bmm(rand({2, 3, 4}), rand({3, 4, 2})), Catch::Contains("bmm") && Catch::Contains("[3, 4, 2]"));
  REQUIRE_THROWS_WITH(bmm(rand({2, 3, 4}), rand({2, 5, 2})), Catch::Contains("bmm") && Catch::Contains("[2, 5, 2]"));
  REQUIRE_THROWS_WITH(bmm(ones({2, 3, 4}, DType::kI32), ones({2, 4, 2}, DType::kI32)), Catch::Contains("bmm"));
  REQUIRE_THROWS_WITH(linear(rand({2, 5}), rand({3, 4})), Catch::Contains("linear") && Catch::Contains("[2, 5]") &&
                                                              Catch::Contains("[3, 4]"));
  REQUIRE_THROWS_WITH(linear(rand({2, 4}), rand({3, 4}), rand({4})), Catch::Contains("linear") && Catch::Contains("[4]"));
  REQUIRE_THROWS_WITH(linear(rand({2, 4}), rand({4})), Catch::Contains("linear") && Catch::Contains("[4]"));
  REQUIRE_THROWS_WITH(linear(ones({2, 4}, DType::kI64), rand({3, 4})), Catch::Contains("linear"));
}
