// Strided N-operand iteration for CUDA kernels (the device side of kernels/cpu/loops.h): the host
// coalesces dims exactly like strided_loop, then every thread maps a linear output index to one
// element offset per operand. A single coalesced dim (contiguous operands, or a scalar broadcast)
// costs one multiply per operand; other layouts pay a div/mod per dim.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

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

// The same geometry in 32-bit arithmetic, for the common case where the element count and every
// operand's offsets fit in int32: a 32-bit div/mod per dim is several times cheaper than the
// emulated 64-bit one (transposing copies are ALU-bound on it).
template <int N>
struct Geom32 {
  int nd = 0;
  uint32_t size[kMaxDims];
  int32_t stride[N][kMaxDims];

  __device__ __forceinline__ void offsets(uint32_t linear, int64_t* off) const {
    int32_t o[N] = {};
    for (int d = 0; d < nd; ++d) {
      const uint32_t q = linear / size[d];
      const int32_t i = static_cast<int32_t>(linear - q * size[d]);
      linear = q;
#pragma unroll
      for (int k = 0; k < N; ++k) o[k] += i * stride[k][d];
    }
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = o[k];
  }
};

// Fills g32 and returns true when n and every operand's extreme offsets fit in int32.
template <int N>
bool narrow_geom(const Geom<N>& g, int64_t n, Geom32<N>& g32) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  if (n > kMax || g.nd <= 1) return false;
  g32.nd = g.nd;
  for (int k = 0; k < N; ++k) {
    int64_t extent = 0;
    for (int d = 0; d < g.nd; ++d) {
      const int64_t st = g.stride[k][d];
      if (st > kMax || st < -kMax) return false;
      extent += (g.size[d] - 1) * (st < 0 ? -st : st);
      if (extent > kMax) return false;
      g32.stride[k][d] = static_cast<int32_t>(st);
    }
  }
  for (int d = 0; d < g.nd; ++d) g32.size[d] = static_cast<uint32_t>(g.size[d]);
  return true;
}

template <int N, class F>
__global__ void elementwise_kernel32(uint32_t n, Geom32<N> g, F f) {
  const uint32_t step = gridDim.x * blockDim.x;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[N];
    g.offsets(i, off);
    f(off);  // i < 2^31 and step < 2^31: i + step does not wrap
  }
}

// Runs f(const int64_t* offsets) for every element of `sizes` on the current stream.
template <int N, class F>
void launch_elementwise(const Shape& sizes, const std::array<const KView*, N>& views, F f) {
  const int64_t n = sizes.numel();
  if (n == 0) return;
  Geom<N> g = make_geom<N>(sizes, views);
  constexpr int kThreads = 256;
  Geom32<N> g32;
  if (narrow_geom<N>(g, n, g32)) {
    elementwise_kernel32<N><<<grid_for(n, kThreads), kThreads, 0, current_stream()>>>(static_cast<uint32_t>(n), g32,
                                                                                        f);
  } else {
    elementwise_kernel<N><<<grid_for(n, kThreads), kThreads, 0, current_stream()>>>(n, g, f);
  }
  MT_CUDA_LAUNCH_CHECK();
}

// ---- contiguous fast path -------------------------------------------------------------------------
// When every operand is dense with unit stride over the same n elements and 16-byte aligned, each
// thread moves 16 bytes per operand per access (8 bf16, 4 f32, 2 f64): one wide load or store
// instead of 2-8 narrow ones, and no offset arithmetic. Results are those of the general path
// (the same f per element). Pack<T, V> and aligned16 are in common.cuh.

// True when `views` (sharing `sizes`) are all contiguous with unit stride and 16-byte aligned.
template <int N>
bool dense_aligned(const Shape& sizes, const std::array<const KView*, N>& views) {
  const Geom<N> g = make_geom<N>(sizes, views);
  if (g.nd != 1 || sizes.numel() < 2) return false;
  for (int k = 0; k < N; ++k)
    if (g.stride[k][0] != 1 || !aligned16(views[k]->data)) return false;
  return true;
}

// Elements per 16-byte access for the widest of the operand types.
template <class... T>
constexpr int pack_width() {
  constexpr size_t widest = std::max({sizeof(T)...});
  return static_cast<int>(16 / widest);
}

template <int V, class In, class Out, class F>
__global__ void dense_map1_kernel(const In* __restrict__ x, Out* __restrict__ y, int64_t n, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t i = tid; i < packs; i += step) {
    const Pack<In, V> a = reinterpret_cast<const Pack<In, V>*>(x)[i];
    Pack<Out, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = f(a.v[k]);
    reinterpret_cast<Pack<Out, V>*>(y)[i] = r;
  }
  for (int64_t i = packs * V + tid; i < n; i += step) y[i] = f(x[i]);
}

template <int V, class In, class Out, class F>
__global__ void dense_map2_kernel(const In* __restrict__ x, const In* __restrict__ z, Out* __restrict__ y, int64_t n,
                                  F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t i = tid; i < packs; i += step) {
    const Pack<In, V> a = reinterpret_cast<const Pack<In, V>*>(x)[i];
    const Pack<In, V> b = reinterpret_cast<const Pack<In, V>*>(z)[i];
    Pack<Out, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = f(a.v[k], b.v[k]);
    reinterpret_cast<Pack<Out, V>*>(y)[i] = r;
  }
  for (int64_t i = packs * V + tid; i < n; i += step) y[i] = f(x[i], z[i]);
}

// y = f(x) elementwise over dense, aligned operands (see dense_aligned).
template <class In, class Out, class F>
void launch_dense_map1(const In* x, Out* y, int64_t n, F f) {
  constexpr int V = pack_width<In, Out>();
  constexpr int kThreads = 256;
  dense_map1_kernel<V><<<grid_for(ceil_div(n, V), kThreads), kThreads, 0, current_stream()>>>(x, y, n, f);
  MT_CUDA_LAUNCH_CHECK();
}

template <class In, class Out, class F>
void launch_dense_map2(const In* x, const In* z, Out* y, int64_t n, F f) {
  constexpr int V = pack_width<In, Out>();
  constexpr int kThreads = 256;
  dense_map2_kernel<V><<<grid_for(ceil_div(n, V), kThreads), kThreads, 0, current_stream()>>>(x, z, y, n, f);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::cuda
