// Indexing kernels on CUDA, mirroring kernels/cpu/index.cpp, for every dtype. index_select and
// gather only move bytes, so they dispatch on the element size. The accumulating kernels are
// deterministic without atomics and add in the CPU's order (index order), each step rounded
// like the CPU's (no fused multiply-add), so f32/f64 results equal the CPU's bit for bit:
// - index_add (the embedding backward): when the output slice is wide enough, each thread owns
//   one column and walks all indices in order; otherwise (e.g. a [V, C] embedding, few columns
//   per index) the indices are radix-sorted stably (cub) and one block reduces each run of equal
//   indices into its output row, so repeated tokens never contend on atomics; a thread adds
//   16-byte column packs and keeps several sources in flight, so long runs stay fast.
// - scatter_add: one thread per line (positions that differ only in `dim`), adds in order.
// - topk: one block per row, k rounds of a block-wide selection under the CPU's total order
//   (NaN largest, ties to the lower index): O(k * n) per row, meant for small k.
// Scratch for the sort comes from the caching allocator (StreamScratch, common.cuh).
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

// Index dtypes (binds index_t).
#define MT_CUDA_DISPATCH_INDEX_LOCAL(dt, name, ...)                                        \
  switch (dt) {                                                                            \
    case ::mt::DType::kI64: {                                                              \
      using index_t = int64_t;                                                             \
      __VA_ARGS__;                                                                         \
      break;                                                                               \
    }                                                                                      \
    case ::mt::DType::kI32: {                                                              \
      using index_t = int32_t;                                                             \
      __VA_ARGS__;                                                                         \
      break;                                                                               \
    }                                                                                      \
    default:                                                                               \
      MT_FAIL("{}: index dtype {} is not supported (i64 or i32)", name, ::mt::dtype_name(dt)); \
  }

namespace mt {
namespace {

struct Split3 {  // sizes collapsed around one dim: [outer, n, inner]
  int64_t outer = 1, n = 1, inner = 1;
};
Split3 split3(const Shape& sizes, int dim) {
  Split3 s;
  for (int d = 0; d < dim; ++d) s.outer *= sizes[d];
  s.n = sizes[dim];
  for (int d = dim + 1; d < sizes.size(); ++d) s.inner *= sizes[d];
  return s;
}

unsigned capped_grid(int64_t blocks) {
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 30));
}

// dst + alpha * v as the CPU computes it: in T's compute type, multiply and add rounded
// separately (no FMA), rounded once to T.
template <class T>
__device__ __forceinline__ T add_scaled(T dst, T v, double alpha) {
  if constexpr (std::is_same_v<T, bool>) {
    return dst || (v && alpha != 0);
  } else if constexpr (std::is_same_v<T, double>) {
    return __dadd_rn(dst, __dmul_rn(alpha, v));
  } else if constexpr (std::is_same_v<acc_t<T>, float>) {
    return from_acc<T>(__fadd_rn(to_acc(dst), __fmul_rn(static_cast<float>(alpha), to_acc(v))));
  } else {
    return static_cast<T>(dst + static_cast<T>(alpha) * v);
  }
}

// ---- index_select -----------------------------------------------------------------------------

// out row (o, j) = in row (o, idx[j]); a row is `upr` units of U bytes. Block: x across the
// units of a row, y across rows.
template <class U, class I>
__global__ void index_select_rows(const U* __restrict__ in, const I* __restrict__ idx, U* __restrict__ out,
                                  int64_t outer, int64_t n, int64_t m, int64_t upr) {
  const int64_t rows = outer * m;
  for (int64_t r = blockIdx.x * int64_t{blockDim.y} + threadIdx.y; r < rows; r += int64_t{gridDim.x} * blockDim.y) {
    const int64_t o = r / m, j = r - o * m;
    const U* src = in + (o * n + static_cast<int64_t>(idx[j])) * upr;
    U* dst = out + r * upr;
    for (int64_t u = threadIdx.x; u < upr; u += blockDim.x) dst[u] = src[u];
  }
}

