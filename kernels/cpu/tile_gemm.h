// Single-threaded GEMM on small row-major tiles, for kernels that run their own tasks inside an
// OpenMP region (attention): c = op(a) op(b) + beta * c, op a transpose or not. OpenBLAS's sgemm
// and dgemm where the build found it (MT_HAVE_OPENBLAS), Eigen's otherwise. OpenBLAS runs on one
// thread here and in the matmul kernel (blas_on_one_thread): threads are OpenMP's, and every tile
// is computed by one call whatever the thread count, so results do not depend on it.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <type_traits>

#include "config.h"
#if MT_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace mt::cpu {

#if MT_HAVE_OPENBLAS
inline void blas_on_one_thread() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}
#endif

// c [m, n] (ld ldc) = op(a) [m, k] * op(b) [k, n] + beta * c; a is [m, k] (lda) or, transposed,
// [k, m]; the same for b. beta 0 ignores c's old values (NaN included).
template <class C>
void tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const C* a, int64_t lda, const C* b, int64_t ldb,
               C beta, C* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
#if MT_HAVE_OPENBLAS
  if constexpr (std::is_same_v<C, float> || std::is_same_v<C, double>) {
    blas_on_one_thread();
    const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<C, float>)
      cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a,
                  static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
    else
      cblas_dgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a,
                  static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
    return;
  }
#endif
  using Mat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using In = Eigen::Map<const Mat, Eigen::Unaligned, Eigen::OuterStride<>>;
  Eigen::Map<Mat, Eigen::Unaligned, Eigen::OuterStride<>> out(c, m, n, Eigen::OuterStride<>(ldc));
  In am(a, ta ? k : m, ta ? m : k, Eigen::OuterStride<>(lda)), bm(b, tb ? n : k, tb ? k : n, Eigen::OuterStride<>(ldb));
  if (beta == C(0)) out.setZero();
  else if (beta != C(1)) out *= beta;
  if (k == 0) return;
  if (ta && tb) out.noalias() += am.transpose() * bm.transpose();
  else if (ta) out.noalias() += am.transpose() * bm;
  else if (tb) out.noalias() += am * bm.transpose();
  else out.noalias() += am * bm;
}

}  // namespace mt::cpu
