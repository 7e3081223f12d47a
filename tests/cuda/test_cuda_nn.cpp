// The nn kernel families on CUDA against the CPU (the reference backend), through the public ops:
// rms_norm, layer_norm, softmax, log_softmax, rotary_embedding, index_select, index_add,
// embedding, gather, scatter_add, topk, cross_entropy and scaled_dot_product_attention. Each
// case runs the op on CPU tensors and on CUDA copies (contiguous and non-contiguous), compares
// values and, for the same upstream gradient, the gradients of every input, with per-dtype
// tolerances. Sizes are odd, not multiples of the kernels' tiles or vector widths, and large
// where the kernels switch strategy (vocab 50k+, long rows, many index repeats).
// Every test first skips (exit code 77) when no GPU is present.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <vector>

#include "cuda_testing.h"
#include "residual_norm.h"
#include "testing.h"

using namespace mt;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

// Skips the binary (exit 77, meson SKIP) when no GPU is visible: the harness's check.
void require_gpu() { mt::testing::require_cuda(); }

struct Tol {
  double rtol, atol;
};
// CUDA kernels accumulate in float (double for f64) where the CPU accumulates in double, and
// 16-bit results may round the other way by one ulp.
Tol tol(DType t) {
  switch (t) {
    case DType::kF64: return {1e-9, 1e-11};
    case DType::kF32: return {1e-4, 1e-5};
    case DType::kF16: return {1e-2, 5e-3};
    case DType::kBF16: return {3e-2, 2e-2};
    default: return {0, 0};  // integers and bool: exact
  }
}
Tol loose(Tol t, double f) { return {t.rtol * f, t.atol * f}; }

Tensor on_cpu(const Tensor& t) { return t.to(Device::cpu()); }
Tensor on_cuda(const Tensor& t) { return t.to(Device::cuda()); }

enum class Layout { kContiguous, kNonContiguous };
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fn on (clones of) the CPU inputs and on their CUDA copies; compares the outputs and the
// gradients of the inputs that require grad, for one random upstream gradient. With
// kNonContiguous both sides get non-contiguous floating inputs.
void check_vs_cpu(const Fn& fn, const std::vector<Tensor>& inputs, Tol value_tol, Tol grad_tol,
                  Layout layout = Layout::kContiguous, uint64_t seed = 7) {
  std::vector<Tensor> a, b;
  for (const Tensor& x : inputs) {
    Tensor xa = x.detach().clone(), xb = on_cuda(x.detach());
    if (layout == Layout::kNonContiguous && is_floating(x.dtype()) && x.dim() > 0) {
      xa = noncontig(xa);
      xb = noncontig(xb);
    }
    if (x.requires_grad()) {
      xa.requires_grad_();
      xb.requires_grad_();
    }
    a.push_back(xa);
    b.push_back(xb);
  }
  Tensor ya = fn(a), yb = fn(b);
  REQUIRE(yb.device() == Device::cuda());
  REQUIRE(yb.dtype() == ya.dtype());
  REQUIRE_CLOSE(on_cpu(yb), ya, value_tol.rtol, value_tol.atol);
  if (!ya.requires_grad()) return;
  Tensor g = rand(ya.shape(), ya.dtype(), seed);
  ya.backward(g);
  yb.backward(on_cuda(g));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    INFO("gradient of input " << i << " (" << inputs[i].desc() << ")");
    REQUIRE(b[i].grad().defined());
    REQUIRE_CLOSE(on_cpu(b[i].grad()), a[i].grad(), grad_tol.rtol, grad_tol.atol);
  }
}

Tensor with_grad(Tensor t) {
  t.requires_grad_();
  return t;
}

Tensor ids(const std::vector<int64_t>& v, const Shape& shape, DType dt = DType::kI64) {
  return from_vector<int64_t>(v, shape).to(dt);
}
// n indices in [0, hi) from a fixed LCG, with many repeats when n > hi.
std::vector<int64_t> lcg_ids(int64_t n, int64_t hi, uint64_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(hi));
  }
  return v;
}

const DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64};

}  // namespace

// ---- normalization ----------------------------------------------------------------------------

