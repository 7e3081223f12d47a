// Batched GEMM on the CPU, without copies: each matrix of a and b is taken in place as row-major
// (unit stride along its columns) or column-major (unit stride along its rows) with an outer
// stride, so transposed views cost nothing. Many small matrices run in parallel over the batch
// (single-threaded GEMMs inside the OpenMP region); big ones run one after the other and the GEMM
// parallelizes each of them internally. Every output element is computed by one GEMM call, so
// results do not depend on how the batch is split across threads.
// The GEMM: OpenBLAS's sgemm/dgemm where the build found it (MT_HAVE_OPENBLAS, meson option
// `blas`; single-threaded calls on row or column blocks fixed by the shape, spread over OpenMP's
// threads), Eigen's otherwise (docs/decisions.md, "CPU GEMM").
#include <Eigen/Core>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "config.h"
#if MT_HAVE_OPENBLAS
#include <cblas.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/loops.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/mat_layout.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

using Eigen::Dynamic;
using Eigen::OuterStride;

template <class T, int Order>
using MatMap = Eigen::Map<const Eigen::Matrix<T, Dynamic, Dynamic, Order>, Eigen::Unaligned, OuterStride<>>;
template <class T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>>;

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

#if MT_HAVE_OPENBLAS
// Columns of out per OpenBLAS call, a function of n alone: the same calls whatever the thread
// count (threads only take blocks in turn), so the bits do not depend on it. OpenBLAS's own
// threading does change them (tests/tensor/test_linalg.cpp found it at [256, 512] x [512, 1376]):
// it runs on one thread. An even number of near-equal blocks of about 256 columns (a multiple of
// 16, at least 64): fixed 256-column blocks left a thread idle for a third of every product of
// width 768 (three blocks on two threads; llama-100m's hidden size), and blocks narrower than 128
// lose a few percent per call.
int64_t blas_block_cols(int64_t n) {
  if (n <= 64) return std::max<int64_t>(n, 1);
  const int64_t blocks = 2 * ((n + 511) / 512);
  const int64_t width = ((n + blocks - 1) / blocks + 15) / 16 * 16;
  return std::max<int64_t>(width, 64);
}

// Row blocks where a has the rows for them: at least 128, and half of b's columns or 1024 and
// more. A call packs the whole of the operand its block does not cut (all of b for a row block,
// all of a for a column block), a cost against its work of about 1 / rows for row blocks and
// 1 / columns for column blocks; row blocks of 512 rows win whatever n is. Measured (sgemm
// alone, two threads, GFLOP/s, two row blocks against the column blocks below; in cache or
// with caches flushed first): 1024^3 190 / 174 in cache; llama-30m's [1024, 1376] x [1376, 512]
// 196 / 165 and its weight gradient [1376, 1024]^T x [1024, 512] 194 / 162; at 256 tokens
// [256, 1376] x [1376, 512] 170 / 160 and the weight gradients [512, 256]^T x [256, 512]
// 170 / 133 and [1376, 256]^T x [256, 512] 182 / 144, flushed; but columns for
// [256, 768] x [768, 2048] 179 / 190 and [256, 512] x [512, 4096] 167 / 179 (rows of 128
// repack all of a wide b for little work). docs/decisions.md, "CPU GEMM".
bool blas_split_rows(int64_t m, int64_t n) { return m >= 128 && (2 * m >= n || m >= 1024); }

// Rows of out per call in the row split, a function of m alone (as blas_block_cols is of n): an
// even number of near-equal blocks of at most 1024 rows, a multiple of 16.
int64_t blas_block_rows(int64_t m) {
  const int64_t blocks = 2 * ((m + 2047) / 2048);
  return ((m + blocks - 1) / blocks + 15) / 16 * 16;
}

