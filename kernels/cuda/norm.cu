// CUDA kernels for rms_norm(_bwd), layer_norm(_bwd) and (log-)softmax over the last dim of
// contiguous [rows, H] data, mirroring kernels/cpu/norm.cpp. One block per row; per-row sums
// accumulate in acc_t (float for f32/bf16/f16, double for f64) with a fixed-shape tree, so results
// do not change from run to run. Rows load 16 bytes at a time when H and the pointers allow it.
// The weight/bias gradients are a deterministic two-pass reduction over rows (no float atomics):
// pass 1 gives each block a fixed chunk of rows and writes one partial row per chunk, pass 2 sums
// the partials of each column in chunk order. The partials live in scratch from the caching
// allocator (StreamScratch, common.cuh).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {
namespace {

// ---- shared helpers ---------------------------------------------------------------------------

// N elements of T loaded or stored as one aligned access (N == 1: plain scalar access).
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <class T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p, int64_t k) {
  return reinterpret_cast<const Vec<T, N>*>(p)[k];
}
template <class T, int N>
__device__ __forceinline__ void store_vec(T* p, int64_t k, const Vec<T, N>& v) {
  reinterpret_cast<Vec<T, N>*>(p)[k] = v;
}

// Stores the input gradient o at vector k of gx, or with `accumulate` adds it to what gx holds
// there as the binary add kernel does (o is already rounded to T; the sum in acc_t, rounded
// once), so gx ends with the bits of add(gx, o): the autograd engine's gradient sum, fused.
template <class T, int N>
__device__ __forceinline__ void store_grad(T* gx, int64_t k, Vec<T, N> o, bool accumulate) {
  if (accumulate) {
    const Vec<T, N> old = load_vec<T, N>(gx, k);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      if constexpr (std::is_same_v<acc_t<T>, double>)
        o.v[e] = cvt<T>(__dadd_rn(to_acc(old.v[e]), to_acc(o.v[e])));
      else
        o.v[e] = cvt<T>(__fadd_rn(to_acc(old.v[e]), to_acc(o.v[e])));
    }
  }
  store_vec<T, N>(gx, k, o);
}

// Keeps v in registers as it is (packed 16-bit pairs) and makes the compiler forget the values it
// already converted from it: without this, nvcc keeps a row's converted f32 copies alive from the
// first use to the second (168 registers instead of 122 for rms_norm_bwd_warp_rows
// at 8 vectors of bf16).
template <class T, int N>
__device__ __forceinline__ void forget_derived(Vec<T, N>& v) {
  if constexpr (sizeof(v) % 4 == 0) {
    uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (size_t i = 0; i < sizeof(v) / 4; ++i) asm volatile("" : "+r"(w[i]));
  }
}

struct RowGeom {
  int64_t rows = 0, h = 0;
};
RowGeom rows_of(const KView& x) {
  RowGeom g;
  g.h = x.ndim() ? x.sizes[x.ndim() - 1] : 1;
  g.rows = 1;
  for (int d = 0; d + 1 < x.ndim(); ++d) g.rows *= x.sizes[d];
  return g;
}

// Threads per row block: enough for about two vectors each, 32..512.
int row_threads(int64_t nvec) {
  int t = 32;
  while (t < 512 && 2 * t < nvec) t *= 2;
  return t;
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 30)); }

// Widest vector (16 bytes) when H is a multiple and every pointer is aligned; else scalar.
template <class T>
constexpr int kVec = 16 / sizeof(T);
bool aligned16_or_null(const void* p) { return p == nullptr || aligned16(p); }
template <class T>
bool can_vectorize(int64_t h, std::initializer_list<const void*> ptrs) {
  if (h % kVec<T> != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16_or_null(p)) return false;
  return true;
}

// Row chunks of the weight-gradient pass 1: at most kMaxChunks partial rows.
constexpr int64_t kMaxChunks = 512;
struct Chunks {
  int64_t per = 1, n = 0;
};
Chunks chunks_of(int64_t rows, bool partials) {
  Chunks c;
  c.per = std::max<int64_t>(1, ceil_div(rows, partials ? kMaxChunks : int64_t{1} << 30));
  c.n = ceil_div(rows, c.per);
  return c;
}
// Accumulators of pass 1 live in shared memory when they fit the default 48 KiB (with room for
// the kernel's static reduction buffer).
constexpr size_t kSharedAccBytes = 46 * 1024;

