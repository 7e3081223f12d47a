// Causal scaled dot-product attention with grouped kv heads on CUDA, flash-attention style,
// mirroring kernels/cpu/attention.cpp (f32 and f64; the front end casts 16-bit inputs to f32).
// Forward: a block owns BR query rows of one head, keeps Q in shared memory and walks the key
// tiles (BC keys) with an online softmax: S = Q K^T for the tile, running max / sum per row,
// O rescaled and accumulated from P V. Only the per-row lse is written; no [T, S] matrix exists.
// Backward (FlashAttention-2 split, deterministic, no atomics), probabilities rebuilt from lse:
//   1. Di = rowsum(dO * O) per query row (small scratch);
//   2. one block per (kv head, key tile) accumulates dK and dV in registers over every query
//      head of its group and every query tile, in a fixed order;
//   3. one block per (query head, query tile) accumulates dQ over the key tiles.
// Tiles are SIMT (no tensor cores): a 16 x 16 thread grid, each thread owning a micro-tile of
// rows ty + 16 i and columns tx + 16 j, so row reductions are 16-lane shuffles within a warp.
// Shared rows are padded by one element against bank conflicts. Head dims D, Dv <= 128.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {
namespace {

constexpr int kThreads = 256;  // 16 x 16
constexpr int kMaxHeadDim = 128;

// Tile sizes per dtype: f64 halves them to stay within shared memory.
template <class T>
struct Tiles {
  static constexpr int kFwdBr = 64, kFwdBc = 64;  // forward
  static constexpr int kKvBr = 32, kKvBc = 64;    // dK/dV: queries per step, keys per block
  static constexpr int kQBr = 64, kQBc = 32;      // dQ: queries per block, keys per step
};
template <>
struct Tiles<double> {
  static constexpr int kFwdBr = 32, kFwdBc = 32;
  static constexpr int kKvBr = 32, kKvBc = 32;
  static constexpr int kQBr = 32, kQBc = 32;
};

struct Dims {
  int64_t B, Hq, Hkv, T, S, group;
  int D, Dv;
  explicit Dims(const KView& q, const KView& v)
      : B(q.sizes[0]), Hq(q.sizes[1]), Hkv(v.sizes[1]), T(q.sizes[2]), S(v.sizes[2]), group(q.sizes[1] / v.sizes[1]),
        D(static_cast<int>(q.sizes[3])), Dv(static_cast<int>(v.sizes[3])) {}
};

// dst[r][c] (row pitch DM + 1) = src[(row0 + r) * ncols + c], zero outside [nrows) x [ncols).
template <class T, int ROWS, int DM>
__device__ __forceinline__ void load_tile(T* dst, const T* __restrict__ src, int64_t row0, int64_t nrows, int ncols) {
  for (int e = threadIdx.x; e < ROWS * DM; e += kThreads) {
    const int r = e / DM, c = e % DM;
    const int64_t gr = row0 + r;
    dst[r * (DM + 1) + c] = (gr < nrows && c < ncols) ? src[gr * ncols + c] : T(0);
  }
}

// Reductions over the 16 lanes sharing a ty (one half of a warp).
template <class T>
__device__ __forceinline__ T max16(T v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <class T>
__device__ __forceinline__ T sum16(T v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Is key s visible to query t? (s < S and t < T checked too.)
__device__ __forceinline__ bool visible(int64_t t, int64_t s, int64_t T, int64_t S, bool causal) {
  return t < T && s < S && (!causal || s <= t + (S - T));
}

template <class T>
size_t set_smem(const void* kernel, size_t bytes) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return bytes;
}

// ---- forward ----------------------------------------------------------------------------------

template <class T, int BR, int BC, int DM>
__global__ void __launch_bounds__(kThreads) attn_fwd(const T* __restrict__ q, const T* __restrict__ k,
                                                     const T* __restrict__ v, T* __restrict__ out,
                                                     T* __restrict__ lse, Dims dm, int64_t ntiles, T scale,
                                                     bool causal) {
  constexpr int DP = DM + 1, PP = BC + 1, RI = BR / 16, RJ = BC / 16, CJ = DM / 16;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  T* Qs = reinterpret_cast<T*>(attn_smem);  // [BR][DP]
  T* KVs = Qs + BR * DP;                       // [BC][DP], K then V
  T* Ps = KVs + BC * DP;                       // [BR][PP]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  // Heaviest (last, for causal) query tiles first.
  const int64_t tile = ntiles - 1 - blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
  const int64_t kvh = (bh / dm.Hq) * dm.Hkv + (bh % dm.Hq) / dm.group;
  const int64_t t0 = tile * BR;
  const T* qh = q + bh * dm.T * dm.D;
  const T* kh = k + kvh * dm.S * dm.D;
  const T* vh = v + kvh * dm.S * dm.Dv;
  load_tile<T, BR, DM>(Qs, qh, t0, dm.T, dm.D);

  T m[RI], l[RI], o[RI][CJ];
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    m[i] = -INFINITY;
    l[i] = 0;
#pragma unroll
    for (int c = 0; c < CJ; ++c) o[i][c] = 0;
  }
  const int64_t kend = causal ? min(dm.S, t0 + BR + (dm.S - dm.T)) : dm.S;
  for (int64_t s0 = 0; s0 < kend; s0 += BC) {
    __syncthreads();  // previous V tile no longer read; Q tile stored (first pass)
    load_tile<T, BC, DM>(KVs, kh, s0, dm.S, dm.D);
    __syncthreads();
    T sc[RI][RJ];
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < RJ; ++j) sc[i][j] = 0;
#pragma unroll 4
    for (int d = 0; d < dm.D; ++d) {
      T qv[RI], kv[RJ];
#pragma unroll
      for (int i = 0; i < RI; ++i) qv[i] = Qs[(ty + 16 * i) * DP + d];
#pragma unroll
      for (int j = 0; j < RJ; ++j) kv[j] = KVs[(tx + 16 * j) * DP + d];
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int j = 0; j < RJ; ++j) sc[i][j] += qv[i] * kv[j];
    }
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      const int64_t t = t0 + ty + 16 * i;
      T rmax = -INFINITY;
#pragma unroll
      for (int j = 0; j < RJ; ++j) {
        const int64_t s = s0 + tx + 16 * j;
        sc[i][j] = visible(t, s, dm.T, dm.S, causal) ? sc[i][j] * scale : T(-INFINITY);
        rmax = max(rmax, sc[i][j]);
      }
      const T mnew = max(m[i], max16(rmax));
      const T alpha = mnew == T(-INFINITY) ? T(1) : exp(m[i] - mnew);
      T rsum = 0;
#pragma unroll
      for (int j = 0; j < RJ; ++j) {
        const T p = mnew == T(-INFINITY) ? T(0) : exp(sc[i][j] - mnew);
        Ps[(ty + 16 * i) * PP + tx + 16 * j] = p;
        rsum += p;
      }
      l[i] = l[i] * alpha + sum16(rsum);
      m[i] = mnew;
#pragma unroll
      for (int c = 0; c < CJ; ++c) o[i][c] *= alpha;
    }
    __syncthreads();  // K no longer read; P complete
    load_tile<T, BC, DM>(KVs, vh, s0, dm.S, dm.Dv);
    __syncthreads();