// out = alpha * a @ b + beta * out through cblas (row-major out, ld n), in row blocks of
// blas_block_rows(m) (blas_split_rows) or column blocks of blas_block_cols(n), spread over
// OpenMP's threads (one after the other inside a parallel region). b_block(j0, nj) gives block
// [j0, j0 + nj) of b's columns as {pointer, leading dim}, laid out as lb says (row-major or
// column-major), valid until its thread's next call; row blocks take all of b, asked for once,
// on the calling thread, outside any parallel region of this call. False where BLAS cannot take
// a as it lies (a leading dimension below its matrix's width, e.g. broadcast rows) or the sizes
// pass int.
template <class T, class BBlock>
bool blas_gemm_blocks(const T* a, const MatLayout& la, const MatLayout& lb, T* out, T alpha, T beta,
                      BBlock&& b_block) {
  const int64_t m = la.rows, k = la.cols, n = lb.cols;
  const int64_t lim = int64_t{1} << 31;
  if (m >= lim || n >= lim || k >= lim || la.ld >= lim) return false;
  // Row-major a: [m, k] with lda >= k, no transpose; column-major a: the row-major [k, m] with
  // lda >= m, transposed. The same for b (checked by the caller that knows its blocks).
  if (la.ld < std::max<int64_t>(1, la.row_major ? k : m)) return false;
  blas_on_one_thread();
  const auto ta = la.row_major ? CblasNoTrans : CblasTrans, tb = lb.row_major ? CblasNoTrans : CblasTrans;
  const bool by_rows = blas_split_rows(m, n);
  const int64_t width = by_rows ? blas_block_rows(m) : blas_block_cols(n);
  const int blocks = static_cast<int>(((by_rows ? m : n) + width - 1) / width);
  // Row blocks share all of b: asked for once, on this thread, before any block runs.
  std::pair<const T*, int64_t> whole_b{};
  if (by_rows) whole_b = b_block(0, n);
  auto block = [&](int i) {
    // Rows [i0, i0 + mi) and columns [j0, j0 + nj) of out.
    const int64_t i0 = by_rows ? i * width : 0, mi = by_rows ? std::min(width, m - i0) : m;
    const int64_t j0 = by_rows ? 0 : i * width, nj = by_rows ? n : std::min(width, n - j0);
    const auto [bj, ldb] = by_rows ? whole_b : b_block(j0, nj);
    const T* ai = a + (la.row_major ? i0 * la.ld : i0);
    T* oi = out + i0 * n + j0;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(mi), static_cast<int>(nj), static_cast<int>(k), alpha, ai,
                  static_cast<int>(la.ld), bj, static_cast<int>(ldb), beta, oi, static_cast<int>(n));
    else
      cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(mi), static_cast<int>(nj), static_cast<int>(k), alpha, ai,
                  static_cast<int>(la.ld), bj, static_cast<int>(ldb), beta, oi, static_cast<int>(n));
  };
#ifdef _OPENMP
  if (blocks > 1 && !omp_in_parallel() && max_threads() > 1 && m * n * k >= int64_t{64} * 64 * 64) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < blocks; ++i) block(i);
    return true;
  }
#endif
  for (int i = 0; i < blocks; ++i) block(i);
  return true;
}

// blas_gemm_blocks on a b in place: a block is b + j0 (row-major) or b + j0 * ld (column-major).
template <class T>
bool blas_gemm(const T* a, const MatLayout& la, const T* b, const MatLayout& lb, T* out, T alpha, T beta) {
  const int64_t k = lb.rows, n = lb.cols;
  if (lb.ld >= (int64_t{1} << 31) || lb.ld < std::max<int64_t>(1, lb.row_major ? n : k)) return false;
  return blas_gemm_blocks(a, la, lb, out, alpha, beta, [&](int64_t j0, int64_t) {
    return std::pair<const T*, int64_t>(b + (lb.row_major ? j0 : j0 * lb.ld), lb.ld);
  });
}
#endif