// Pass 2: out_k[j] = sum over chunks c of partial[c][k][j]. A block owns 32 columns (one
// coalesced warp row); warp w sums chunks w, w + 32, ... in order, then warp 0 adds the 32 partial
// sums in order: a fixed order for given shapes, with 32x the parallelism of one thread per column
// (the 2048 columns of a llama-1b norm are only 64 blocks; 4.7 instead of 7.1 us on an H100).
constexpr int kColWarps = 32;
template <class T, int NAcc>
__global__ void __launch_bounds__(32 * kColWarps) column_sums(const acc_t<T>* __restrict__ partial, int64_t nchunks,
                                                              int64_t h, T* out0, T* out1) {
  using A = acc_t<T>;
  __shared__ A sh[kColWarps][NAcc][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j = blockIdx.x * int64_t{32} + lane;
  A s[NAcc] = {};
  if (j < h) {
    // kBatch chunks' loads in flight before their adds, which stay in chunk order.
    constexpr int kBatch = 8;
    int64_t c = warp;
    for (; c + (kBatch - 1) * kColWarps < nchunks; c += kBatch * kColWarps) {
      A v[kBatch][NAcc];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
#pragma unroll
        for (int k = 0; k < NAcc; ++k) v[u][k] = partial[((c + u * kColWarps) * NAcc + k) * h + j];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
#pragma unroll
        for (int k = 0; k < NAcc; ++k) s[k] += v[u][k];
    }
    for (; c < nchunks; c += kColWarps)
#pragma unroll
      for (int k = 0; k < NAcc; ++k) s[k] += partial[(c * NAcc + k) * h + j];
  }
#pragma unroll
  for (int k = 0; k < NAcc; ++k) sh[warp][k][lane] = s[k];
  __syncthreads();
  if (warp != 0 || j >= h) return;
  A t[NAcc] = {};
  for (int w = 0; w < kColWarps; ++w)
#pragma unroll
    for (int k = 0; k < NAcc; ++k) t[k] += sh[w][k][lane];
  if (out0) out0[j] = from_acc<T>(t[0]);
  if constexpr (NAcc > 1)
    if (out1) out1[j] = from_acc<T>(t[1]);
}

template <class T, int NAcc>
void launch_column_sums(const acc_t<T>* partial, int64_t nchunks, int64_t h, T* out0, T* out1, cudaStream_t st) {
  const int64_t blocks = ceil_div(h, int64_t{32});
  MT_CHECK(blocks < (int64_t{1} << 31), "column sums: {} columns are too many for one launch", h);
  column_sums<T, NAcc><<<static_cast<unsigned>(blocks), 32 * kColWarps, 0, st>>>(partial, nchunks, h, out0, out1);
  MT_CUDA_LAUNCH_CHECK();
}

// ---- rms_norm ---------------------------------------------------------------------------------

template <class T, int N>
__global__ void rms_norm_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                             acc_t<T>* __restrict__ rstd, int64_t rows, int64_t h, double eps) {
  using A = acc_t<T>;
  __shared__ A red[32];
  const int64_t nv = h / N;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * h;
    T* yr = y + row * h;
    A ss = 0;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const A v = to_acc(a.v[e]);
        ss += v * v;
      }
    }
    ss = block_sum(ss, red);
    const A r = A(1) / sqrt((h ? ss / static_cast<A>(h) : A(0)) + static_cast<A>(eps));
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k);
      Vec<T, N> o;
      if (w) {
        const Vec<T, N> b = load_vec<T, N>(w, k);
#pragma unroll
        for (int e = 0; e < N; ++e) o.v[e] = from_acc<T>(to_acc(a.v[e]) * r * to_acc(b.v[e]));
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e) o.v[e] = from_acc<T>(to_acc(a.v[e]) * r);
      }
      store_vec<T, N>(yr, k, o);
    }
  }
}