#pragma unroll 2
    for (int s = 0; s < BC; ++s) {
      T pv[RI], vv[CJ];
#pragma unroll
      for (int i = 0; i < RI; ++i) pv[i] = Ps[(ty + 16 * i) * PP + s];
#pragma unroll
      for (int c = 0; c < CJ; ++c) vv[c] = KVs[s * DP + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int c = 0; c < CJ; ++c) o[i][c] += pv[i] * vv[c];
    }
  }
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const int64_t t = t0 + ty + 16 * i;
    if (t >= dm.T) continue;
    const int64_t row = bh * dm.T + t;
    const bool any = l[i] > T(0);  // no visible key: zero output, lse -inf (like the CPU)
    const T inv = any ? T(1) / l[i] : T(0);
#pragma unroll
    for (int c = 0; c < CJ; ++c) {
      const int col = tx + 16 * c;
      if (col < dm.Dv) out[row * dm.Dv + col] = o[i][c] * inv;
    }
    if (tx == 0) lse[row] = any ? m[i] + log(l[i]) : T(-INFINITY);
  }
}

template <class T, int DM>
void attention_launch(const AttentionParams& p, const Dims& dm) {
  constexpr int BR = Tiles<T>::kFwdBr, BC = Tiles<T>::kFwdBc;
  const int64_t ntiles = ceil_div(dm.T, BR);
  const int64_t blocks = ntiles * dm.B * dm.Hq;
  MT_CHECK(blocks < (int64_t{1} << 31), "attention: too many query tiles ({}) for one launch", blocks);
  auto kernel = attn_fwd<T, BR, BC, DM>;
  const size_t smem = set_smem<T>(reinterpret_cast<const void*>(kernel),
                                  sizeof(T) * (BR * (DM + 1) + BC * (DM + 1) + BR * (BC + 1)));
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, cuda::current_stream()>>>(
      p.q.ptr<const T>(), p.k.ptr<const T>(), p.v.ptr<const T>(), p.out.ptr<T>(), p.lse.ptr<T>(), dm, ntiles,
      static_cast<T>(p.scale), p.causal);
  MT_CUDA_LAUNCH_CHECK();
}

