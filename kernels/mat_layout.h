// The matrix geometry of a GEMM operand (the last two dims of a KView), shared by the CPU and
// CUDA matmul kernels: rows, cols, whether the rows or the columns are contiguous, and the
// leading dimension a BLAS call takes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/view.h"

namespace mt {

struct MatLayout {
  int64_t rows = 0, cols = 0;
  bool row_major = true;
  int64_t ld = 1;  // outer stride in elements
};

// The front end guarantees unit stride in one of the last two dims (a dim of size 1 counts).
inline MatLayout layout_of(const KView& v) {
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

}  // namespace mt