// y = x * r * w:  gx = r * gy * w - x * r^3 / H * sum(gy * w * x);  gw = sum over rows gy * x * r.
// Block c handles rows [c * per, (c + 1) * per); with `partial`, it also writes
// partial[c][0][j] = sum over its rows of gy * x * r (each thread owns fixed columns).
template <class T, int N>
__global__ void rms_norm_bwd_rows(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ w,
                                  const acc_t<T>* __restrict__ rstd, T* __restrict__ gx, acc_t<T>* partial,
                                  int64_t rows, int64_t h, int64_t per, bool shared_acc, bool accumulate) {
  using A = acc_t<T>;
  __shared__ A red[32];
  extern __shared__ unsigned char smem_raw[];
  const int64_t nv = h / N;
  const int64_t r0 = blockIdx.x * per, r1 = min(rows, r0 + per);
  A* acc = nullptr;
  if (partial) {
    acc = shared_acc ? reinterpret_cast<A*>(smem_raw) : partial + blockIdx.x * h;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x)
#pragma unroll
      for (int e = 0; e < N; ++e) acc[k * N + e] = A(0);
  }
  for (int64_t row = r0; row < r1; ++row) {
    const T* xr = x + row * h;
    const T* gr = gy + row * h;
    T* gxr = gx + row * h;
    const A r = rstd[row];
    A dot = 0;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k), g = load_vec<T, N>(gr, k);
      Vec<T, N> b;
      if (w) b = load_vec<T, N>(w, k);
#pragma unroll
      for (int e = 0; e < N; ++e) dot += to_acc(g.v[e]) * (w ? to_acc(b.v[e]) : A(1)) * to_acc(a.v[e]);
    }
    dot = block_sum(dot, red);
    const A c = h ? r * r * r * dot / static_cast<A>(h) : A(0);
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k), g = load_vec<T, N>(gr, k);
      Vec<T, N> b, o;
      if (w) b = load_vec<T, N>(w, k);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const A xv = to_acc(a.v[e]), gv = to_acc(g.v[e]);
        o.v[e] = from_acc<T>(r * gv * (w ? to_acc(b.v[e]) : A(1)) - xv * c);
        if (acc) acc[k * N + e] += gv * xv * r;
      }
      store_grad<T, N>(gxr, k, o, accumulate);
    }
  }
  if (partial && shared_acc) {
    A* dst = partial + blockIdx.x * h;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x)
#pragma unroll
      for (int e = 0; e < N; ++e) dst[k * N + e] = acc[k * N + e];
  }
}

// rms_norm_bwd_rows with each thread's R vectors of a row held in registers: the next row's x
// and gy are loaded before this row's block reduction, so their latency hides behind it, and the
// weight-gradient terms add up in registers. The arithmetic and its order are those of
// rms_norm_bwd_rows (the same bits). Needs nv <= R * blockDim.x. R <= 2 keeps every dtype within
// 128 registers, so 512-thread blocks launch (R = 4 took over 200 for 16-bit types).
template <class T, int N, int R>
__global__ void __launch_bounds__(512) rms_norm_bwd_rows_reg(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ w,
                                      const acc_t<T>* __restrict__ rstd, T* __restrict__ gx, acc_t<T>* partial,
                                      int64_t rows, int64_t h, int64_t per, bool accumulate) {
  using A = acc_t<T>;
  __shared__ A red[32];
  const int64_t nv = h / N;
  const int64_t r0 = blockIdx.x * per, r1 = min(rows, r0 + per);
  Vec<T, N> xa[R], ga[R], wb[R];
  A acc[R][N];
#pragma unroll
  for (int u = 0; u < R; ++u) {
    const int64_t k = threadIdx.x + int64_t{u} * blockDim.x;
    if (w && k < nv) wb[u] = load_vec<T, N>(w, k);
#pragma unroll
    for (int e = 0; e < N; ++e) acc[u][e] = A(0);
  }
  auto load_row = [&](int64_t row, Vec<T, N>* xs, Vec<T, N>* gs) {
#pragma unroll
    for (int u = 0; u < R; ++u) {
      const int64_t k = threadIdx.x + int64_t{u} * blockDim.x;
      if (k < nv) {
        xs[u] = load_vec<T, N>(x + row * h, k);
        gs[u] = load_vec<T, N>(gy + row * h, k);
      }
    }
  };
  if (r0 < r1) load_row(r0, xa, ga);
  for (int64_t row = r0; row < r1; ++row) {
    Vec<T, N> xn[R], gn[R];
    if (row + 1 < r1) load_row(row + 1, xn, gn);
    const A r = rstd[row];
    A dot = 0;
#pragma unroll
    for (int u = 0; u < R; ++u) {
      if (threadIdx.x + int64_t{u} * blockDim.x >= nv) continue;
#pragma unroll
      for (int e = 0; e < N; ++e) dot += to_acc(ga[u].v[e]) * (w ? to_acc(wb[u].v[e]) : A(1)) * to_acc(xa[u].v[e]);
    }
    dot = block_sum(dot, red);
    const A c = h ? r * r * r * dot / static_cast<A>(h) : A(0);
#pragma unroll
    for (int u = 0; u < R; ++u) {
      const int64_t k = threadIdx.x + int64_t{u} * blockDim.x;
      if (k >= nv) continue;
      Vec<T, N> o;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const A xv = to_acc(xa[u].v[e]), gv = to_acc(ga[u].v[e]);
        o.v[e] = from_acc<T>(r * gv * (w ? to_acc(wb[u].v[e]) : A(1)) - xv * c);
        if (partial) acc[u][e] += gv * xv * r;
      }
      store_grad<T, N>(gx + row * h, k, o, accumulate);
    }
#pragma unroll
    for (int u = 0; u < R; ++u) {
      xa[u] = xn[u];
      ga[u] = gn[u];
    }
  }
  if (partial) {
    A* dst = partial + blockIdx.x * h;
#pragma unroll
    for (int u = 0; u < R; ++u) {
      const int64_t k = threadIdx.x + int64_t{u} * blockDim.x;
      if (k >= nv) continue;
#pragma unroll
      for (int e = 0; e < N; ++e) dst[k * N + e] = acc[u][e];
    }
  }
}