// ---- backward ---------------------------------------------------------------------------------

// di[row] = sum_c gout[row, c] * out[row, c]; one warp per row.
template <class T>
__global__ void attn_bwd_di(const T* __restrict__ gout, const T* __restrict__ out, T* __restrict__ di, int64_t rows,
                            int Dv) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; r < rows;
       r += (int64_t{gridDim.x} * blockDim.x) >> 5) {
    T s = 0;
    for (int c = lane; c < Dv; c += 32) s += gout[r * Dv + c] * out[r * Dv + c];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) di[r] = s;
  }
}

// Block: keys [s0, s0 + BC) of one kv head. Thread owns key rows ty + 16 i and, for the score
// micro-tile, query columns tx + 16 j of the current query tile.
template <class T, int BR, int BC, int DM>
__global__ void __launch_bounds__(kThreads) attn_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k,
                                                          const T* __restrict__ v, const T* __restrict__ lse,
                                                          const T* __restrict__ gout, const T* __restrict__ di,
                                                          T* __restrict__ gk, T* __restrict__ gv, Dims dm,
                                                          int64_t nktiles, T scale, bool causal) {
  constexpr int DP = DM + 1, PP = BC + 1, RI = BC / 16, QJ = BR / 16, CJ = DM / 16;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  T* Ks = reinterpret_cast<T*>(attn_smem);  // [BC][DP]
  T* Vs = Ks + BC * DP;                        // [BC][DP]
  T* Qs = Vs + BC * DP;                        // [BR][DP]
  T* dOs = Qs + BR * DP;                       // [BR][DP]
  T* Ps = dOs + BR * DP;                       // [BR][PP]  (query-major)
  T* dSs = Ps + BR * PP;                       // [BR][PP]
  T* lse_s = dSs + BR * PP;                    // [BR]
  T* di_s = lse_s + BR;                        // [BR]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t kt = blockIdx.x % nktiles, bkv = blockIdx.x / nktiles;  // bkv = b * Hkv + hk
  const int64_t b = bkv / dm.Hkv, hk = bkv % dm.Hkv;
  const int64_t s0 = kt * BC;
  load_tile<T, BC, DM>(Ks, k + bkv * dm.S * dm.D, s0, dm.S, dm.D);
  load_tile<T, BC, DM>(Vs, v + bkv * dm.S * dm.Dv, s0, dm.S, dm.Dv);

  T dk[RI][CJ], dv[RI][CJ];
#pragma unroll
  for (int i = 0; i < RI; ++i)
#pragma unroll
    for (int c = 0; c < CJ; ++c) dk[i][c] = dv[i][c] = 0;

  // First query that sees key s0: t >= s0 - (S - T).
  const int64_t tfirst = causal ? max(int64_t{0}, s0 - (dm.S - dm.T)) : int64_t{0};
  const int64_t tstart = (tfirst / BR) * BR;
  for (int64_t h = hk * dm.group; h < (hk + 1) * dm.group; ++h) {
    const int64_t bh = b * dm.Hq + h;
    const T* qh = q + bh * dm.T * dm.D;
    const T* gh = gout + bh * dm.T * dm.Dv;
    for (int64_t t0 = tstart; t0 < dm.T; t0 += BR) {
      __syncthreads();  // previous tile's Q, dO, P, dS no longer read
      load_tile<T, BR, DM>(Qs, qh, t0, dm.T, dm.D);
      load_tile<T, BR, DM>(dOs, gh, t0, dm.T, dm.Dv);
      for (int r = threadIdx.x; r < BR; r += kThreads) {
        const int64_t t = t0 + r;
        lse_s[r] = t < dm.T ? lse[bh * dm.T + t] : T(0);
        di_s[r] = t < dm.T ? di[bh * dm.T + t] : T(0);
      }
      __syncthreads();
      T sc[RI][QJ], dp[RI][QJ];
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int j = 0; j < QJ; ++j) sc[i][j] = dp[i][j] = 0;
#pragma unroll 4
      for (int d = 0; d < dm.D; ++d) {
        T kv[RI], qv[QJ];
#pragma unroll
        for (int i = 0; i < RI; ++i) kv[i] = Ks[(ty + 16 * i) * DP + d];
#pragma unroll
        for (int j = 0; j < QJ; ++j) qv[j] = Qs[(tx + 16 * j) * DP + d];
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
          for (int j = 0; j < QJ; ++j) sc[i][j] += kv[i] * qv[j];
      }
#pragma unroll 4
      for (int d = 0; d < dm.Dv; ++d) {
        T vv[RI], ov[QJ];
#pragma unroll
        for (int i = 0; i < RI; ++i) vv[i] = Vs[(ty + 16 * i) * DP + d];
#pragma unroll
        for (int j = 0; j < QJ; ++j) ov[j] = dOs[(tx + 16 * j) * DP + d];
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
          for (int j = 0; j < QJ; ++j) dp[i][j] += vv[i] * ov[j];
      }
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int j = 0; j < QJ; ++j) {
          const int kr = ty + 16 * i, qc = tx + 16 * j;
          const bool ok = visible(t0 + qc, s0 + kr, dm.T, dm.S, causal);
          const T p = ok ? exp(sc[i][j] * scale - lse_s[qc]) : T(0);
          Ps[qc * PP + kr] = p;
          dSs[qc * PP + kr] = p * (dp[i][j] - di_s[qc]);
        }
      __syncthreads();
#pragma unroll 2
      for (int r = 0; r < BR; ++r) {
        T pv[RI], sv[RI], ov[CJ], qv[CJ];
#pragma unroll
        for (int i = 0; i < RI; ++i) {
          pv[i] = Ps[r * PP + ty + 16 * i];
          sv[i] = dSs[r * PP + ty + 16 * i];
        }
#pragma unroll
        for (int c = 0; c < CJ; ++c) {
          ov[c] = dOs[r * DP + tx + 16 * c];
          qv[c] = Qs[r * DP + tx + 16 * c];
        }
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
          for (int c = 0; c < CJ; ++c) {
            dv[i][c] += pv[i] * ov[c];
            dk[i][c] += sv[i] * qv[c];
          }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const int64_t s = s0 + ty + 16 * i;
    if (s >= dm.S) continue;
#pragma unroll
    for (int c = 0; c < CJ; ++c) {
      const int col = tx + 16 * c;
      if (col < dm.D) gk[(bkv * dm.S + s) * dm.D + col] = dk[i][c] * scale;
      if (col < dm.Dv) gv[(bkv * dm.S + s) * dm.Dv + col] = dv[i][c];
    }
  }
}