TEST_CASE("cuda rms_norm matches cpu: values, dx, dw", "[cuda]") {
  require_gpu();
  // Odd H (scalar path), H a multiple of 8 (16-byte vectors), many rows (several rows per weight-
  // gradient chunk), a wide row whose accumulators do not fit shared memory, and H = 1000 (the
  // backward's register path with threads that own no vector of the second round), and rows
  // counts that split unevenly into weight-gradient chunks ({4099, 256}, {1030, 2048}: 9 and 3
  // rows per chunk, a shorter last chunk).
  const Shape shapes[] = {{3, 5, 17}, {4, 4096}, {1500, 96}, {3, 16384}, {2, 1}, {700, 1000}, {4099, 256}, {1030, 2048}};
  for (DType dt : kFloatTypes)
    for (const Shape& s : shapes) {
      INFO(fmt::format("{} {}", dt, s));
      Tensor x = with_grad(rand(s, dt, 1, -2, 2)), w = with_grad(rand({s.back()}, dt, 2, 0.5, 1.5));
      Tol t = tol(dt);
      check_vs_cpu([](const auto& in) { return rms_norm(in[0], in[1], 1e-5); }, {x, w}, t, loose(t, 4));
      check_vs_cpu([](const auto& in) { return rms_norm(in[0], Tensor(), 1e-6); }, {x}, t, loose(t, 4),
                   Layout::kNonContiguous);
    }
}

// The residual gradient sum fused into the backward kernel (tests/common/residual_norm.h) in each
// of its forms: a warp per row ({1030, 2048}, {64, 512}), registers ({40, 4096}), the block kernel
// ({3, 16384}) and scalar loads ({5, 1000} in 16-bit types, odd H).
TEST_CASE("cuda rms_norm backward adds into the skip gradient with the unfused sum's bits", "[cuda]") {
  require_gpu();
  const Shape shapes[] = {{1030, 2048}, {64, 512}, {40, 4096}, {3, 16384}, {5, 1000}, {7, 33}};
  for (DType dt : kFloatTypes)
    for (const Shape& s : shapes) {
      INFO(fmt::format("{} {}", dt, s));
      const Device d = mt::testing::gpu();
      mt::testing::check_residual_norm_fusion(rand(s, dt, 41).to(d), rand({s.back()}, dt, 42, 0.5, 1.5).to(d),
                                              rand(s, dt, 43).to(d));
    }
}

TEST_CASE("cuda layer_norm matches cpu: values, dx, dw, db", "[cuda]") {
  require_gpu();
  const Shape shapes[] = {{3, 5, 17}, {4, 4096}, {1500, 96}, {2, 8192}, {7, 1}};
  for (DType dt : kFloatTypes)
    for (const Shape& s : shapes) {
      INFO(fmt::format("{} {}", dt, s));
      Tensor x = with_grad(rand(s, dt, 3, -2, 3));
      Tensor w = with_grad(rand({s.back()}, dt, 4, 0.5, 1.5)), b = with_grad(rand({s.back()}, dt, 5));
      Tol t = tol(dt);
      check_vs_cpu([](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); }, {x, w, b}, t, loose(t, 4));
      check_vs_cpu([](const auto& in) { return layer_norm(in[0], Tensor(), in[1], 1e-5); }, {x, b}, t, loose(t, 4),
                   Layout::kNonContiguous);
      check_vs_cpu([](const auto& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-5); }, {x}, t, loose(t, 4));
    }
}

TEST_CASE("cuda softmax and log_softmax match cpu, long rows and other dims", "[cuda]") {
  require_gpu();
  const Shape shapes[] = {{3, 5, 17}, {2, 70001}, {4, 131072}, {6, 1}};
  for (DType dt : kFloatTypes)
    for (const Shape& s : shapes) {
      INFO(fmt::format("{} {}", dt, s));
      Tensor x = with_grad(rand(s, dt, 6, -8, 8));
      Tol t = tol(dt);
      check_vs_cpu([](const auto& in) { return softmax(in[0], -1); }, {x}, t, loose(t, 4));
      check_vs_cpu([](const auto& in) { return log_softmax(in[0], -1); }, {x}, t, loose(t, 4),
                   Layout::kNonContiguous);
      check_vs_cpu([](const auto& in) { return softmax(in[0], 0); }, {x}, t, loose(t, 4));
    }
  // -inf entries (masks) and a fully masked row.
  Tensor m = from_vector<double>({0, -INFINITY, 1, 2, -INFINITY, -INFINITY, 3, 0.5}, {2, 4}, DType::kF32);
  REQUIRE_CLOSE(on_cpu(softmax(on_cuda(m), -1)), softmax(m, -1), 1e-6, 1e-7);
  REQUIRE_CLOSE(on_cpu(log_softmax(on_cuda(m), -1)), log_softmax(m, -1), 1e-6, 1e-7);
}

// ---- rotary embedding -------------------------------------------------------------------------