template <class U, class I>
void index_select_launch(const IndexSelectParams& p, const Split3& s, int64_t m, int64_t row_bytes) {
  const int64_t upr = row_bytes / static_cast<int64_t>(sizeof(U));
  int bx = 32;
  while (bx < 256 && bx < upr) bx *= 2;
  const int by = 256 / bx;
  index_select_rows<U, I><<<capped_grid(ceil_div(s.outer * m, by)), dim3(bx, by), 0, cuda::current_stream()>>>(
      static_cast<const U*>(p.in.data), p.index.ptr<const I>(), static_cast<U*>(p.out.data), s.outer, s.n, m, upr);
  MT_CUDA_LAUNCH_CHECK();
}

void index_select(const IndexSelectParams& p) {
  const Split3 s = split3(p.in.sizes, p.dim);
  const int64_t m = p.index.numel();
  if (s.inner == 0 || s.outer == 0 || m == 0) return;
  const int64_t row_bytes = s.inner * static_cast<int64_t>(dtype_size(p.in.dtype));
  const uintptr_t align = reinterpret_cast<uintptr_t>(p.in.data) | reinterpret_cast<uintptr_t>(p.out.data) |
                          static_cast<uintptr_t>(row_bytes);
  MT_CUDA_DISPATCH_INDEX_LOCAL(p.index.dtype, "index_select", {
    if (align % 16 == 0)
      index_select_launch<uint4, index_t>(p, s, m, row_bytes);
    else if (align % 8 == 0)
      index_select_launch<uint2, index_t>(p, s, m, row_bytes);
    else if (align % 4 == 0)
      index_select_launch<uint32_t, index_t>(p, s, m, row_bytes);
    else if (align % 2 == 0)
      index_select_launch<uint16_t, index_t>(p, s, m, row_bytes);
    else
      index_select_launch<uint8_t, index_t>(p, s, m, row_bytes);
  });
}

// ---- index_add --------------------------------------------------------------------------------

// Column owners: thread (o, c) walks all indices j in order.
template <class T, class I>
__global__ void index_add_columns(T* out, const I* __restrict__ idx, const T* __restrict__ src, int64_t outer,
                                  int64_t n, int64_t m, int64_t inner, double alpha) {
  const int64_t total = outer * inner;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total; t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = t / inner, c = t - o * inner;
    const T* sp = src + o * m * inner + c;
    T* op = out + o * n * inner + c;
    for (int64_t j = 0; j < m; ++j) {
      T* d = op + static_cast<int64_t>(idx[j]) * inner;
      *d = add_scaled(*d, sp[j * inner], alpha);
    }
  }
}

__global__ void iota_i32(int32_t* v, int64_t m) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < m; t += int64_t{gridDim.x} * blockDim.x)
    v[t] = static_cast<int32_t>(t);
}

// Sorted runs: block p (a run start in the stably sorted keys) adds, for every outer o, the
// sources of its run in index order into output row key. A thread owns V adjacent columns (one
// 16-byte load when the row allows it) and reads kRunBatch sources before adding them, so a
// long run (a frequent token: thousands of repeats in a batch) keeps kRunBatch loads in flight
// instead of one. Each column still adds in index order, rounded like the CPU.
constexpr int kRunBatch = 8;

template <class T, class I, int V>
__global__ void index_add_runs(T* out, const I* __restrict__ keys, const int32_t* __restrict__ pos,
                               const T* __restrict__ src, int64_t outer, int64_t n, int64_t m, int64_t inner,
                               double alpha) {
  using P = Pack<T, V>;
  const int64_t nvec = inner / V;
  for (int64_t p = blockIdx.x; p < m; p += gridDim.x) {
    const I key = keys[p];
    if (p > 0 && keys[p - 1] == key) continue;  // not a run start (uniform over the block)
    // The run's end, blockDim.x keys at a time: the keys are sorted, so the equal ones of a
    // window come first and their count is the run's advance.
    int64_t end = p + 1;
    for (;;) {
      const int64_t q = end + threadIdx.x;
      const int same = __syncthreads_count(q < m && keys[q] == key);
      end += same;
      if (same < static_cast<int>(blockDim.x)) break;
    }
    for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
      P* orow = reinterpret_cast<P*>(out + (o * n + static_cast<int64_t>(key)) * inner);
      const T* sbase = src + o * m * inner;
      for (int64_t c = threadIdx.x; c < nvec; c += blockDim.x) {
        P acc = orow[c];
        int64_t q = p;
        for (; q + kRunBatch <= end; q += kRunBatch) {
          P v[kRunBatch];
#pragma unroll
          for (int u = 0; u < kRunBatch; ++u)
            v[u] = reinterpret_cast<const P*>(sbase + static_cast<int64_t>(pos[q + u]) * inner)[c];
#pragma unroll
          for (int u = 0; u < kRunBatch; ++u)
#pragma unroll
            for (int e = 0; e < V; ++e) acc.v[e] = add_scaled(acc.v[e], v[u].v[e], alpha);
        }
        for (; q < end; ++q) {
          const P v = reinterpret_cast<const P*>(sbase + static_cast<int64_t>(pos[q]) * inner)[c];
#pragma unroll
          for (int e = 0; e < V; ++e) acc.v[e] = add_scaled(acc.v[e], v.v[e], alpha);
        }
        orow[c] = acc;
      }
    }
  }
}