// Block: queries [t0, t0 + BR) of one query head. Thread owns query rows ty + 16 i and, for the
// score micro-tile, key columns tx + 16 j of the current key tile.
template <class T, int BR, int BC, int DM>
__global__ void __launch_bounds__(kThreads) attn_bwd_dq(const T* __restrict__ q, const T* __restrict__ k,
                                                        const T* __restrict__ v, const T* __restrict__ lse,
                                                        const T* __restrict__ gout, const T* __restrict__ di,
                                                        T* __restrict__ gq, Dims dm, int64_t ntiles, T scale,
                                                        bool causal) {
  constexpr int DP = DM + 1, PP = BC + 1, RI = BR / 16, KJ = BC / 16, CJ = DM / 16;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  T* Qs = reinterpret_cast<T*>(attn_smem);  // [BR][DP]
  T* dOs = Qs + BR * DP;                       // [BR][DP]
  T* Ks = dOs + BR * DP;                       // [BC][DP]
  T* Vs = Ks + BC * DP;                        // [BC][DP]
  T* dSs = Vs + BC * DP;                       // [BR][PP]
  T* lse_s = dSs + BR * PP;                    // [BR]
  T* di_s = lse_s + BR;                        // [BR]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t tile = ntiles - 1 - blockIdx.x % ntiles, bh = blockIdx.x / ntiles;
  const int64_t kvh = (bh / dm.Hq) * dm.Hkv + (bh % dm.Hq) / dm.group;
  const int64_t t0 = tile * BR;
  load_tile<T, BR, DM>(Qs, q + bh * dm.T * dm.D, t0, dm.T, dm.D);
  load_tile<T, BR, DM>(dOs, gout + bh * dm.T * dm.Dv, t0, dm.T, dm.Dv);
  for (int r = threadIdx.x; r < BR; r += kThreads) {
    const int64_t t = t0 + r;
    lse_s[r] = t < dm.T ? lse[bh * dm.T + t] : T(0);
    di_s[r] = t < dm.T ? di[bh * dm.T + t] : T(0);
  }
  const T* kh = k + kvh * dm.S * dm.D;
  const T* vh = v + kvh * dm.S * dm.Dv;

  T dq[RI][CJ];
#pragma unroll
  for (int i = 0; i < RI; ++i)
#pragma unroll
    for (int c = 0; c < CJ; ++c) dq[i][c] = 0;

  const int64_t kend = causal ? min(dm.S, t0 + BR + (dm.S - dm.T)) : dm.S;
  for (int64_t s0 = 0; s0 < kend; s0 += BC) {
    __syncthreads();  // previous K and dS no longer read; Q, dO, lse, di stored (first pass)
    load_tile<T, BC, DM>(Ks, kh, s0, dm.S, dm.D);
    load_tile<T, BC, DM>(Vs, vh, s0, dm.S, dm.Dv);
    __syncthreads();
    T sc[RI][KJ], dp[RI][KJ];
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < KJ; ++j) sc[i][j] = dp[i][j] = 0;
#pragma unroll 4
    for (int d = 0; d < dm.D; ++d) {
      T qv[RI], kv[KJ];
#pragma unroll
      for (int i = 0; i < RI; ++i) qv[i] = Qs[(ty + 16 * i) * DP + d];
#pragma unroll
      for (int j = 0; j < KJ; ++j) kv[j] = Ks[(tx + 16 * j) * DP + d];
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int j = 0; j < KJ; ++j) sc[i][j] += qv[i] * kv[j];
    }
