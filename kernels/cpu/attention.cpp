// Scaled dot-product attention on the CPU as blocked GEMMs (flash-attention 2): a block of
// queries meets a block of keys at a time. The score tile Q·Kᵀ, the P·V product and, in the
// backward, Pᵀ·dO, dO·Vᵀ, dS·K and dSᵀ·Q are single-threaded GEMMs on contiguous scratch tiles
// (tile_gemm.h: OpenBLAS where the build has it, Eigen otherwise); the softmax is online (running
// row max and sum, rescaling the output accumulator), vectorized over a tile row. No [T, S]
// matrix is stored: the forward keeps the per-row log-sum-exp, and the backward recomputes P from
// it. Operands may have any strides (tiles are copied into scratch, 16-bit ones widened to f32);
// everything accumulates in the compute type, f32 (f64 for f64).
// Tiles: the forward takes kQBlock queries against key chunks of up to kKChunk keys, the last one
// cut at the block's causal end; the backward takes kKBlock keys against query chunks of up to
// kQChunk rows, starting at the first query that sees the block: fewer, longer GEMM calls than
// 64 x 64 tiles, with no more masked work.
// Determinism: the forward runs one task per (batch, head, query block), the backward one per
// (batch, kv head), which loads the group's Q, dO, lse and rowsum(dO * O) once, walks its key
// blocks, query heads and query chunks in a fixed order and accumulates dK, dV per key block and
// dQ in its own scratch; every task runs inside a parallel region, so Eigen never splits a tile
// GEMM across threads (nor OpenBLAS, which runs on one thread). Results do not depend on the
// thread count. Scratch is thread-local (grown on first use), the one exception to "kernels never
// allocate". The scalar double kernels these replaced are kept as the tests' reference
// (attention_reference.cpp). Decisions and figures: docs/decisions.md, "CPU attention as blocked
// GEMMs".
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/loops.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

constexpr int64_t kQBlock = 64, kKChunk = 256;  // forward
constexpr int64_t kKBlock = 64, kQChunk = 256;  // backward

struct Dims {
  int64_t B, Hq, Hkv, T, S, D, Dv, group;
  bool causal;
  Dims(const KView& q, const KView& v, bool c)
      : B(q.sizes[0]), Hq(q.sizes[1]), Hkv(v.sizes[1]), T(q.sizes[2]), S(v.sizes[2]), D(q.sizes[3]),
        Dv(v.sizes[3]), group(q.sizes[1] / v.sizes[1]), causal(c) {}
  // Keys [0, end) are visible to query t (non-decreasing in t).
  int64_t key_end(int64_t t) const { return causal ? std::clamp<int64_t>(t + (S - T) + 1, 0, S) : S; }
  // Visible keys of query t within the key block starting at k0 of n keys.
  int64_t visible(int64_t t, int64_t k0, int64_t n) const { return std::clamp<int64_t>(key_end(t) - k0, 0, n); }
};

template <class C>
using Tile = Eigen::Map<Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <class C>
using Col = Eigen::Map<Eigen::Matrix<C, Eigen::Dynamic, 1>>;

// Rows [l0, l0 + n) of head (b, h) of a [B, H, L, X] view into dst ([n, X], row-major) times mul.
template <class T, class C>
void load_rows(const KView& v, int64_t b, int64_t h, int64_t l0, int64_t n, C* dst, C mul) {
  const int64_t X = v.sizes[3], sl = v.strides[2], sx = v.strides[3];
  const T* base = v.ptr<const T>() + b * v.strides[0] + h * v.strides[1] + l0 * sl;
  for (int64_t i = 0; i < n; ++i) {
    const T* r = base + i * sl;
    C* d = dst + i * X;
    if (sx == 1) {
      for (int64_t x = 0; x < X; ++x) d[x] = convert<C>(r[x]) * mul;
    } else {
      for (int64_t x = 0; x < X; ++x) d[x] = convert<C>(r[x * sx]) * mul;
    }
  }
}