// Rows of at most 32 * V vectors (H <= 2048 for 16-bit types, 1024 for f32 at V = 8): one warp
// per row. The lane holds its V vectors of x and gy in registers, all loads issued together, and
// the row's dot product is a warp shuffle sum, so no block barrier orders the rows and a
// multiprocessor keeps about 4x as many rows in flight as rms_norm_bwd_rows_reg (ncu on that one:
// 23% warps active, stalled on loads). Each warp adds its rows' weight-gradient terms into its own
// slice of shared memory, 16 bytes per access: the slice is [N / G][nv][G] with G accumulators in
// 16 bytes, so a warp's lanes read and write consecutive 16-byte slots (no bank conflicts, a
// quarter of the shared-memory instructions of one access per term). At the chunk's end the block
// adds the slices in warp order. Same chunks as the other kernels: the summation order depends
// only on (rows, H).
constexpr int kRowWarps = 4;
template <class A, int N>
constexpr int kSlotGroup = N % (16 / sizeof(A)) == 0 ? static_cast<int>(16 / sizeof(A)) : 1;
// Index of vector k's element e in a slice of rms_norm_bwd_warp_rows.
template <class A, int N>
__device__ __forceinline__ int slot(int k, int e, int nv) {
  constexpr int G = kSlotGroup<A, N>;
  return ((e / G) * nv + k) * G + e % G;
}
template <class T, int N, int V>
__global__ void __launch_bounds__(32 * kRowWarps, 4) rms_norm_bwd_warp_rows(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ w,
                                       const acc_t<T>* __restrict__ rstd, T* __restrict__ gx, acc_t<T>* partial,
                                       int64_t rows, int64_t h, int64_t per, bool accumulate) {
  using A = acc_t<T>;
  extern __shared__ unsigned char smem_raw[];
  constexpr int G = kSlotGroup<A, N>;
  A* const slices = reinterpret_cast<A*>(smem_raw);  // [kRowWarps][N / G][nv][G] when partial
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nv = static_cast<int>(h / N);
  const int64_t r0 = blockIdx.x * per, r1 = min(rows, r0 + per);
  A* const mine = slices + warp * h;
  if (partial) {
    for (int i = lane; i < h; i += 32) mine[i] = A(0);
    __syncwarp();  // a lane zeroes entries that other lanes of its warp add to
  }
  for (int64_t row = r0 + warp; row < r1; row += kRowWarps) {
    Vec<T, N> xa[V], ga[V];
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const int k = lane + 32 * u;
      if (k < nv) {
        xa[u] = load_vec<T, N>(x + row * h, k);
        ga[u] = load_vec<T, N>(gy + row * h, k);
      }
    }
    const A r = rstd[row];
    A dot = 0;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const int k = lane + 32 * u;
      if (k >= nv) continue;
      Vec<T, N> b;
      if (w) b = load_vec<T, N>(w, k);
#pragma unroll
      for (int e = 0; e < N; ++e) dot += to_acc(ga[u].v[e]) * (w ? to_acc(b.v[e]) : A(1)) * to_acc(xa[u].v[e]);
    }
    dot = warp_sum(dot);
    const A c = h ? r * r * r * dot / static_cast<A>(h) : A(0);