// out = alpha * a @ b + beta * out for one matrix triple.
template <class T, int OrderA, int OrderB>
void gemm_one(const T* a, const MatLayout& la, const T* b, const MatLayout& lb, T* out, T alpha, T beta) {
  OutMap<T> o(out, la.rows, lb.cols);
  if (la.cols == 0) {  // empty inner dim: the product is zero
    if (beta == T(0))
      o.setZero();
    else
      o *= beta;
    return;
  }
#if MT_HAVE_OPENBLAS
  if (blas_gemm(a, la, b, lb, out, alpha, beta)) return;
#endif
  MatMap<T, OrderA> ma(a, la.rows, la.cols, OuterStride<>(la.ld));
  MatMap<T, OrderB> mb(b, lb.rows, lb.cols, OuterStride<>(lb.ld));
  if (beta == T(0)) {  // never read out: it may hold garbage
    if (alpha == T(1))
      o.noalias() = ma * mb;
    else
      o.noalias() = (alpha * ma) * mb;
  } else {
    if (beta != T(1)) o *= beta;
    o.noalias() += (alpha * ma) * mb;
  }
}

template <class T, int OrderA, int OrderB>
void matmul_typed(const MatmulParams& p, const MatLayout& la, const MatLayout& lb) {
  const KView &a = p.a, &b = p.b, &out = p.out;
  const int nbatch = out.ndim() - 2;
  int64_t batch = 1;
  for (int d = 0; d < nbatch; ++d) batch *= out.sizes[d];
  const int64_t m = la.rows, n = lb.cols, k = la.cols;
  const int64_t out_mat = m * n;
  const T alpha = static_cast<T>(p.alpha), beta = static_cast<T>(p.beta);

  auto run = [&](int64_t i) {
    const T* pa = a.ptr<const T>();
    const T* pb = b.ptr<const T>();
    int64_t rem = i;
    for (int d = nbatch - 1; d >= 0 && rem; --d) {
      int64_t idx = rem % out.sizes[d];
      rem /= out.sizes[d];
      pa += idx * a.strides[d];
      pb += idx * b.strides[d];
    }
    gemm_one<T, OrderA, OrderB>(pa, la, pb, lb, out.ptr<T>() + i * out_mat, alpha, beta);
  };

  if (batch == 1) {
    run(0);  // the GEMM parallelizes a big product itself
    return;
  }
  // Small matrices, or enough of them to keep every thread busy: split the batch across threads.
  const int64_t flops = std::max<int64_t>(m * n * std::max<int64_t>(k, 1), 1);
  const bool split_batch = flops <= int64_t{96} * 96 * 96 || batch >= 4 * max_threads();
  if (split_batch) {
    parallel_for(batch, flops, run);
  } else {
    for (int64_t i = 0; i < batch; ++i) run(i);
  }
}

template <class T>
void matmul_dispatch(const MatmulParams& p) {
  MatLayout la = layout_of(p.a), lb = layout_of(p.b);
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  if (la.row_major && lb.row_major)
    matmul_typed<T, R, R>(p, la, lb);
  else if (la.row_major)
    matmul_typed<T, R, C>(p, la, lb);
  else if (lb.row_major)
    matmul_typed<T, C, R>(p, la, lb);
  else
    matmul_typed<T, C, C>(p, la, lb);
}