#pragma unroll 4
    for (int d = 0; d < dm.Dv; ++d) {
      T ov[RI], vv[KJ];
#pragma unroll
      for (int i = 0; i < RI; ++i) ov[i] = dOs[(ty + 16 * i) * DP + d];
#pragma unroll
      for (int j = 0; j < KJ; ++j) vv[j] = Vs[(tx + 16 * j) * DP + d];
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int j = 0; j < KJ; ++j) dp[i][j] += ov[i] * vv[j];
    }
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < KJ; ++j) {
        const int qr = ty + 16 * i, kc = tx + 16 * j;
        const bool ok = visible(t0 + qr, s0 + kc, dm.T, dm.S, causal);
        const T p = ok ? exp(sc[i][j] * scale - lse_s[qr]) : T(0);
        dSs[qr * PP + kc] = p * (dp[i][j] - di_s[qr]);
      }
    __syncthreads();
#pragma unroll 2
    for (int s = 0; s < BC; ++s) {
      T sv[RI], kv[CJ];
#pragma unroll
      for (int i = 0; i < RI; ++i) sv[i] = dSs[(ty + 16 * i) * PP + s];
#pragma unroll
      for (int c = 0; c < CJ; ++c) kv[c] = Ks[s * DP + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int c = 0; c < CJ; ++c) dq[i][c] += sv[i] * kv[c];
    }
  }
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const int64_t t = t0 + ty + 16 * i;
    if (t >= dm.T) continue;
#pragma unroll
    for (int c = 0; c < CJ; ++c) {
      const int col = tx + 16 * c;
      if (col < dm.D) gq[(bh * dm.T + t) * dm.D + col] = dq[i][c] * scale;
    }
  }
}