#pragma unroll
    for (int u = 0; u < V; ++u) {
      forget_derived(xa[u]);
      forget_derived(ga[u]);
    }
    const T* w2 = w;  // the weights again from L1, not held in registers since the first pass
    asm volatile("" : "+l"(w2));
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const int k = lane + 32 * u;
      if (k >= nv) continue;
      Vec<T, N> b, o;
      if (w) b = load_vec<T, N>(w2, k);
      A t[N];
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const A xv = to_acc(xa[u].v[e]), gv = to_acc(ga[u].v[e]);
        o.v[e] = from_acc<T>(r * gv * (w ? to_acc(b.v[e]) : A(1)) - xv * c);
        t[e] = gv * xv * r;
      }
      store_grad<T, N>(gx + row * h, k, o, accumulate);
      if (partial) {
#pragma unroll
        for (int g = 0; g < N / G; ++g) {
          Vec<A, G>* sp = reinterpret_cast<Vec<A, G>*>(mine) + (g * nv + k);
          Vec<A, G> acc = *sp;
#pragma unroll
          for (int i = 0; i < G; ++i) acc.v[i] += t[g * G + i];
          *sp = acc;
        }
      }
    }
  }
  if (partial) {
    __syncthreads();
    A* dst = partial + blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
      const int k = i / N, e = i - k * N;  // column i is element e of vector k
      const int at = slot<A, N>(k, e, nv);
      A s = slices[at];
      for (int q = 1; q < kRowWarps; ++q) s += slices[q * h + at];
      dst[i] = s;
    }
  }
}

template <class T, int N>
void rms_norm_launch(const RmsNormParams& p, int64_t rows, int64_t h) {
  cudaStream_t st = cuda::current_stream();
  rms_norm_fwd<T, N><<<row_grid(rows), row_threads(h / N), 0, st>>>(
      p.x.ptr<const T>(), p.weight ? p.weight.ptr<const T>() : nullptr, p.out.ptr<T>(), p.rstd.ptr<acc_t<T>>(), rows,
      h, p.eps);
  MT_CUDA_LAUNCH_CHECK();
}

template <class T>
void rms_norm_typed(const RmsNormParams& p) {
  const auto [rows, h] = rows_of(p.x);
  if (rows == 0) return;
  const void* w = p.weight ? p.weight.data : nullptr;
  if (can_vectorize<T>(h, {p.x.data, w, p.out.data}))
    rms_norm_launch<T, kVec<T>>(p, rows, h);
  else
    rms_norm_launch<T, 1>(p, rows, h);
}

// MT_RMS_NORM_BWD=block keeps rows of up to 256 vectors on the block-per-row kernels (for A/B
// runs of bench_cuda; docs/cuda_kernels.md). Read once.
bool rms_norm_bwd_warp_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MT_RMS_NORM_BWD");
    return v == nullptr || std::string_view(v) != "block";
  }();
  return on;
}