TEST_CASE("cuda rotary_embedding matches cpu: both styles, broadcast tables, backward", "[cuda]") {
  require_gpu();
  for (DType dt : kFloatTypes)
    for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
      INFO(fmt::format("{} style {}", dt, static_cast<int>(style)));
      Tol t = tol(dt);
      // x [B, H, T, D] with tables [T, D/2].
      {
        auto [c, s] = rope_tables(9, 18, 10000.0, DType::kF32);
        Tensor x = with_grad(rand({2, 3, 9, 18}, dt, 7));
        check_vs_cpu([style](const auto& in) { return rotary_embedding(in[0], in[1], in[2], style); },
                     {x, c, s}, t, t);
        check_vs_cpu([style](const auto& in) { return rotary_embedding(in[0], in[1], in[2], style); },
                     {x, c, s}, t, t, Layout::kNonContiguous);
      }
      // x [B, T, H, D] with tables [T, 1, D/2] (zero stride over heads), D = 128.
      {
        auto [c, s] = rope_tables(37, 128, 500000.0, DType::kF64);
        Tensor x = with_grad(rand({2, 37, 5, 128}, dt, 8));
        Tensor c3 = c.unsqueeze(1), s3 = s.unsqueeze(1);
        check_vs_cpu([style](const auto& in) { return rotary_embedding(in[0], in[1], in[2], style); },
                     {x, c3, s3}, t, t);
      }
    }
}

// ---- indexing ---------------------------------------------------------------------------------

TEST_CASE("cuda index_select and embedding match cpu, with repeated ids in the backward", "[cuda]") {
  require_gpu();
  for (DType idt : {DType::kI64, DType::kI32})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF64}) {
      INFO(fmt::format("{} index {}", dt, idt));
      Tol t = tol(dt);
      Tensor x = with_grad(rand({5, 7, 3}, dt, 9));
      for (int dim = 0; dim < 3; ++dim) {
        Tensor ix = ids(lcg_ids(11, x.size(dim), 10 + dim), {11}, idt);
        check_vs_cpu([dim](const auto& in) { return index_select(in[0], dim, in[1]); }, {x, ix}, t, t);
        check_vs_cpu([dim](const auto& in) { return index_select(in[0], dim, in[1]); }, {x, ix}, t, t,
                     Layout::kNonContiguous);
      }
      // Embedding backward: few columns per id (the sorted path), many repeats, a hot id.
      struct Emb {
        int64_t V, C, N;
      };
      for (const Emb& e : {Emb{1000, 64, 4 * 333}, Emb{50, 8191, 300}, Emb{32000, 16, 4096}}) {
        const int64_t V = e.V, C = e.C, N = e.N;
        INFO("V " << V << " C " << C << " N " << N);
        std::vector<int64_t> v = lcg_ids(N, V, 11);
        for (int64_t i = 0; i < N; i += 3) v[static_cast<size_t>(i)] = 7;  // a hot id
        Tensor w = with_grad(rand({V, C}, dt, 12));
        Tensor tok = ids(v, {N / 4, 4}, idt);
        // Sums of up to N/3 terms: 16-bit results compare looser.
        Tol gt = dt == DType::kBF16 ? Tol{5e-2, 0.5} : loose(t, 10);
        check_vs_cpu([](const auto& in) { return embedding(in[0], in[1]); }, {w, tok}, t, gt);
      }
    }
  // Non-floating dtypes move exactly.
  for (DType dt : {DType::kI64, DType::kI32, DType::kU8, DType::kBool}) {
    Tensor x = from_vector<int64_t>(lcg_ids(6 * 9, 200, 13), {6, 9}).to(dt);
    Tensor ix = ids({5, 0, 0, 3, 2}, {5});
    REQUIRE_CLOSE(on_cpu(index_select(on_cuda(x), 0, on_cuda(ix))), index_select(x, 0, ix), 0, 0);
    REQUIRE_CLOSE(on_cpu(index_select(on_cuda(x), 1, on_cuda(ix))), index_select(x, 1, ix), 0, 0);
  }
}