// src ([n, X], row-major) times mul into rows [l0, l0 + n) of head (b, h) of a [B, H, L, X] view.
template <class T, class C>
void store_rows(const KView& v, int64_t b, int64_t h, int64_t l0, int64_t n, const C* src, C mul) {
  const int64_t X = v.sizes[3], sl = v.strides[2], sx = v.strides[3];
  T* base = v.ptr<T>() + b * v.strides[0] + h * v.strides[1] + l0 * sl;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t x = 0; x < X; ++x) base[i * sl + x * sx] = convert<T>(src[i * X + x] * mul);
}

// Element (b, h, t) of a [B, H, T] view.
template <class L>
L& lse_at(const KView& v, int64_t b, int64_t h, int64_t t) {
  return v.ptr<L>()[b * v.strides[0] + h * v.strides[1] + t * v.strides[2]];
}

// Thread-local scratch of n elements in slot i (each slot grows on first use, then is reused).
// Aligned for Eigen's packets: its vectorized row sums and maxima start at the first aligned
// element, so a buffer's address must not change the summation order from one thread to another.
template <class C>
C* scratch(int slot, int64_t n) {
  thread_local std::vector<C, Eigen::aligned_allocator<C>> bufs[8];
  auto& b = bufs[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

// Runs f(0..n-1), each index once, inside a parallel region whenever there are threads: Eigen
// then keeps each tile GEMM on its caller's thread, whatever n and the thread count are.
template <class F>
void run_tasks(int64_t n, F&& f) {
#ifdef _OPENMP
  if (n > 0 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) f(i);
}

// P = exp(S - m) row by row for one [nq, nk] score tile whose row i starts at query t0 + i and
// sees keys [0, visible) of the block: masked entries and rows with no visible key become 0.
// Forward (online): m, l are the running row max and sum, o the output rows rescaled on a new
// max. Backward: m is the final log-sum-exp, l and o are null.
template <class C>
void softmax_tile(const Dims& d, int64_t t0, int64_t k0, Tile<C>& s, C* m, C* l, Tile<C>* o) {
  const int64_t nk = s.cols();
  for (int64_t i = 0; i < s.rows(); ++i) {
    const int64_t e = d.visible(t0 + i, k0, nk);
    auto row = s.row(i);
    if (e < nk) row.tail(nk - e).setZero();
    if (e == 0) continue;
    C mi = m[i];
    if (o) {
      const C mnew = std::max(mi, row.head(e).maxCoeff());
      if (mnew != mi) {
        const C alpha = std::exp(mi - mnew);  // 0 when mi was -inf
        l[i] *= alpha;
        o->row(i) *= alpha;
        m[i] = mi = mnew;
      }
    }
    if (mi == -std::numeric_limits<C>::infinity()) {  // backward: the row saw no key
      row.head(e).setZero();
      continue;
    }
    row.head(e) = (row.head(e).array() - mi).exp().matrix();
    if (l) l[i] += row.head(e).sum();
  }
}

// One task: query block qb of head (b, h), against key chunks [k0, k0 + kKChunk) cut at kend.
template <class T, class C, class L>
void forward_block(const AttentionParams& p, const Dims& d, int64_t b, int64_t h, int64_t qb) {
  const int64_t t0 = qb * kQBlock, nq = std::min(kQBlock, d.T - t0), kvh = h / d.group;
  const int64_t kend = d.key_end(t0 + nq - 1);
  C* qs = scratch<C>(0, kQBlock * d.D);
  C* kt = scratch<C>(1, kKChunk * d.D);
  C* vt = scratch<C>(2, kKChunk * d.Dv);
  C* st = scratch<C>(3, kQBlock * kKChunk);
  C* ot = scratch<C>(4, kQBlock * d.Dv);
  C* m = scratch<C>(5, kQBlock);
  C* l = scratch<C>(6, kQBlock);
  Tile<C> o(ot, nq, d.Dv);
  o.setZero();
  std::fill(m, m + nq, -std::numeric_limits<C>::infinity());
  std::fill(l, l + nq, C(0));
  if (kend > 0) load_rows<T>(p.q, b, h, t0, nq, qs, static_cast<C>(p.scale));
  for (int64_t k0 = 0; k0 < kend; k0 += kKChunk) {
    const int64_t nk = std::min(kKChunk, kend - k0);
    load_rows<T>(p.k, b, kvh, k0, nk, kt, C(1));
    load_rows<T>(p.v, b, kvh, k0, nk, vt, C(1));
    Tile<C> s(st, nq, nk);
    tile_gemm<C>(false, true, nq, nk, d.D, qs, d.D, kt, d.D, C(0), st, nk);  // S = Q Kᵀ
    softmax_tile<C>(d, t0, k0, s, m, l, &o);
    tile_gemm<C>(false, false, nq, d.Dv, nk, st, nk, vt, d.Dv, C(1), ot, d.Dv);  // O += P V
  }
  for (int64_t i = 0; i < nq; ++i) {
    if (l[i] > 0) {
      o.row(i) /= l[i];
      lse_at<L>(p.lse, b, h, t0 + i) = static_cast<L>(m[i] + std::log(l[i]));
    } else {  // no visible key (causal with S < T): zero output, lse -inf
      o.row(i).setZero();
      lse_at<L>(p.lse, b, h, t0 + i) = -std::numeric_limits<L>::infinity();
    }
  }
  store_rows<T>(p.out, b, h, t0, nq, ot, C(1));
}

template <class T, class C, class L>
void attention_typed(const AttentionParams& p) {
  const Dims d(p.q, p.v, p.causal);
  const int64_t qblocks = (d.T + kQBlock - 1) / kQBlock;
  run_tasks(d.B * d.Hq * qblocks, [&](int64_t i) {
    forward_block<T, C, L>(p, d, i / qblocks / d.Hq, i / qblocks % d.Hq, i % qblocks);
  });
}

// One task: kv head (b, kvh) and its group of query heads. The group's Q * scale, dO, lse and
// rowsum(dO * O) are loaded once ([group * T] rows); then key blocks outer and, per key block, the
// group's query heads and chunks from the block's first seeing query: dK and dV accumulate in
// that order, dQ in a [group * T, D] scratch.
template <class T, class C, class L>
void backward_head(const AttentionBwdParams& p, const Dims& d, int64_t b, int64_t kvh) {
  const int64_t rows = d.group * d.T, h0 = kvh * d.group;
  C* qa = scratch<C>(0, rows * d.D);   // Q * scale
  C* goa = scratch<C>(1, rows * d.Dv);  // dO
  C* kt = scratch<C>(2, kKBlock * d.D);
  C* vt = scratch<C>(3, kKBlock * d.Dv);
  C* pt = scratch<C>(4, std::max(2 * kQChunk * kKBlock, kQBlock * d.Dv));  // P and dS, or O rows
  C* gkt = scratch<C>(5, kKBlock * (d.D + d.Dv));
  C* gqa = scratch<C>(6, rows * d.D);
  C* rowv = scratch<C>(7, 2 * rows);  // per row of the group: lse, then rowsum(dO * O)
  C *lse = rowv, *di = rowv + rows;
  Tile<C>(gqa, rows, d.D).setZero();
  for (int64_t g = 0; g < d.group; ++g) {
    const int64_t r0 = g * d.T;
    load_rows<T>(p.q, b, h0 + g, 0, d.T, qa + r0 * d.D, static_cast<C>(p.scale));
    load_rows<T>(p.gout, b, h0 + g, 0, d.T, goa + r0 * d.Dv, C(1));
    for (int64_t t0 = 0; t0 < d.T; t0 += kQBlock) {  // O a block at a time, into P's scratch
      const int64_t nq = std::min(kQBlock, d.T - t0);
      C* ob = pt;
      load_rows<T>(p.out, b, h0 + g, t0, nq, ob, C(1));
      for (int64_t i = 0; i < nq; ++i) {
        di[r0 + t0 + i] = Col<C>(ob + i * d.Dv, d.Dv).dot(Col<C>(goa + (r0 + t0 + i) * d.Dv, d.Dv));
        lse[r0 + t0 + i] = static_cast<C>(lse_at<const L>(p.lse, b, h0 + g, t0 + i));
      }
    }
  }
  for (int64_t k0 = 0; k0 < d.S; k0 += kKBlock) {
    const int64_t nk = std::min(kKBlock, d.S - k0);
    // The first query that sees key k0 (causal: key_end(t) > k0); T when none does (dK, dV zero).
    const int64_t first = d.causal ? std::clamp<int64_t>(k0 - (d.S - d.T), 0, d.T) : 0;
    load_rows<T>(p.k, b, kvh, k0, nk, kt, C(1));
    load_rows<T>(p.v, b, kvh, k0, nk, vt, C(1));
    C *gk = gkt, *gv = gkt + nk * d.D;
    std::fill(gkt, gkt + nk * (d.D + d.Dv), C(0));
    for (int64_t g = 0; g < d.group; ++g)
      for (int64_t t0 = first; t0 < d.T; t0 += kQChunk) {
        const int64_t nq = std::min(kQChunk, d.T - t0), r0 = g * d.T + t0;
        const C *q = qa + r0 * d.D, *go = goa + r0 * d.Dv;
        C *pp = pt, *dp = pt + nq * nk;
        Tile<C> pr(pp, nq, nk), ds(dp, nq, nk);
        tile_gemm<C>(false, true, nq, nk, d.D, q, d.D, kt, d.D, C(0), pp, nk);  // S = Q Kᵀ
        softmax_tile<C>(d, t0, k0, pr, lse + r0, nullptr, nullptr);
        tile_gemm<C>(true, false, nk, d.Dv, nq, pp, nk, go, d.Dv, C(1), gv, d.Dv);  // dV += Pᵀ dO
        tile_gemm<C>(false, true, nq, nk, d.Dv, go, d.Dv, vt, d.Dv, C(0), dp, nk);  // dP = dO Vᵀ
        for (int64_t i = 0; i < nq; ++i)
          ds.row(i) = (pr.row(i).array() * (ds.row(i).array() - di[r0 + i])).matrix();
        tile_gemm<C>(false, false, nq, d.D, nk, dp, nk, kt, d.D, C(1), gqa + r0 * d.D, d.D);  // dQ += dS K
        // q holds Q * scale: dK = scale * dSᵀ Q
        tile_gemm<C>(true, false, nk, d.D, nq, dp, nk, q, d.D, C(1), gk, d.D);
      }
    store_rows<T>(p.gk, b, kvh, k0, nk, gkt, C(1));
    store_rows<T>(p.gv, b, kvh, k0, nk, gkt + nk * d.D, C(1));
  }
  for (int64_t g = 0; g < d.group; ++g)
    store_rows<T>(p.gq, b, h0 + g, 0, d.T, gqa + g * d.T * d.D, static_cast<C>(p.scale));
}

template <class T, class C, class L>
void attention_bwd_typed(const AttentionBwdParams& p) {
  const Dims d(p.q, p.v, p.causal);
  run_tasks(d.B * d.Hkv, [&](int64_t i) { backward_head<T, C, L>(p, d, i / d.Hkv, i % d.Hkv); });
}

// lse is f64 for f64 inputs and f32 otherwise (16-bit inputs keep an f32 log-sum-exp).
void check_lse(const char* op, const KView& q, const KView& lse) {
  const DType want = q.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  MT_CHECK(lse.dtype == want, "{}: lse dtype {} for inputs {} (expected {})", op, lse.dtype, q.dtype, want);
}

void attention(const AttentionParams& p) {
  check_lse("attention", p.q, p.lse);
  switch (p.q.dtype) {
    case DType::kF64: attention_typed<double, double, double>(p); break;
    case DType::kF32: attention_typed<float, float, float>(p); break;
    case DType::kBF16: attention_typed<BFloat16, float, float>(p); break;
    case DType::kF16: attention_typed<Float16, float, float>(p); break;
    default: MT_FAIL("attention: kernel dtype {} is not supported (f32, f64, bf16, f16)", p.q.dtype);
  }
}
void attention_bwd(const AttentionBwdParams& p) {
  check_lse("attention_bwd", p.q, p.lse);
  switch (p.q.dtype) {
    case DType::kF64: attention_bwd_typed<double, double, double>(p); break;
    case DType::kF32: attention_bwd_typed<float, float, float>(p); break;
    case DType::kBF16: attention_bwd_typed<BFloat16, float, float>(p); break;
    case DType::kF16: attention_bwd_typed<Float16, float, float>(p); break;
    default: MT_FAIL("attention_bwd: kernel dtype {} is not supported (f32, f64, bf16, f16)", p.q.dtype);
  }
}

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_attention(KernelTable& t) {
  t.attention = cpu::attention;
  t.attention_bwd = cpu::attention_bwd;
}
}  // namespace mt