template <class T, int N>
void rms_norm_bwd_launch(const RmsNormBwdParams& p, int64_t rows, int64_t h) {
  using A = acc_t<T>;
  cudaStream_t st = cuda::current_stream();
  const bool want_gw = static_cast<bool>(p.gw) && h > 0;
  const Chunks ch = chunks_of(rows, want_gw);
  StreamScratch scratch(want_gw ? static_cast<size_t>(ch.n * h) * sizeof(A) : 0);
  const bool shared_acc = want_gw && static_cast<size_t>(h) * sizeof(A) <= kSharedAccBytes;
  const size_t smem = shared_acc ? static_cast<size_t>(h) * sizeof(A) : 0;
  if (rows > 0) {
    const int threads = row_threads(h / N);
    const int64_t per_thread = ceil_div(h / N, int64_t{threads});
    const T* w = p.weight ? p.weight.ptr<const T>() : nullptr;
    auto reg = [&](auto r) {  // each thread's vectors of a row in registers (see the kernel)
      rms_norm_bwd_rows_reg<T, N, decltype(r)::value><<<static_cast<unsigned>(ch.n), threads, 0, st>>>(
          p.gy.ptr<const T>(), p.x.ptr<const T>(), w, p.rstd.ptr<const A>(), p.gx.ptr<T>(), scratch.as<A>(), rows,
          h, ch.per, p.accumulate);
    };
    // A warp per row (see the kernel); without weight gradients, 16 rows per block.
    auto warp_rows = [&](auto v) {
      const int64_t per = want_gw ? ch.per : 4 * kRowWarps;
      const int64_t blocks = want_gw ? ch.n : ceil_div(rows, per);
      MT_CHECK(blocks < (int64_t{1} << 31), "rms_norm backward: {} rows are too many for one launch", rows);
      const size_t slices = want_gw ? static_cast<size_t>(kRowWarps * h) * sizeof(A) : 0;
      rms_norm_bwd_warp_rows<T, N, decltype(v)::value><<<static_cast<unsigned>(blocks), 32 * kRowWarps, slices, st>>>(
          p.gy.ptr<const T>(), p.x.ptr<const T>(), w, p.rstd.ptr<const A>(), p.gx.ptr<T>(), scratch.as<A>(), rows,
          h, per, p.accumulate);
    };
    const int64_t nv = h / N;
    if (rms_norm_bwd_warp_enabled() && nv <= 32 * 8) {
      if (nv <= 32)
        warp_rows(std::integral_constant<int, 1>{});
      else if (nv <= 64)
        warp_rows(std::integral_constant<int, 2>{});
      else if (nv <= 128)
        warp_rows(std::integral_constant<int, 4>{});
      else
        warp_rows(std::integral_constant<int, 8>{});
    } else if (per_thread <= 1)
      reg(std::integral_constant<int, 1>{});
    else if (per_thread <= 2)
      reg(std::integral_constant<int, 2>{});
    else
      rms_norm_bwd_rows<T, N><<<static_cast<unsigned>(ch.n), threads, smem, st>>>(
          p.gy.ptr<const T>(), p.x.ptr<const T>(), w, p.rstd.ptr<const A>(), p.gx.ptr<T>(), scratch.as<A>(), rows, h,
          ch.per, shared_acc, p.accumulate);
    MT_CUDA_LAUNCH_CHECK();
  }
  if (p.gw && h > 0) launch_column_sums<T, 1>(scratch.as<A>(), ch.n, h, p.gw.ptr<T>(), nullptr, st);
}

template <class T>
void rms_norm_bwd_typed(const RmsNormBwdParams& p) {
  const auto [rows, h] = rows_of(p.x);
  const void* w = p.weight ? p.weight.data : nullptr;
  if (can_vectorize<T>(h, {p.x.data, p.gy.data, p.gx.data, w}))
    rms_norm_bwd_launch<T, kVec<T>>(p, rows, h);
  else
    rms_norm_bwd_launch<T, 1>(p, rows, h);
}

// ---- layer_norm -------------------------------------------------------------------------------

template <class T, int N>
__global__ void layer_norm_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                               T* __restrict__ y, acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out,
                               int64_t rows, int64_t h, double eps) {
  using A = acc_t<T>;
  __shared__ A red[32];
  const int64_t nv = h / N;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * h;
    T* yr = y + row * h;
    A sum = 0;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k);
#pragma unroll
      for (int e = 0; e < N; ++e) sum += to_acc(a.v[e]);
    }
    sum = block_sum(sum, red);
    const A mean = h ? sum / static_cast<A>(h) : A(0);
    A ss = 0;  // two passes, like the CPU: no cancellation in the variance
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const A d = to_acc(a.v[e]) - mean;
        ss += d * d;
      }
    }
    ss = block_sum(ss, red);
    const A r = A(1) / sqrt((h ? ss / static_cast<A>(h) : A(0)) + static_cast<A>(eps));
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = r;
    }
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k);
      Vec<T, N> wv, bv, o;
      if (w) wv = load_vec<T, N>(w, k);
      if (b) bv = load_vec<T, N>(b, k);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        A v = (to_acc(a.v[e]) - mean) * r;
        if (w) v *= to_acc(wv.v[e]);
        if (b) v += to_acc(bv.v[e]);
        o.v[e] = from_acc<T>(v);
      }
      store_vec<T, N>(yr, k, o);
    }
  }
}

