// Batched GEMM on the CPU through Eigen, without copies: each matrix of a and b is mapped in place
// as row-major (unit stride along its columns) or column-major (unit stride along its rows) with
// an outer stride, so transposed views cost nothing. Many small matrices run in parallel over the
// batch (Eigen then stays single-threaded inside the OpenMP region); big ones run one after the
// other and Eigen's GEMM parallelizes each of them internally. Every output element is computed
// by one GEMM call, so results do not depend on how the batch is split across threads.
#include <Eigen/Core>

#include <algorithm>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/loops.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

using Eigen::Dynamic;
using Eigen::OuterStride;

// Geometry of one operand's matrices: its layout and leading dimension.
struct MatLayout {
  int64_t rows = 0, cols = 0;
  bool row_major = true;
  int64_t ld = 1;  // outer stride in elements
};

// The front end guarantees unit stride in one of the last two dims (a dim of size 1 counts).
MatLayout layout_of(const KView& v) {
  const int n = v.ndim();
  MatLayout m;
  m.rows = v.sizes[n - 2];
  m.cols = v.sizes[n - 1];
  const int64_t rs = v.strides[n - 2], cs = v.strides[n - 1];
  if (m.cols <= 1 || cs == 1) {
    m.row_major = true;
    m.ld = m.rows <= 1 ? std::max<int64_t>(m.cols, 1) : rs;
  } else {
    m.row_major = false;
    m.ld = m.cols <= 1 ? std::max<int64_t>(m.rows, 1) : cs;
  }
  return m;
}

template <class T, int Order>
using MatMap = Eigen::Map<const Eigen::Matrix<T, Dynamic, Dynamic, Order>, Eigen::Unaligned, OuterStride<>>;
template <class T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>>;

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

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
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
    run(0);  // Eigen parallelizes a big GEMM itself
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

void matmul(const MatmulParams& p) {
  if (p.out.numel() == 0) return;
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