TEST_CASE("cuda index_add matches cpu in both strategies and is deterministic", "[cuda]") {
  require_gpu();
  struct Case {
    Shape x;
    int dim;
    int64_t m;
  };
  // [4, 9, 3] dim 1: few columns (sorted runs); [300, 7, 300] dim 1: column owners; dim 0 of 1-D.
  const Case cases[] = {{{4, 9, 3}, 1, 40}, {{300, 7, 300}, 1, 25}, {{64}, 0, 5000}, {{13, 6}, 0, 17}};
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16})
    for (const Case& c : cases) {
      INFO(fmt::format("{} {} dim {} m {}", dt, c.x, c.dim, c.m));
      Shape ss = c.x;
      ss[c.dim] = c.m;
      Tensor x = with_grad(rand(c.x, dt, 14)), src = with_grad(rand(ss, dt, 15));
      Tensor ix = ids(lcg_ids(c.m, c.x[c.dim], 16), {c.m});
      const int d = c.dim;
      Tol t = dt == DType::kBF16 ? Tol{5e-2, 0.3} : loose(tol(dt), 10);
      check_vs_cpu([d](const auto& in) { return index_add(in[0], d, in[1], in[2], 0.5); }, {x, ix, src}, t, t);
      // Same inputs, same bits.
      Tensor xc = on_cuda(x.detach()), sc = on_cuda(src.detach()), ic = on_cuda(ix);
      REQUIRE_CLOSE(on_cpu(index_add(xc, d, ic, sc)), on_cpu(index_add(xc, d, ic, sc)), 0, 0);
    }
  // Integers and bool, exactly.
  Tensor xi = from_vector<int64_t>(lcg_ids(40, 9, 17), {40});
  Tensor ix = ids(lcg_ids(100, 40, 18), {100});
  Tensor si = from_vector<int64_t>(lcg_ids(100, 1000, 19), {100});
  REQUIRE_CLOSE(on_cpu(index_add(on_cuda(xi), 0, on_cuda(ix), on_cuda(si), 3)), index_add(xi, 0, ix, si, 3), 0, 0);
  Tensor xb = xi.to(DType::kBool), sb = si.to(DType::kBool);
  REQUIRE_CLOSE(on_cpu(index_add(on_cuda(xb), 0, on_cuda(ix), on_cuda(sb))), index_add(xb, 0, ix, sb), 0, 0);
}

TEST_CASE("cuda index_add adds long runs of one index in index order, as the cpu", "[cuda]") {
  require_gpu();
  // An embedding backward over a skewed batch: 3000 of 4096 tokens are id 7 (one long sorted run),
  // the rest spread over 50 ids. Rows of 256 columns take 16-byte packs; rows of 12 bf16 columns
  // (24 bytes) do not.
  std::vector<int64_t> idv = lcg_ids(4096, 50, 31);
  for (size_t i = 0; i < idv.size(); ++i)
    if (i % 4 != 0) idv[i] = 7;
  const Tensor ix = ids(idv, {4096});
  for (int64_t cols : {256, 12})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF64}) {
      INFO(fmt::format("{} columns {}", dt, cols));
      const Tensor x = rand({50, cols}, dt, 32), src = rand({4096, cols}, dt, 33);
      // Each column adds in index order with the CPU's roundings: the same bits.
      REQUIRE_CLOSE(on_cpu(index_add(on_cuda(x), 0, on_cuda(ix), on_cuda(src), 0.5)), index_add(x, 0, ix, src, 0.5),
                    0, 0);
    }
}

TEST_CASE("cuda gather and scatter_add match cpu, index smaller than input", "[cuda]") {
  require_gpu();
  for (DType idt : {DType::kI64, DType::kI32})
    for (DType dt : {DType::kF32, DType::kF64, DType::kBF16}) {
      INFO(fmt::format("{} index {}", dt, idt));
      Tol t = dt == DType::kBF16 ? Tol{5e-2, 0.1} : loose(tol(dt), 10);
      Tensor x = with_grad(rand({6, 7, 5}, dt, 20));
      for (int dim = 0; dim < 3; ++dim) {
        Shape is{4, 6, 3};  // <= x in every dim but `dim`, which may be longer (repeats)
        is[dim] = 9;
        Tensor ix = ids(lcg_ids(is.numel(), x.size(dim), 21 + dim), is, idt);
        check_vs_cpu([dim](const auto& in) { return gather(in[0], dim, in[1]); }, {x, ix}, t, t);
        Tensor src = with_grad(rand({5, 7, 4}, dt, 24));  // >= index in every dim
        Shape ss = is;
        for (int k = 0; k < 3; ++k) ss[k] = std::max(is[k], src.size(k));
        src = with_grad(rand(ss, dt, 25));
        check_vs_cpu([dim](const auto& in) { return scatter_add(in[0], dim, in[1], in[2]); }, {x, ix, src}, t, t);
        check_vs_cpu([dim](const auto& in) { return scatter_add(in[0], dim, in[1], in[2]); }, {x, ix, src}, t, t,
                     Layout::kNonContiguous);
      }
    }
  // one_hot (scatter_add on i64).
  Tensor lab = ids(lcg_ids(33, 10, 26), {3, 11});
  REQUIRE_CLOSE(on_cpu(one_hot(on_cuda(lab), 10)), one_hot(lab, 10), 0, 0);
}