// f32 a and out with a 16-bit b (2-D): a linear layer's bf16/f16 weight, widened here instead of
// as a separate f32 tensor (no weight-sized allocation, no pass over memory for it: a block of b
// is widened into a per-thread scratch that the GEMM then reads while it is in cache). With
// OpenBLAS the block is the one blas_gemm would give sgemm, laid out as in a contiguous f32 copy
// of b (row-major rows of width nj, or column-major columns of length k), so the call sees the same
// values in the same order: the bits of the widen-then-multiply path. Without OpenBLAS, b is widened
// whole and Eigen's GEMM runs on it, as it did on the widened tensor.
template <class S>
void matmul_widen_b(const MatmulParams& p) {
  const MatLayout la = layout_of(p.a), lb = layout_of(p.b);
  const int64_t k = la.cols, n = lb.cols;
  const float alpha = static_cast<float>(p.alpha), beta = static_cast<float>(p.beta);
  const float* a = p.a.ptr<const float>();
  const S* b = p.b.ptr<const S>();
  float* out = p.out.ptr<float>();
  // Columns [j0, j0 + nj) of b into dst: row-major [k, nj] or column-major (k per column).
  // All of b (the row split's one request, the Eigen path) is widened by all threads.
#ifdef _OPENMP
  const bool outside = !omp_in_parallel();
#else
  const bool outside = false;
#endif
  auto widen = [&](int64_t j0, int64_t nj, float* dst) {
    [[maybe_unused]] const bool par = outside && k * nj >= (int64_t{1} << 16);
    if (lb.row_major) {
#pragma omp parallel for schedule(static) if (par)
      for (int64_t r = 0; r < k; ++r)
        for (int64_t j = 0; j < nj; ++j) dst[r * nj + j] = static_cast<float>(b[r * lb.ld + j0 + j]);
    } else {
#pragma omp parallel for schedule(static) if (par)
      for (int64_t j = 0; j < nj; ++j)
        for (int64_t r = 0; r < k; ++r) dst[j * k + r] = static_cast<float>(b[(j0 + j) * lb.ld + r]);
    }
  };
  thread_local std::vector<float> scratch;
#if MT_HAVE_OPENBLAS
  const bool done = k > 0 && blas_gemm_blocks(a, la, lb, out, alpha, beta, [&](int64_t j0, int64_t nj) {
    if (static_cast<int64_t>(scratch.size()) < k * nj) scratch.resize(static_cast<size_t>(k * nj));
    widen(j0, nj, scratch.data());
    return std::pair<const float*, int64_t>(scratch.data(), lb.row_major ? nj : k);
  });
  if (done) return;
#endif
  if (static_cast<int64_t>(scratch.size()) < k * n) scratch.resize(static_cast<size_t>(k * n));
  widen(0, n, scratch.data());
  MatLayout lw = lb;
  lw.ld = lb.row_major ? std::max<int64_t>(n, 1) : std::max<int64_t>(k, 1);
  if (la.row_major && lw.row_major)
    gemm_one<float, Eigen::RowMajor, Eigen::RowMajor>(a, la, scratch.data(), lw, out, alpha, beta);
  else if (la.row_major)
    gemm_one<float, Eigen::RowMajor, Eigen::ColMajor>(a, la, scratch.data(), lw, out, alpha, beta);
  else if (lw.row_major)
    gemm_one<float, Eigen::ColMajor, Eigen::RowMajor>(a, la, scratch.data(), lw, out, alpha, beta);
  else
    gemm_one<float, Eigen::ColMajor, Eigen::ColMajor>(a, la, scratch.data(), lw, out, alpha, beta);
}

void matmul(const MatmulParams& p) {
  if (p.out.numel() == 0) return;
  if (p.a.dtype == DType::kF32 && p.out.dtype == DType::kF32 && p.b.dtype != DType::kF32) {
    MT_CHECK(p.a.ndim() == 2 && p.b.ndim() == 2, "matmul: a 16-bit right operand needs 2-D operands, got a {} b {}",
             p.a.sizes, p.b.sizes);
    if (p.b.dtype == DType::kBF16) return matmul_widen_b<BFloat16>(p);
    if (p.b.dtype == DType::kF16) return matmul_widen_b<Float16>(p);
    MT_FAIL("matmul: f32 a with a {} b (the CPU kernel widens bf16 or f16 only)", dtype_name(p.b.dtype));
  }
  switch (p.a.dtype) {
    case DType::kF32:
      matmul_dispatch<float>(p);
      break;
    case DType::kF64:
      matmul_dispatch<double>(p);
      break;
    default:
      MT_FAIL("matmul: dtype {} is not supported by the CPU kernel (f32 or f64)", dtype_name(p.a.dtype));
  }
}

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_matmul(KernelTable& t) { t.matmul = cpu::matmul; }
}  // namespace mt