template <class T, class I, int V>
void launch_index_add_runs(T* out, const I* keys, const int32_t* pos, const T* src, const Split3& s, int64_t m,
                           double alpha, cudaStream_t st) {
  const int64_t nvec = s.inner / V;
  int bx = 32;
  while (bx < 256 && bx < nvec) bx *= 2;
  const dim3 grid(capped_grid(m), static_cast<unsigned>(std::min<int64_t>(s.outer, 65535)));
  index_add_runs<T, I, V><<<grid, bx, 0, st>>>(out, keys, pos, src, s.outer, s.n, m, s.inner, alpha);
  MT_CUDA_LAUNCH_CHECK();
}

int bits_for(int64_t n) {  // bits needed for the values 0 .. n - 1
  int b = 1;
  while (b < 63 && (int64_t{1} << b) < n) ++b;
  return b;
}

template <class T, class I>
void index_add_typed(const IndexAddParams& p) {
  const Split3 s = split3(p.out.sizes, p.dim);
  const int64_t m = p.index.numel();
  if (s.inner == 0 || s.outer == 0 || m == 0) return;
  cudaStream_t st = cuda::current_stream();
  T* out = p.out.ptr<T>();
  const I* idx = p.index.ptr<const I>();
  const T* src = p.src.ptr<const T>();
  // Enough column owners to fill the device, or too few indices to be worth a sort.
  if (s.outer * s.inner >= (int64_t{1} << 16) || m <= 16 || m > INT32_MAX) {
    index_add_columns<T, I><<<grid_for(s.outer * s.inner), 256, 0, st>>>(out, idx, src, s.outer, s.n, m, s.inner,
                                                                          p.alpha);
    MT_CUDA_LAUNCH_CHECK();
    return;
  }
  const int mi = static_cast<int>(m);
  StreamScratch keys_out(sizeof(I) * m), pos_in(sizeof(int32_t) * m), pos_out(sizeof(int32_t) * m);
  iota_i32<<<grid_for(m), 256, 0, st>>>(pos_in.as<int32_t>(), m);
  MT_CUDA_LAUNCH_CHECK();
  const int end_bit = bits_for(s.n);
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, idx, keys_out.as<I>(), pos_in.as<int32_t>(),
                                                pos_out.as<int32_t>(), mi, 0, end_bit, st));
  StreamScratch temp(temp_bytes);
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, idx, keys_out.as<I>(),
                                                pos_in.as<int32_t>(), pos_out.as<int32_t>(), mi, 0, end_bit, st));
  // 16-byte column packs when every row start is aligned to them (bool and 1-byte types too).
  constexpr int kV = static_cast<int>(16 / sizeof(T));
  const bool wide = kV > 1 && s.inner % kV == 0 && aligned16(out) && aligned16(src);
  if (wide)
    launch_index_add_runs<T, I, kV>(out, keys_out.as<const I>(), pos_out.as<const int32_t>(), src, s, m, p.alpha, st);
  else
    launch_index_add_runs<T, I, 1>(out, keys_out.as<const I>(), pos_out.as<const int32_t>(), src, s, m, p.alpha, st);
}