TEST_CASE("cuda topk matches cpu: order, ties, NaN, dims, gradient", "[cuda]") {
  require_gpu();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64, DType::kI64, DType::kU8}) {
    INFO(fmt::format("{}", dt));
    // Few distinct values: many ties, which go to the lower index.
    Tensor x = from_vector<int64_t>(lcg_ids(5 * 300, 23, 27), {5, 300}).to(dt);
    for (int64_t k : {int64_t{1}, int64_t{5}, int64_t{17}, int64_t{300}})
      for (TopkOrder order : {TopkOrder::kLargest, TopkOrder::kSmallest}) {
        INFO("k " << k << " order " << static_cast<int>(order));
        auto [va, ia] = topk(x, k, -1, order);
        auto [vb, ib] = topk(on_cuda(x), k, -1, order);
        REQUIRE_CLOSE(on_cpu(vb), va, 0, 0);
        REQUIRE_CLOSE(on_cpu(ib), ia, 0, 0);
        auto [va0, ia0] = topk(x, std::min<int64_t>(k, 5), 0, order);
        auto [vb0, ib0] = topk(on_cuda(x), std::min<int64_t>(k, 5), 0, order);
        REQUIRE_CLOSE(on_cpu(vb0), va0, 0, 0);
        REQUIRE_CLOSE(on_cpu(ib0), ia0, 0, 0);
      }
  }
  // NaN is the largest value.
  Tensor n = from_vector<double>({1, NAN, 3, -2, NAN, 0.5, 3}, {7}, DType::kF32);
  for (TopkOrder order : {TopkOrder::kLargest, TopkOrder::kSmallest}) {
    auto [va, ia] = topk(n, 4, -1, order);
    auto [vb, ib] = topk(on_cuda(n), 4, -1, order);
    REQUIRE(on_cpu(ib).to_vector<int64_t>() == ia.to_vector<int64_t>());
  }
  // Gradient of the values (scatter_add into zeros).
  Tensor xg = with_grad(rand({4, 1000}, DType::kF32, 28));
  check_vs_cpu([](const auto& in) { return topk(in[0], 8, -1).first; }, {xg}, tol(DType::kF32), tol(DType::kF32));
}

// ---- cross-entropy ----------------------------------------------------------------------------

TEST_CASE("cuda cross_entropy matches cpu over large vocabularies, ignore_index, reductions", "[cuda]") {
  require_gpu();
  // V = 50257 (odd: scalar loads), 128256 (vector loads), 7 (tiny).
  for (int64_t V : {int64_t{50257}, int64_t{128256}, int64_t{7}})
    for (DType dt : kFloatTypes)
      for (DType idt : {DType::kI64, DType::kI32}) {
        INFO(fmt::format("V {} {} target {}", V, dt, idt));
        const int64_t N = 6;
        Tensor logits = with_grad(rand({2, N / 2, V}, dt, 29, -6, 6));
        std::vector<int64_t> tv = lcg_ids(N, V, 30);
        tv[1] = -100;  // ignored
        tv[4] = V - 1;
        Tensor target = ids(tv, {2, N / 2}, idt);
        Tol t = tol(dt);
        // Per-row losses and their gradients; then the reductions.
        check_vs_cpu([](const auto& in) { return cross_entropy(in[0], in[1], -100, Reduction::kNone); },
                     {logits, target}, t, t);
        check_vs_cpu([](const auto& in) { return cross_entropy(in[0], in[1], -100, Reduction::kMean); },
                     {logits, target}, t, t, Layout::kNonContiguous);
        std::vector<int64_t> tv3 = tv;
        tv3[1] = 3;  // ignore_index 3 instead of -100
        check_vs_cpu([](const auto& in) { return cross_entropy(in[0], in[1], 3, Reduction::kSum); },
                     {logits, ids(tv3, {2, N / 2}, idt)}, t, t);
      }
}

// ---- attention --------------------------------------------------------------------------------