template <class T, int DM>
void attention_bwd_launch(const AttentionBwdParams& p, const Dims& dm) {
  cudaStream_t st = cuda::current_stream();
  const int64_t rows = dm.B * dm.Hq * dm.T;
  StreamScratch di(static_cast<size_t>(rows) * sizeof(T));
  if (rows > 0) {
    attn_bwd_di<T><<<grid_for(rows * 32), 256, 0, st>>>(p.gout.ptr<const T>(), p.out.ptr<const T>(), di.as<T>(), rows,
                                                        dm.Dv);
    MT_CUDA_LAUNCH_CHECK();
  }
  const T scale = static_cast<T>(p.scale);
  {
    constexpr int BR = Tiles<T>::kKvBr, BC = Tiles<T>::kKvBc;
    const int64_t nkt = ceil_div(dm.S, BC);
    const int64_t blocks = nkt * dm.B * dm.Hkv;
    MT_CHECK(blocks < (int64_t{1} << 31), "attention_bwd: too many key tiles ({}) for one launch", blocks);
    if (blocks > 0) {
      auto kernel = attn_bwd_dkdv<T, BR, BC, DM>;
      const size_t smem =
          set_smem<T>(reinterpret_cast<const void*>(kernel),
                      sizeof(T) * (2 * BC * (DM + 1) + 2 * BR * (DM + 1) + 2 * BR * (BC + 1) + 2 * BR));
      kernel<<<static_cast<unsigned>(blocks), kThreads, smem, st>>>(
          p.q.ptr<const T>(), p.k.ptr<const T>(), p.v.ptr<const T>(), p.lse.ptr<const T>(), p.gout.ptr<const T>(),
          di.as<const T>(), p.gk.ptr<T>(), p.gv.ptr<T>(), dm, nkt, scale, p.causal);
      MT_CUDA_LAUNCH_CHECK();
    }
  }
  {
    constexpr int BR = Tiles<T>::kQBr, BC = Tiles<T>::kQBc;
    const int64_t ntiles = ceil_div(dm.T, BR);
    const int64_t blocks = ntiles * dm.B * dm.Hq;
    MT_CHECK(blocks < (int64_t{1} << 31), "attention_bwd: too many query tiles ({}) for one launch", blocks);
    if (blocks > 0) {
      auto kernel = attn_bwd_dq<T, BR, BC, DM>;
      const size_t smem = set_smem<T>(reinterpret_cast<const void*>(kernel),
                                      sizeof(T) * (2 * BR * (DM + 1) + 2 * BC * (DM + 1) + BR * (BC + 1) + 2 * BR));
      kernel<<<static_cast<unsigned>(blocks), kThreads, smem, st>>>(
          p.q.ptr<const T>(), p.k.ptr<const T>(), p.v.ptr<const T>(), p.lse.ptr<const T>(), p.gout.ptr<const T>(),
          di.as<const T>(), p.gq.ptr<T>(), dm, ntiles, scale, p.causal);
      MT_CUDA_LAUNCH_CHECK();
    }
  }
}

// Head-dim bucket: the kernels are compiled for D, Dv <= 64 and <= 128.
template <class F>
void with_head_dim(const char* op, const Dims& dm, F&& f) {
  const int dmax = std::max(dm.D, dm.Dv);
  MT_CHECK(dmax <= kMaxHeadDim, "{}: head dims D = {}, Dv = {} exceed {}, the most the cuda kernel supports", op,
           dm.D, dm.Dv, kMaxHeadDim);
  if (dmax <= 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}

template <class T>
void attention_typed(const AttentionParams& p) {
  const Dims dm(p.q, p.v);
  if (dm.B * dm.Hq * dm.T == 0) return;
  with_head_dim("attention", dm, [&](auto c) { attention_launch<T, decltype(c)::value>(p, dm); });
}

template <class T>
void attention_bwd_typed(const AttentionBwdParams& p) {
  const Dims dm(p.q, p.v);
  with_head_dim("attention_bwd", dm, [&](auto c) { attention_bwd_launch<T, decltype(c)::value>(p, dm); });
}

void attention(const AttentionParams& p) {
  switch (p.q.dtype) {
    case DType::kF64: attention_typed<double>(p); break;
    case DType::kF32: attention_typed<float>(p); break;
    case DType::kBF16:
    case DType::kF16: attention_tc(p); break;
    default: MT_FAIL("attention: cuda kernel dtype {} is not supported (f32, f64, bf16, f16)", dtype_name(p.q.dtype));
  }
}
void attention_bwd(const AttentionBwdParams& p) {
  switch (p.q.dtype) {
    case DType::kF64: attention_bwd_typed<double>(p); break;
    case DType::kF32: attention_bwd_typed<float>(p); break;
    case DType::kBF16:
    case DType::kF16: attention_tc_bwd(p); break;
    default:
      MT_FAIL("attention_bwd: cuda kernel dtype {} is not supported (f32, f64, bf16, f16)", dtype_name(p.q.dtype));
  }
}

}  // namespace

void register_cuda_attention(KernelTable& t) {
  t.attention = attention;
  t.attention_bwd = attention_bwd;
}

}  // namespace mt
