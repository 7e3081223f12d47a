// Strided N-operand iteration for CPU kernels: coalesces dims, then calls
// inner(ptrs, n, byte_strides) on runs of the innermost dim, in parallel with OpenMP once the
// problem is big enough. Every pointwise-shaped kernel (copy, unary, binary, where) uses this, so
// non-contiguous and broadcast (stride 0) operands work everywhere.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "kernels/view.h"

namespace mt::cpu {

inline constexpr int64_t kParallelGrain = 32768;

template <class T>
T load(const void* p) { return *static_cast<const T*>(p); }

// Converts between any two element types through their compute types.
template <class D, class S>
inline D convert(S x) {
  if constexpr (std::is_same_v<D, S>) {
    return x;
  } else if constexpr (std::is_same_v<D, bool>) {
    return static_cast<compute_t<S>>(x) != compute_t<S>(0);
  } else if constexpr ((std::is_same_v<D, BFloat16> || std::is_same_v<D, Float16>) &&
                       !std::is_same_v<compute_t<S>, float>) {
    // From f64 or an integer: one rounding, not two (through f32).
    return D(float_round_to_odd(static_cast<double>(x)));
  } else if constexpr (std::is_integral_v<D> && !std::is_integral_v<compute_t<S>>) {
    // Floating to integer: truncate to int64, then wrap to the narrower type (two's complement),
    // so that u8/i32 of a negative or large value is defined, and the same as on CUDA.
    return static_cast<D>(static_cast<int64_t>(static_cast<compute_t<S>>(x)));
  } else {
    return D(static_cast<compute_t<D>>(static_cast<compute_t<S>>(x)));
  }
}

template <int N, class Inner>
void strided_loop(const Shape& sizes, const std::array<const KView*, N>& views, Inner&& inner,
                  int64_t grain = kParallelGrain) {
  const int64_t numel = sizes.numel();
  if (numel == 0) return;
  // Coalesced dims, innermost first; byte strides per operand.
  int64_t dsize[kMaxDims];
  int64_t dstride[N][kMaxDims];
  int nd = 0;
  for (int d = sizes.size() - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < N && merge; ++k)
      merge = views[k]->strides[d] * dtype_size(views[k]->dtype) == dstride[k][nd - 1] * dsize[nd - 1];
    if (merge) {
      dsize[nd - 1] *= sizes[d];
    } else {
      dsize[nd] = sizes[d];
      for (int k = 0; k < N; ++k) dstride[k][nd] = views[k]->strides[d] * dtype_size(views[k]->dtype);
      ++nd;
    }
  }
  if (nd == 0) {  // a single element
    dsize[0] = 1;
    for (int k = 0; k < N; ++k) dstride[k][0] = 0;
    nd = 1;
  }
  const int64_t n_inner = dsize[0];
  const int64_t rows = numel / n_inner;
  int64_t chunk = n_inner;
  if (numel >= grain && rows < 64) chunk = std::max<int64_t>(grain / 4, (n_inner + 63) / 64);
  const int64_t chunks_per_row = (n_inner + chunk - 1) / chunk;
  const int64_t tasks = rows * chunks_per_row;
  int64_t inner_stride[N];
  for (int k = 0; k < N; ++k) inner_stride[k] = dstride[k][0];

  auto run_task = [&](int64_t t) {
    int64_t row = t / chunks_per_row, c = t % chunks_per_row;
    std::array<char*, N> p;
    for (int k = 0; k < N; ++k) p[k] = static_cast<char*>(views[k]->data);
    int64_t r = row;
    for (int d = 1; d < nd && r; ++d) {
      int64_t i = r % dsize[d];
      r /= dsize[d];
      for (int k = 0; k < N; ++k) p[k] += i * dstride[k][d];
    }
    int64_t begin = c * chunk, n = std::min(chunk, n_inner - begin);
    for (int k = 0; k < N; ++k) p[k] += begin * inner_stride[k];
    inner(p.data(), n, static_cast<const int64_t*>(inner_stride));
  };
  if (numel >= grain && tasks > 1) {
#ifdef _OPENMP  // an installed header: a consumer built without -fopenmp gets serial loops
#pragma omp parallel for schedule(static)
#endif
    for (int64_t t = 0; t < tasks; ++t) run_task(t);
  } else {
    for (int64_t t = 0; t < tasks; ++t) run_task(t);
  }
}

// Parallel loop over [0, n) when the total work (n * cost_per_item) is worth threads.
template <class F>
void parallel_for(int64_t n, int64_t cost_per_item, F&& f) {
  if (n > 1 && n * cost_per_item >= kParallelGrain) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < n; ++i) f(i);
  } else {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
}

}  // namespace mt::cpu