TEST_CASE("cuda scaled_dot_product_attention matches cpu: GQA, causal offsets, tiles, gradients", "[cuda]") {
  require_gpu();
  struct Case {
    int64_t B, Hq, Hkv, T, S, D, Dv;
    Causal causal;
    double scale;
  };
  // T and S around and across the tile sizes (64 / 32), D from 7 to 128, Dv != D.
  const Case cases[] = {
      {2, 6, 2, 5, 5, 7, 7, Causal::kYes, 0},
      {1, 4, 1, 70, 70, 64, 64, Causal::kYes, 0},      // T > one tile, not a multiple
      {1, 8, 2, 130, 130, 128, 128, Causal::kYes, 0},  // D = 128, GQA 4
      {2, 2, 2, 33, 97, 80, 80, Causal::kYes, 0},      // S > T: diagonal offset; D padded to 128
      {1, 3, 3, 100, 40, 16, 24, Causal::kYes, 0.3},   // S < T: first rows see no key; Dv != D
      {1, 4, 2, 65, 129, 32, 32, Causal::kNo, 0},      // non-causal
      {1, 2, 1, 1, 200, 64, 64, Causal::kYes, 0},      // decode-like: one query
  };
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16})
    for (const Case& c : cases) {
      INFO(fmt::format("{} B {} Hq {} Hkv {} T {} S {} D {} Dv {} causal {}", dt, c.B, c.Hq, c.Hkv, c.T, c.S, c.D,
                       c.Dv, c.causal == Causal::kYes));
      Tensor q = with_grad(rand({c.B, c.Hq, c.T, c.D}, dt, 31, -2, 2));
      Tensor k = with_grad(rand({c.B, c.Hkv, c.S, c.D}, dt, 32, -2, 2));
      Tensor v = with_grad(rand({c.B, c.Hkv, c.S, c.Dv}, dt, 33));
      const Causal causal = c.causal;
      const double scale = c.scale;
      Tol t = dt == DType::kF32 ? Tol{2e-4, 2e-5} : tol(dt);
      check_vs_cpu([causal, scale](const auto& in) { return scaled_dot_product_attention(in[0], in[1], in[2], causal, scale); },
                   {q, k, v}, t, loose(t, 5));
    }
  // Non-contiguous inputs (e.g. [B, T, H, D] transposed to [B, H, T, D]).
  Tensor q = with_grad(rand({2, 45, 4, 64}, DType::kF32, 34)), k = with_grad(rand({2, 45, 2, 64}, DType::kF32, 35));
  Tensor v = with_grad(rand({2, 45, 2, 64}, DType::kF32, 36));
  check_vs_cpu(
      [](const auto& in) {
        return scaled_dot_product_attention(in[0].transpose(1, 2), in[1].transpose(1, 2), in[2].transpose(1, 2));
      },
      {q, k, v}, Tol{2e-4, 2e-5}, Tol{1e-3, 1e-4}, Layout::kNonContiguous);
  // Head dims past the kernel's limit are an error naming the op.
  Tensor big = on_cuda(rand({1, 1, 4, 160}, DType::kF32, 37));
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(big, big, big), Catch::Contains("attention"));
}

// ---- silu_mul (SwiGLU) ------------------------------------------------------------------------

TEST_CASE("cuda silu_mul matches cpu, gradients too", "[cuda]") {
  require_gpu();
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    INFO(fmt::format("{}", dt));
    Tensor a = with_grad(rand({33, 1000}, dt, 81, -6, 6)), b = with_grad(rand({33, 1000}, dt, 82, -2, 2));
    const Tol t = tol(dt);
    check_vs_cpu([](const auto& in) { return silu_mul(in[0], in[1]); }, {a, b}, t, loose(t, 2));
    check_vs_cpu([](const auto& in) { return silu_mul(in[0], in[1]); }, {a, b}, t, loose(t, 2),
                 Layout::kNonContiguous);
    // The one-pass backward (silu_mul_bwd) gives the bits of the unfused kernels on the GPU too.
    Tensor g = on_cuda(rand({33, 1000}, dt, 83));
    Tensor a1 = on_cuda(a.detach()).requires_grad_(), b1 = on_cuda(b.detach()).requires_grad_();
    Tensor a2 = on_cuda(a.detach()).requires_grad_(), b2 = on_cuda(b.detach()).requires_grad_();
    silu_mul(a1, b1).backward(g);
    mul(silu(a2), b2).backward(g);
    REQUIRE_CLOSE(on_cpu(a1.grad()), on_cpu(a2.grad()), 0, 0);
    REQUIRE_CLOSE(on_cpu(b1.grad()), on_cpu(b2.grad()), 0, 0);
  }
}
