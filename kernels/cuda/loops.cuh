// Strided N-operand iteration for CUDA kernels (the device side of kernels/cpu/loops.h): the host
// coalesces dims exactly like strided_loop, then every thread maps a linear output index to one
// element offset per operand. A single coalesced dim (contiguous operands, or a scalar broadcast)
// costs one multiply per operand; other layouts pay a div/mod per dim.
#pragma once

#include <array>

#include "kernels/cuda/common.cuh"

namespace mt::cuda {

template <int N>
struct Geom {
  int nd = 0;
  int64_t size[kMaxDims];        // innermost first
  int64_t stride[N][kMaxDims];   // elements

  __device__ __forceinline__ void offsets(int64_t linear, int64_t* off) const {
    if (nd == 1) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = linear * stride[k][0];
      return;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = 0; d < nd; ++d) {
      const int64_t i = linear % size[d];
      linear /= size[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * stride[k][d];
    }
  }
};

// Views share `sizes`; strides may be 0 (broadcast).
template <int N>
Geom<N> make_geom(const Shape& sizes, const std::array<const KView*, N>& views) {
  Geom<N> g;
  for (int d = sizes.size() - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    bool merge = g.nd > 0;
    for (int k = 0; k < N && merge; ++k)
      merge = views[k]->strides[d] == g.stride[k][g.nd - 1] * g.size[g.nd - 1];
    if (merge) {
      g.size[g.nd - 1] *= sizes[d];
    } else {
      g.size[g.nd] = sizes[d];
      for (int k = 0; k < N; ++k) g.stride[k][g.nd] = views[k]->strides[d];
      ++g.nd;
    }
  }
  if (g.nd == 0) {  // one element
    g.nd = 1;
    g.size[0] = 1;
    for (int k = 0; k < N; ++k) g.stride[k][0] = 0;
  }
  return g;
}

template <int N, class F>
__global__ void elementwise_kernel(int64_t n, Geom<N> g, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[N];
    g.offsets(i, off);
    f(off);
  }
}

// Runs f(const int64_t* offsets) for every element of `sizes` on the current stream.
template <int N, class F>
void launch_elementwise(const Shape& sizes, const std::array<const KView*, N>& views, F f) {
  const int64_t n = sizes.numel();
  if (n == 0) return;
  Geom<N> g = make_geom<N>(sizes, views);
  constexpr int kThreads = 256;
  elementwise_kernel<N><<<grid_for(n, kThreads), kThreads, 0, current_stream()>>>(n, g, f);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::cuda