void index_add(const IndexAddParams& p) {
  MT_CUDA_DISPATCH_ALL(p.out.dtype, "index_add", {
    using T = scalar_t;
    MT_CUDA_DISPATCH_INDEX_LOCAL(p.index.dtype, "index_add", { index_add_typed<T, index_t>(p); });
  });
}

// ---- gather, scatter_add ----------------------------------------------------------------------

// out[pos] = in[pos with coordinate `dim` replaced by index[pos]]; index and out contiguous.
template <class U, class I>
__global__ void gather_kernel(const U* __restrict__ in, CView in_v, const I* __restrict__ idx, CView idx_v,
                              U* __restrict__ out, int64_t total, int dim) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total; t += int64_t{gridDim.x} * blockDim.x) {
    int64_t rem = t, off = 0;
    for (int d = idx_v.ndim - 1; d >= 0; --d) {
      const int64_t c = rem % idx_v.sizes[d];
      rem /= idx_v.sizes[d];
      if (d != dim) off += c * in_v.strides[d];
    }
    off += static_cast<int64_t>(idx[t]) * in_v.strides[dim];
    out[t] = in[off];
  }
}

template <class U, class I>
void gather_launch(const GatherParams& p, int64_t total) {
  gather_kernel<U, I><<<grid_for(total), 256, 0, cuda::current_stream()>>>(
      static_cast<const U*>(p.in.data), cview(p.in), p.index.ptr<const I>(), cview(p.index),
      static_cast<U*>(p.out.data), total, p.dim);
  MT_CUDA_LAUNCH_CHECK();
}

void gather(const GatherParams& p) {
  const int64_t total = p.index.numel();
  if (total == 0) return;
  MT_CUDA_DISPATCH_INDEX_LOCAL(p.index.dtype, "gather", {
    switch (dtype_size(p.in.dtype)) {
      case 1: gather_launch<uint8_t, index_t>(p, total); break;
      case 2: gather_launch<uint16_t, index_t>(p, total); break;
      case 4: gather_launch<uint32_t, index_t>(p, total); break;
      case 8: gather_launch<uint64_t, index_t>(p, total); break;
      default: MT_FAIL("gather: unsupported element size of {}", dtype_name(p.in.dtype));
    }
  });
}

// One thread per line of the index tensor along `dim`; adds in index order within the line.
// Lines differ outside `dim`, so no two threads write one output element.
template <class T, class I>
__global__ void scatter_add_lines(T* out, CView out_v, const I* __restrict__ idx, CView idx_v,
                                  const T* __restrict__ src, CView src_v, int64_t lines, int dim) {
  const int64_t m = idx_v.sizes[dim];
  const int64_t si = idx_v.strides[dim], ss = src_v.strides[dim], so = out_v.strides[dim];
  for (int64_t l = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; l < lines; l += int64_t{gridDim.x} * blockDim.x) {
    int64_t rem = l, oi = 0, os = 0, oo = 0;
    for (int d = idx_v.ndim - 1; d >= 0; --d) {
      if (d == dim) continue;
      const int64_t c = rem % idx_v.sizes[d];
      rem /= idx_v.sizes[d];
      oi += c * idx_v.strides[d];
      os += c * src_v.strides[d];
      oo += c * out_v.strides[d];
    }
    for (int64_t j = 0; j < m; ++j) {
      T* d = out + oo + static_cast<int64_t>(idx[oi + j * si]) * so;
      *d = add_scaled(*d, src[os + j * ss], 1.0);
    }
  }
}

template <class T, class I>
void scatter_add_typed(const ScatterAddParams& p) {
  const int64_t m = p.index.sizes[p.dim];
  if (m == 0 || p.index.numel() == 0) return;
  const int64_t lines = p.index.numel() / m;
  scatter_add_lines<T, I><<<grid_for(lines), 256, 0, cuda::current_stream()>>>(
      p.out.ptr<T>(), cview(p.out), p.index.ptr<const I>(), cview(p.index), p.src.ptr<const T>(), cview(p.src), lines,
      p.dim);
  MT_CUDA_LAUNCH_CHECK();
}

void scatter_add(const ScatterAddParams& p) {
  MT_CUDA_DISPATCH_ALL(p.out.dtype, "scatter_add", {
    using T = scalar_t;
    MT_CUDA_DISPATCH_INDEX_LOCAL(p.index.dtype, "scatter_add", { scatter_add_typed<T, index_t>(p); });
  });
}