// xhat = (x - mean) * r, y = xhat * w + b:
// gx = r * (gy*w - mean(gy*w) - xhat * mean(gy*w*xhat));  gw = sum gy*xhat;  gb = sum gy.
// partial[c][0][j] collects gy*xhat, partial[c][1][j] gy, over the rows of chunk c.
template <class T, int N>
__global__ void layer_norm_bwd_rows(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ w,
                                    const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                    T* __restrict__ gx, acc_t<T>* partial, int64_t rows, int64_t h, int64_t per,
                                    bool shared_acc) {
  using A = acc_t<T>;
  __shared__ A red[32];
  extern __shared__ unsigned char smem_raw[];
  const int64_t nv = h / N;
  const int64_t r0 = blockIdx.x * per, r1 = min(rows, r0 + per);
  A* acc = nullptr;  // [2][h]
  if (partial) {
    acc = shared_acc ? reinterpret_cast<A*>(smem_raw) : partial + blockIdx.x * 2 * h;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x)
#pragma unroll
      for (int e = 0; e < N; ++e) acc[k * N + e] = acc[h + k * N + e] = A(0);
  }
  const A inv_h = h ? A(1) / static_cast<A>(h) : A(0);
  for (int64_t row = r0; row < r1; ++row) {
    const T* xr = x + row * h;
    const T* gr = gy + row * h;
    T* gxr = gx + row * h;
    const A m = mean[row], r = rstd[row];
    A s1 = 0, s2 = 0;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k), g = load_vec<T, N>(gr, k);
      Vec<T, N> b;
      if (w) b = load_vec<T, N>(w, k);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const A gw = to_acc(g.v[e]) * (w ? to_acc(b.v[e]) : A(1));
        s1 += gw;
        s2 += gw * (to_acc(a.v[e]) - m) * r;
      }
    }
    s1 = block_sum(s1, red) * inv_h;
    s2 = block_sum(s2, red) * inv_h;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k), g = load_vec<T, N>(gr, k);
      Vec<T, N> b, o;
      if (w) b = load_vec<T, N>(w, k);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const A gv = to_acc(g.v[e]);
        const A gw = gv * (w ? to_acc(b.v[e]) : A(1));
        const A xh = (to_acc(a.v[e]) - m) * r;
        o.v[e] = from_acc<T>(r * (gw - s1 - xh * s2));
        if (acc) {
          acc[k * N + e] += gv * xh;
          acc[h + k * N + e] += gv;
        }
      }
      store_vec<T, N>(gxr, k, o);
    }
  }
  if (partial && shared_acc) {
    A* dst = partial + blockIdx.x * 2 * h;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x)
#pragma unroll
      for (int e = 0; e < N; ++e) {
        dst[k * N + e] = acc[k * N + e];
        dst[h + k * N + e] = acc[h + k * N + e];
      }
  }
}

template <class T, int N>
void layer_norm_launch(const LayerNormParams& p, int64_t rows, int64_t h) {
  cudaStream_t st = cuda::current_stream();
  layer_norm_fwd<T, N><<<row_grid(rows), row_threads(h / N), 0, st>>>(
      p.x.ptr<const T>(), p.weight ? p.weight.ptr<const T>() : nullptr, p.bias ? p.bias.ptr<const T>() : nullptr,
      p.out.ptr<T>(), p.mean.ptr<acc_t<T>>(), p.rstd.ptr<acc_t<T>>(), rows, h, p.eps);
  MT_CUDA_LAUNCH_CHECK();
}

template <class T>
void layer_norm_typed(const LayerNormParams& p) {
  const auto [rows, h] = rows_of(p.x);
  if (rows == 0) return;
  const void* w = p.weight ? p.weight.data : nullptr;
  const void* b = p.bias ? p.bias.data : nullptr;
  if (can_vectorize<T>(h, {p.x.data, w, b, p.out.data}))
    layer_norm_launch<T, kVec<T>>(p, rows, h);
  else
    layer_norm_launch<T, 1>(p, rows, h);
}

template <class T, int N>
void layer_norm_bwd_launch(const LayerNormBwdParams& p, int64_t rows, int64_t h) {
  using A = acc_t<T>;
  cudaStream_t st = cuda::current_stream();
  const bool want = (p.gw || p.gb) && h > 0;
  const Chunks ch = chunks_of(rows, want);
  StreamScratch scratch(want ? static_cast<size_t>(ch.n * 2 * h) * sizeof(A) : 0);
  const bool shared_acc = want && static_cast<size_t>(2 * h) * sizeof(A) <= kSharedAccBytes;
  const size_t smem = shared_acc ? static_cast<size_t>(2 * h) * sizeof(A) : 0;
  if (rows > 0) {
    layer_norm_bwd_rows<T, N><<<static_cast<unsigned>(ch.n), row_threads(h / N), smem, st>>>(
        p.gy.ptr<const T>(), p.x.ptr<const T>(), p.weight ? p.weight.ptr<const T>() : nullptr,
        p.mean.ptr<const A>(), p.rstd.ptr<const A>(), p.gx.ptr<T>(), scratch.as<A>(), rows, h, ch.per, shared_acc);
    MT_CUDA_LAUNCH_CHECK();
  }
  if (want)
    launch_column_sums<T, 2>(scratch.as<A>(), ch.n, h, p.gw ? p.gw.ptr<T>() : nullptr,
                             p.gb ? p.gb.ptr<T>() : nullptr, st);
}

