// Block-wide reductions shared by the row kernels (norm.cu, loss.cu): sums, and online
// (max, sum of exp(x - max)) pairs. Each fixes its tree (shuffles within warps, then warp 0 over
// the warps' results), so a result depends only on the block size, not on timing.
#pragma once

#include <cmath>

namespace mt {

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the result. `sh` holds 32.
template <class A>
__device__ A block_sum(A v, A* sh) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read from the previous call
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : A(0);
  return warp_sum(v);
}

// Online (max, sum of exp(x - max)) pairs, merged; -inf maxima carry a zero sum.
template <class A>
__device__ __forceinline__ void ms_merge(A& m, A& s, A m2, A s2) {
  const A mn = m > m2 ? m : m2;
  if (mn == -INFINITY) return;  // both empty
  s = (m == -INFINITY ? A(0) : s * exp(m - mn)) + (m2 == -INFINITY ? A(0) : s2 * exp(m2 - mn));
  m = mn;
}

template <class A>
__device__ void block_max_sum(A& m, A& s, A* shm, A* shs) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  __syncthreads();
  if (lane == 0) {
    shm[wid] = m;
    shs[wid] = s;
  }
  __syncthreads();
  m = lane < nw ? shm[lane] : A(-INFINITY);
  s = lane < nw ? shs[lane] : A(0);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

}  // namespace mt