// ---- topk -------------------------------------------------------------------------------------

template <class C>
__device__ __forceinline__ bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>)
    return v != v;
  else
    return false;
}

// The CPU's total order: does (va, a) come before (vb, b)? NaN counts as the largest value,
// ties go to the lower index. An index < 0 is an empty slot, after everything.
template <class C>
__device__ __forceinline__ bool before(C va, int64_t a, C vb, int64_t b, bool largest) {
  if (b < 0) return a >= 0;
  if (a < 0) return false;
  const bool na = is_nan(va), nb = is_nan(vb);
  if (na || nb) {
    if (na && nb) return a < b;
    return largest ? na : nb;
  }
  if (va != vb) return largest ? va > vb : va < vb;
  return a < b;
}

// Shuffles of the compare type: 8/16-bit integers and bool travel as int.
template <class C>
__device__ __forceinline__ C shfl_xor(C v, int o) {
  if constexpr (sizeof(C) < 4) {
    return static_cast<C>(__shfl_xor_sync(0xffffffffu, static_cast<int>(v), o));
  } else if constexpr (std::is_same_v<C, int64_t>) {
    return static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v), o));
  } else {
    return __shfl_xor_sync(0xffffffffu, v, o);
  }
}

template <class T>
__global__ void topk_rows(const T* __restrict__ in, T* __restrict__ values, int64_t* __restrict__ indices,
                          int64_t rows, int64_t n, int64_t k, bool largest) {
  using C = acc_t<T>;
  __shared__ C shv[32];
  __shared__ int64_t shi[32];
  __shared__ int64_t prev_i;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * n;
    for (int64_t r = 0; r < k; ++r) {
      // prev_i (the previous pick) is valid here: written before the last __syncthreads.
      const int64_t pi = r > 0 ? prev_i : -1;
      const C pv = r > 0 ? to_acc(x[pi]) : C(0);
      C bv = C(0);
      int64_t bi = -1;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const C v = to_acc(x[j]);
        if (pi >= 0 && !before(pv, pi, v, j, largest)) continue;  // picked already
        if (before(v, j, bv, bi, largest)) {
          bv = v;
          bi = j;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const C ov = shfl_xor(bv, o);
        const int64_t oi = shfl_xor(bi, o);
        if (before(ov, oi, bv, bi, largest)) {
          bv = ov;
          bi = oi;
        }
      }
      if (lane == 0) {
        shv[wid] = bv;
        shi[wid] = bi;
      }
      __syncthreads();
      if (wid == 0) {
        bv = lane < nw ? shv[lane] : C(0);
        bi = lane < nw ? shi[lane] : -1;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const C ov = shfl_xor(bv, o);
          const int64_t oi = shfl_xor(bi, o);
          if (before(ov, oi, bv, bi, largest)) {
            bv = ov;
            bi = oi;
          }
        }
        if (lane == 0) {
          values[row * k + r] = x[bi];
          indices[row * k + r] = bi;
          prev_i = bi;
        }
      }
      __syncthreads();
    }
  }
}

template <class T>
void topk_typed(const TopkParams& p) {
  const int64_t n = p.in.sizes.back();
  const int64_t k = p.k;
  if (n == 0 || k == 0) return;
  const int64_t rows = p.in.numel() / n;
  int threads = 32;
  while (threads < 256 && threads < n) threads *= 2;
  topk_rows<T><<<capped_grid(rows), threads, 0, cuda::current_stream()>>>(
      p.in.ptr<const T>(), p.values.ptr<T>(), p.indices.ptr<int64_t>(), rows, n, k, p.largest);
  MT_CUDA_LAUNCH_CHECK();
}

void topk(const TopkParams& p) { MT_CUDA_DISPATCH_ALL(p.in.dtype, "topk", { topk_typed<scalar_t>(p); }); }

}  // namespace

void register_cuda_index(KernelTable& t) {
  t.index_select = index_select;
  t.index_add = index_add;
  t.gather = gather;
  t.scatter_add = scatter_add;
  t.topk = topk;
}

}  // namespace mt