template <class T>
void layer_norm_bwd_typed(const LayerNormBwdParams& p) {
  const auto [rows, h] = rows_of(p.x);
  const void* w = p.weight ? p.weight.data : nullptr;
  if (can_vectorize<T>(h, {p.x.data, p.gy.data, p.gx.data, w}))
    layer_norm_bwd_launch<T, kVec<T>>(p, rows, h);
  else
    layer_norm_bwd_launch<T, 1>(p, rows, h);
}

// ---- softmax ----------------------------------------------------------------------------------

// One read for the online (max, sum) and one for the output, however long the row.
template <class T, int N>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t h, bool log_out) {
  using A = acc_t<T>;
  __shared__ A shm[32], shs[32];
  const int64_t nv = h / N;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * h;
    T* yr = y + row * h;
    A m = -INFINITY, s = 0;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k);
      A vm = to_acc(a.v[0]);
#pragma unroll
      for (int e = 1; e < N; ++e) vm = max(vm, to_acc(a.v[e]));
      if (vm > m) {
        s = m == -INFINITY ? A(0) : s * exp(m - vm);
        m = vm;
      }
      if (m != -INFINITY)
#pragma unroll
        for (int e = 0; e < N; ++e) s += exp(to_acc(a.v[e]) - m);
      else if (vm != vm)  // NaN: poison the row like the CPU does
        m = vm;
    }
    block_max_sum(m, s, shm, shs);
    const A lse = m + log(s), inv = A(1) / s;
    for (int64_t k = threadIdx.x; k < nv; k += blockDim.x) {
      const Vec<T, N> a = load_vec<T, N>(xr, k);
      Vec<T, N> o;
#pragma unroll
      for (int e = 0; e < N; ++e) o.v[e] = from_acc<T>(log_out ? to_acc(a.v[e]) - lse : exp(to_acc(a.v[e]) - m) * inv);
      store_vec<T, N>(yr, k, o);
    }
  }
}

template <class T>
void softmax_typed(const SoftmaxParams& p) {
  const auto [rows, h] = rows_of(p.in);
  if (rows == 0 || h == 0) return;
  cudaStream_t st = cuda::current_stream();
  if (can_vectorize<T>(h, {p.in.data, p.out.data})) {
    constexpr int N = kVec<T>;
    softmax_rows<T, N><<<row_grid(rows), row_threads(h / N), 0, st>>>(p.in.ptr<const T>(), p.out.ptr<T>(), rows, h,
                                                                      p.log);
  } else {
    softmax_rows<T, 1><<<row_grid(rows), row_threads(h), 0, st>>>(p.in.ptr<const T>(), p.out.ptr<T>(), rows, h, p.log);
  }
  MT_CUDA_LAUNCH_CHECK();
}

void rms_norm(const RmsNormParams& p) { MT_CUDA_DISPATCH_FLOAT(p.x.dtype, "rms_norm", { rms_norm_typed<scalar_t>(p); }); }
void rms_norm_bwd(const RmsNormBwdParams& p) {
  MT_CUDA_DISPATCH_FLOAT(p.x.dtype, "rms_norm_bwd", { rms_norm_bwd_typed<scalar_t>(p); });
}
void layer_norm(const LayerNormParams& p) {
  MT_CUDA_DISPATCH_FLOAT(p.x.dtype, "layer_norm", { layer_norm_typed<scalar_t>(p); });
}
void layer_norm_bwd(const LayerNormBwdParams& p) {
  MT_CUDA_DISPATCH_FLOAT(p.x.dtype, "layer_norm_bwd", { layer_norm_bwd_typed<scalar_t>(p); });
}
void softmax(const SoftmaxParams& p) { MT_CUDA_DISPATCH_FLOAT(p.in.dtype, "softmax", { softmax_typed<scalar_t>(p); }); }

}  // namespace

void register_cuda_norm(KernelTable& t) {
  t.rms_norm = rms_norm;
  t.rms_norm_bwd = rms_norm_bwd;
  t.layer_norm = layer_norm;
  t.layer_norm_bwd = layer_norm_bwd;
  t.softmax = softmax;
}

}  // namespace mt
