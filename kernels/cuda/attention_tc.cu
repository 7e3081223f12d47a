// Causal / full scaled dot-product attention with grouped kv heads for bf16 and f16 on tensor
// cores (sm_80+: mma.sync m16n8k16 with f32 accumulation, ldmatrix, cp.async double buffering).
// The f32/f64 kernels of attention.cu stay the reference; docs/cuda_kernels.md has the layout.
//
// Every kernel runs 4 warps; a warp owns 16 rows of the block's tile and computes its products
// with mma.sync, the A operand from shared memory or registers and the B operand from shared
// memory through ldmatrix (.trans where the operand is stored [k][n]). Shared rows hold the head
// dim padded to DM (64 or 128) plus 8 elements, so ldmatrix reads are free of bank conflicts.
//   forward: a block owns 64 query rows of one head and walks the key tiles (64 keys, loaded
//            one tile ahead) with an online softmax in the log2 domain; it writes O and the f32
//            per-row log-sum-exp;
//   backward (FlashAttention-2 split, deterministic: no atomics, fixed order):
//     di:   Di = rowsum(dO * O) in f32;
//     dkdv: a block owns 64 keys of one kv head and walks every query head of its group and
//           every query tile that sees its keys: P^T and dS^T from recomputed scores, then
//           dV += P^T dO and dK += dS^T Q;
//     dq:   a block owns 64 query rows of one head and walks the key tiles: dQ += dS K; it runs
//           on a second stream beside dkdv, which it does not depend on, and the caller's
//           stream waits for both.
// P and dS enter the second product of each pair rounded to the input dtype (as in
// FlashAttention-2); sums, the softmax statistics and every accumulator are f32.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <initializer_list>
#include <mutex>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/common.cuh"

namespace mt {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

struct Dims {
  int64_t B, Hq, Hkv, T, S, group, off;  // off = S - T: query t sees keys s <= t + off (causal)
  int D, Dv;
  Dims(const KView& q, const KView& v)
      : B(q.sizes[0]), Hq(q.sizes[1]), Hkv(v.sizes[1]), T(q.sizes[2]), S(v.sizes[2]), group(q.sizes[1] / v.sizes[1]),
        off(v.sizes[2] - q.sizes[2]), D(static_cast<int>(q.sizes[3])), Dv(static_cast<int>(v.sizes[3])) {}
};

// Strides (elements) of a [B, H, T, D] operand over B, H and T; D has stride 1. Contiguous
// [B, H, T, D] and the [B, T, H, D] storage that models transpose into it are both read in place.
struct Lay {
  int64_t b, h, t;
  explicit Lay(const KView& x) : b(x.strides[0]), h(x.strides[1]), t(x.strides[2]) {}
  template <class T>
  __device__ __forceinline__ T* head(T* base, int64_t bi, int64_t hi) const {
    return base + bi * b + hi * h;
  }
};

// ---- warp-level building blocks ------------------------------------------------------------------

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MT_TC_OK 1
#else
#define MT_TC_OK 0
#endif

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; bytes past src_bytes (0 or 16) are zero-filled.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
#if MT_TC_OK
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if MT_TC_OK
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if MT_TC_OK
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Four 8x8 16-bit matrices from shared memory; lane l gives the address of row l % 8 of matrix
// l / 8. Without .trans lane l receives (row l/4, cols 2(l%4), +1) of each; with .trans
// (rows 2(l%4), +1, col l/4).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
#if MT_TC_OK
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
#endif
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
#if MT_TC_OK
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
#endif
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// c (16x8, f32) += a (16x16, row) * b (16x8, col). Fragments (g = lane / 4, q = lane % 4):
// a[0] (row g, k 2q..2q+1), a[1] (row g+8, same k), a[2] (row g, k 2q+8..), a[3] (row g+8, k 2q+8..);
// b0 (k 2q..2q+1, col g), b1 (k 2q+8.., col g); c[0..1] (row g, cols 2q, 2q+1), c[2..3] (row g+8).
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if MT_TC_OK
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Addresses for ldsm_x4 over a row-major shared tile M with pitch P elements:
//  a_at:  the A fragment of the 16x16 block at (r0, c0);
//  bn_at: the B fragments of two n-tiles when B[k][n] = M[n][k] (M holds [n][k]): rows n0..n0+15,
//         cols k0..k0+15; registers 0-1 serve n-tile n0, 2-3 n-tile n0 + 8;
//  bt_at: with .trans, the B fragments of two n-tiles when B[k][n] = M[k][n]: rows k0..k0+15,
//         cols n0..n0+15; registers 0-1 serve n-tile n0, 2-3 n-tile n0 + 8.
template <int P, class T>
__device__ __forceinline__ const T* a_at(const T* M, int r0, int c0, int lane) {
  return M + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + c0 + (lane >> 4) * 8;
}
template <int P, class T>
__device__ __forceinline__ const T* bn_at(const T* M, int n0, int k0, int lane) {
  return M + (n0 + (lane & 7) + (lane >> 4) * 8) * P + k0 + ((lane >> 3) & 1) * 8;
}
template <int P, class T>
__device__ __forceinline__ const T* bt_at(const T* M, int k0, int n0, int lane) {
  return a_at<P>(M, k0, n0, lane);
}

// acc (16 x 8 NT) += A (16 x DM, rows r0.. of As) * Bs^T (Bs holds [n][k]: rows n0.., DM cols).
template <class T, int DM, int NT>
__device__ __forceinline__ void mma_nt(float (&acc)[NT][4], const T* As, int r0, const T* Bs, int n0, int lane) {
  constexpr int P = DM + 8;
#pragma unroll
  for (int ks = 0; ks < DM / 16; ++ks) {
    uint32_t a[4];
    ldsm_x4(a, a_at<P>(As, r0, ks * 16, lane));
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      ldsm_x4(b, bn_at<P>(Bs, n0 + np * 16, ks * 16, lane));
      mma<T>(acc[2 * np], a, b[0], b[1]);
      mma<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x DM) += A (16 x 16 KS, register fragments) * Bs (rows k0.. hold [k][n], DM cols).
template <class T, int DM, int KS>
__device__ __forceinline__ void mma_rt(float (&acc)[DM / 8][4], const uint32_t (&a)[KS][4], const T* Bs, int k0,
                                       int lane) {
  constexpr int P = DM + 8;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
#pragma unroll
    for (int np = 0; np < DM / 16; ++np) {
      uint32_t b[4];
      ldsm_x4_t(b, bt_at<P>(Bs, k0 + ks * 16, np * 16, lane));
      mma<T>(acc[2 * np], a[ks], b[0], b[1]);
      mma<T>(acc[2 * np + 1], a[ks], b[2], b[3]);
    }
}

// The A fragment (k-step kk) of a 16 x 8NT accumulator tile: k-step kk is n-tiles 2kk, 2kk+1.
template <class T, int NT>
__device__ __forceinline__ void to_a(uint32_t (&a)[NT / 2][4], const float (&c)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    a[n / 2][(n & 1) * 2] = pack2<T>(c[n][0], c[n][1]);
    a[n / 2][(n & 1) * 2 + 1] = pack2<T>(c[n][2], c[n][3]);
  }
}

// dst[r][c] (pitch DM + 8) = src[(row0 + r) * rs + c] for c < ncols (a multiple of 8), zero for
// other columns below DM and for rows >= nrows; 16-byte cp.async chunks (rs a multiple of 8).
template <class T, int ROWS, int DM>
__device__ __forceinline__ void load_async(T* dst, const T* __restrict__ src, int64_t row0, int64_t nrows,
                                           int ncols, int64_t rs) {
  constexpr int CH = DM / 8;
  for (int e = threadIdx.x; e < ROWS * CH; e += kThreads) {
    const int r = e / CH, c = (e % CH) * 8;
    const bool ok = row0 + r < nrows && c < ncols;
    cp_async16(dst + r * (DM + 8) + c, ok ? src + (row0 + r) * rs + c : src, ok ? 16 : 0);
  }
}

// Writes rows of a 16 x DM accumulator (warp rows r0 + g, r0 + g + 8 of a tile starting at
// global row row0, row stride rs) times mul as T, for rows < nrows and cols < ncols.
template <class T, int DM>
__device__ __forceinline__ void store_rows(T* __restrict__ dst, const float (&acc)[DM / 8][4], int64_t row0,
                                           int64_t nrows, int ncols, int64_t rs, const float (&mul)[2], int lane) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t r = row0 + g + 8 * i;
    if (r >= nrows) continue;
#pragma unroll
    for (int d = 0; d < DM / 8; ++d) {
      const int c = d * 8 + 2 * q;
      if (c < ncols)
        *reinterpret_cast<uint32_t*>(dst + r * rs + c) = pack2<T>(acc[d][2 * i] * mul[i], acc[d][2 * i + 1] * mul[i]);
    }
  }
}

// ---- forward --------------------------------------------------------------------------------------

constexpr int kFwdBr = 64, kFwdBc = 64;

template <class T, int DM>
__global__ void __launch_bounds__(kThreads) tc_fwd(const T* __restrict__ q, const T* __restrict__ k,
                                                   const T* __restrict__ v, T* __restrict__ out,
                                                   float* __restrict__ lse, Dims dm, Lay lq, Lay lk, Lay lv,
                                                   Lay lo, int64_t ntiles, float scale_log2, bool causal) {
  constexpr int BR = kFwdBr, BC = kFwdBc, P = DM + 8, KS = DM / 16, NS = BC / 8, NO = DM / 8;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  T* Qs = reinterpret_cast<T*>(tc_smem);  // [BR][P]
  T* Ks = Qs + BR * P;                     // [2][BC][P]
  T* Vs = Ks + 2 * BC * P;                 // [2][BC][P]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  // Heaviest (last, for causal) query tiles of every head first.
  const int64_t nbh = dm.B * dm.Hq;
  const int64_t tile = ntiles - 1 - blockIdx.x / nbh, bh = blockIdx.x % nbh;
  const int64_t b = bh / dm.Hq, h = bh % dm.Hq, hk = h / dm.group;
  const int64_t t0 = tile * BR;
  const T* kh = lk.head(k, b, hk);
  const T* vh = lv.head(v, b, hk);
  const int64_t kend = causal ? std::min(dm.S, t0 + BR + dm.off) : dm.S;
  const int64_t nkt = kend > 0 ? (kend + BC - 1) / BC : 0;

  load_async<T, BR, DM>(Qs, lq.head(q, b, h), t0, dm.T, dm.D, lq.t);
  if (nkt > 0) {
    load_async<T, BC, DM>(Ks, kh, 0, dm.S, dm.D, lk.t);
    load_async<T, BC, DM>(Vs, vh, 0, dm.S, dm.Dv, lv.t);
  }
  cp_async_commit();

  const int r0 = warp * 16;
  const int64_t trow[2] = {t0 + r0 + g, t0 + r0 + g + 8};
  uint32_t qa[KS][4];
  float o[NO][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int d = 0; d < NO; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;

  for (int64_t j = 0; j < nkt; ++j) {
    const int buf = static_cast<int>(j & 1);
    if (j + 1 < nkt) {
      load_async<T, BC, DM>(Ks + (buf ^ 1) * BC * P, kh, (j + 1) * BC, dm.S, dm.D, lk.t);
      load_async<T, BC, DM>(Vs + (buf ^ 1) * BC * P, vh, (j + 1) * BC, dm.S, dm.Dv, lv.t);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) ldsm_x4(qa[ks], a_at<P>(Qs, r0, ks * 16, lane));
    }
    const T* Kb = Ks + buf * BC * P;
    const T* Vb = Vs + buf * BC * P;
    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int np = 0; np < NS / 2; ++np) {
        uint32_t b[4];
        ldsm_x4(b, bn_at<P>(Kb, np * 16, ks * 16, lane));
        mma<T>(s[2 * np], qa[ks], b[0], b[1]);
        mma<T>(s[2 * np + 1], qa[ks], b[2], b[3]);
      }
    const int64_t s0 = j * BC;
    const bool mask = s0 + BC > dm.S || (causal && s0 + BC - 1 > t0 + dm.off);
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * scale_log2;
        if (mask) {
          const int64_t key = s0 + n * 8 + 2 * tq + (e & 1);
          if (key >= dm.S || (causal && key > trow[e >> 1] + dm.off)) x = -INFINITY;
        }
        s[n][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float base[2], alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      base[i] = mx[i] == -INFINITY ? 0.f : mx[i];  // a row with no visible key yet keeps p = 0
      alpha[i] = exp2f(m[i] - base[i]);
      m[i] = mx[i];
    }
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - base[e >> 1]);
        rs[e >> 1] += s[n][e];
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + rs[i];
#pragma unroll
    for (int d = 0; d < NO; ++d) {
      o[d][0] *= alpha[0];
      o[d][1] *= alpha[0];
      o[d][2] *= alpha[1];
      o[d][3] *= alpha[1];
    }
    uint32_t pa[NS / 2][4];
    to_a<T, NS>(pa, s);
    mma_rt<T, DM, NS / 2>(o, pa, Vb, 0, lane);
    __syncthreads();  // this buffer is refilled two tiles on
  }
  cp_async_wait<0>();

  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    inv[i] = l[i] > 0.f ? 1.f / l[i] : 0.f;  // no visible key: zero output, lse -inf (like the CPU)
    if (tq == 0 && trow[i] < dm.T)
      lse[bh * dm.T + trow[i]] = l[i] > 0.f ? (m[i] + log2f(l[i])) * kLn2 : -INFINITY;
  }
  store_rows<T, DM>(lo.head(out, b, h), o, t0 + r0, dm.T, dm.Dv, lo.t, inv, lane);
}

// ---- backward ---------------------------------------------------------------------------------

// di[row] = sum_c gout[row, c] * out[row, c] in f32; one warp per row.
template <class T>
__global__ void tc_bwd_di(const T* __restrict__ gout, const T* __restrict__ out, float* __restrict__ di, Dims dm,
                          Lay lg, Lay lo) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = dm.B * dm.Hq * dm.T;
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; r < rows;
       r += (int64_t{gridDim.x} * blockDim.x) >> 5) {
    const int64_t t = r % dm.T, bh = r / dm.T, b = bh / dm.Hq, h = bh % dm.Hq;
    const T* gr = lg.head(gout, b, h) + t * lg.t;
    const T* orow = lo.head(out, b, h) + t * lo.t;
    float s = 0.f;
    for (int c = lane; c < dm.Dv; c += 32) s += to_acc(gr[c]) * to_acc(orow[c]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) di[r] = s;
  }
}

constexpr int kKvBc = 64;  // keys per dK/dV block
template <int DM>
constexpr int kv_bq() {  // queries per step of the dK/dV block
  return DM == 128 ? 32 : 64;
}

// D 64: three blocks per multiprocessor (168 registers, a few spilled; 8% faster on an H100 than
// two blocks at 181 registers, docs/cuda.md).
template <class T, int DM>
__global__ void __launch_bounds__(kThreads, DM == 64 ? 3 : 1) tc_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k,
                                                        const T* __restrict__ v, const float* __restrict__ lse,
                                                        const T* __restrict__ gout, const float* __restrict__ di,
                                                        T* __restrict__ gk, T* __restrict__ gv, Dims dm, Lay lq,
                                                        Lay lk, Lay lv, Lay lg, Lay lgk, Lay lgv, float scale_log2,
                                                        float scale, bool causal) {
  constexpr int BC = kKvBc, BQ = kv_bq<DM>(), P = DM + 8, NQ = BQ / 8, NO = DM / 8;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  T* Ks = reinterpret_cast<T*>(tc_smem);  // [BC][P]
  T* Vs = Ks + BC * P;                     // [BC][P]
  T* Qs = Vs + BC * P;                     // [2][BQ][P]
  T* dOs = Qs + 2 * BQ * P;                // [2][BQ][P]
  float* ls = reinterpret_cast<float*>(dOs + 2 * BQ * P);  // [2][BQ] lse * log2(e), +inf: no weight
  float* ds = ls + 2 * BQ;                                 // [2][BQ] Di
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int64_t nbkv = dm.B * dm.Hkv;
  const int64_t kt = blockIdx.x / nbkv, bkv = blockIdx.x % nbkv;  // causal: most queries first
  const int64_t b = bkv / dm.Hkv, hk = bkv % dm.Hkv;
  const int64_t s0 = kt * BC;
  load_async<T, BC, DM>(Ks, lk.head(k, b, hk), s0, dm.S, dm.D, lk.t);
  load_async<T, BC, DM>(Vs, lv.head(v, b, hk), s0, dm.S, dm.Dv, lv.t);

  // Query tiles that see a key of this block: t >= s0 - off.
  const int64_t tfirst = causal ? std::max(int64_t{0}, s0 - dm.off) : int64_t{0};
  const int64_t tstart = (tfirst / BQ) * BQ;
  const int64_t nqt = dm.T > tstart ? (dm.T - tstart + BQ - 1) / BQ : 0;
  const int64_t steps = dm.group * nqt;
  auto issue = [&](int64_t st, int buf) {
    const int64_t h = hk * dm.group + st / nqt, bh = b * dm.Hq + h, t0 = tstart + (st % nqt) * BQ;
    load_async<T, BQ, DM>(Qs + buf * BQ * P, lq.head(q, b, h), t0, dm.T, dm.D, lq.t);
    load_async<T, BQ, DM>(dOs + buf * BQ * P, lg.head(gout, b, h), t0, dm.T, dm.Dv, lg.t);
    for (int r = threadIdx.x; r < BQ; r += kThreads) {
      const int64_t t = t0 + r;
      const float lv = t < dm.T ? lse[bh * dm.T + t] : INFINITY;
      ls[buf * BQ + r] = lv == -INFINITY ? INFINITY : lv * kLog2e;  // a row that sees no key has P = 0
      ds[buf * BQ + r] = t < dm.T ? di[bh * dm.T + t] : 0.f;
    }
  };
  if (steps > 0) issue(0, 0);
  cp_async_commit();

  float dk[NO][4], dv[NO][4];
#pragma unroll
  for (int d = 0; d < NO; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[d][e] = dv[d][e] = 0.f;
  const int r0 = warp * 16;
  const int64_t krow[2] = {s0 + r0 + g, s0 + r0 + g + 8};

  for (int64_t st = 0; st < steps; ++st) {
    const int buf = static_cast<int>(st & 1);
    if (st + 1 < steps) {
      issue(st + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t t0 = tstart + (st % nqt) * BQ;
    const T* Qb = Qs + buf * BQ * P;
    const T* dOb = dOs + buf * BQ * P;
    const float* lb = ls + buf * BQ;
    const float* db = ds + buf * BQ;
    float sT[NQ][4], dpT[NQ][4];
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sT[n][e] = dpT[n][e] = 0.f;
    mma_nt<T, DM, NQ>(sT, Ks, r0, Qb, 0, lane);    // S^T = K Q^T  (keys x queries)
    mma_nt<T, DM, NQ>(dpT, Vs, r0, dOb, 0, lane);  // dP^T = V dO^T
    const bool mask = causal && s0 + BC - 1 > t0 + dm.off;
#pragma unroll
    for (int n = 0; n < NQ; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = n * 8 + 2 * tq + (e & 1);
        float p = exp2f(sT[n][e] * scale_log2 - lb[qi]);
        if (mask && krow[e >> 1] > t0 + qi + dm.off) p = 0.f;
        sT[n][e] = p;
        dpT[n][e] = p * (dpT[n][e] - db[qi]);
      }
    uint32_t pa[NQ / 2][4], sa[NQ / 2][4];
    to_a<T, NQ>(pa, sT);
    to_a<T, NQ>(sa, dpT);
    mma_rt<T, DM, NQ / 2>(dv, pa, dOb, 0, lane);  // dV += P^T dO
    mma_rt<T, DM, NQ / 2>(dk, sa, Qb, 0, lane);   // dK += dS^T Q
    __syncthreads();  // this buffer is refilled two steps on
  }
  cp_async_wait<0>();
  const float one[2] = {1.f, 1.f}, sc[2] = {scale, scale};
  store_rows<T, DM>(lgk.head(gk, b, hk), dk, s0 + r0, dm.S, dm.D, lgk.t, sc, lane);
  store_rows<T, DM>(lgv.head(gv, b, hk), dv, s0 + r0, dm.S, dm.Dv, lgv.t, one, lane);
}

constexpr int kQBr = 64;  // query rows per dQ block
template <int DM>
constexpr int q_bk() {  // keys per step of the dQ block
  return DM == 128 ? 32 : 64;
}

// D 64: four blocks per multiprocessor (128 registers, no spill).
template <class T, int DM>
__global__ void __launch_bounds__(kThreads, DM == 64 ? 4 : 1) tc_bwd_dq(const T* __restrict__ q, const T* __restrict__ k,
                                                      const T* __restrict__ v, const float* __restrict__ lse,
                                                      const T* __restrict__ gout, const float* __restrict__ di,
                                                      T* __restrict__ gq, Dims dm, Lay lq, Lay lk, Lay lv, Lay lg,
                                                      Lay lgq, int64_t ntiles, float scale_log2, float scale,
                                                      bool causal) {
  constexpr int BR = kQBr, BK = q_bk<DM>(), P = DM + 8, NK = BK / 8, NO = DM / 8;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  T* Qs = reinterpret_cast<T*>(tc_smem);  // [BR][P]
  T* dOs = Qs + BR * P;                    // [BR][P]
  T* Ks = dOs + BR * P;                    // [2][BK][P]
  T* Vs = Ks + 2 * BK * P;                 // [2][BK][P]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int64_t nbh = dm.B * dm.Hq;
  const int64_t tile = ntiles - 1 - blockIdx.x / nbh, bh = blockIdx.x % nbh;
  const int64_t b = bh / dm.Hq, h = bh % dm.Hq, hk = h / dm.group;
  const int64_t t0 = tile * BR;
  const T* kh = lk.head(k, b, hk);
  const T* vh = lv.head(v, b, hk);
  const int64_t kend = causal ? std::min(dm.S, t0 + BR + dm.off) : dm.S;
  const int64_t nkt = kend > 0 ? (kend + BK - 1) / BK : 0;

  load_async<T, BR, DM>(Qs, lq.head(q, b, h), t0, dm.T, dm.D, lq.t);
  load_async<T, BR, DM>(dOs, lg.head(gout, b, h), t0, dm.T, dm.Dv, lg.t);
  if (nkt > 0) {
    load_async<T, BK, DM>(Ks, kh, 0, dm.S, dm.D, lk.t);
    load_async<T, BK, DM>(Vs, vh, 0, dm.S, dm.Dv, lv.t);
  }
  cp_async_commit();

  const int r0 = warp * 16;
  const int64_t trow[2] = {t0 + r0 + g, t0 + r0 + g + 8};
  float lrow[2], drow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float lv = trow[i] < dm.T ? lse[bh * dm.T + trow[i]] : INFINITY;
    lrow[i] = lv == -INFINITY ? INFINITY : lv * kLog2e;
    drow[i] = trow[i] < dm.T ? di[bh * dm.T + trow[i]] : 0.f;
  }
  float dq[NO][4];
#pragma unroll
  for (int d = 0; d < NO; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.f;

  for (int64_t j = 0; j < nkt; ++j) {
    const int buf = static_cast<int>(j & 1);
    if (j + 1 < nkt) {
      load_async<T, BK, DM>(Ks + (buf ^ 1) * BK * P, kh, (j + 1) * BK, dm.S, dm.D, lk.t);
      load_async<T, BK, DM>(Vs + (buf ^ 1) * BK * P, vh, (j + 1) * BK, dm.S, dm.Dv, lv.t);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* Kb = Ks + buf * BK * P;
    const T* Vb = Vs + buf * BK * P;
    float s[NK][4], dp[NK][4];
#pragma unroll
    for (int n = 0; n < NK; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
    mma_nt<T, DM, NK>(s, Qs, r0, Kb, 0, lane);    // S = Q K^T
    mma_nt<T, DM, NK>(dp, dOs, r0, Vb, 0, lane);  // dP = dO V^T
    const int64_t s0 = j * BK;
    const bool mask = s0 + BK > dm.S || (causal && s0 + BK - 1 > t0 + dm.off);
#pragma unroll
    for (int n = 0; n < NK; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[n][e] * scale_log2 - lrow[e >> 1]);
        if (mask) {
          const int64_t key = s0 + n * 8 + 2 * tq + (e & 1);
          if (key >= dm.S || (causal && key > trow[e >> 1] + dm.off)) p = 0.f;
        }
        dp[n][e] = p * (dp[n][e] - drow[e >> 1]);
      }
    uint32_t sa[NK / 2][4];
    to_a<T, NK>(sa, dp);
    mma_rt<T, DM, NK / 2>(dq, sa, Kb, 0, lane);  // dQ += dS K
    __syncthreads();
  }
  cp_async_wait<0>();
  const float sc[2] = {scale, scale};
  store_rows<T, DM>(lgq.head(gq, b, h), dq, t0 + r0, dm.T, dm.D, lgq.t, sc, lane);
}

// ---- launch -------------------------------------------------------------------------------------

constexpr int kMaxDevices = 64;

int current_device_index(const char* op) {
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CHECK(dev >= 0 && dev < kMaxDevices, "{}: device index {} is out of range", op, dev);
  return dev;
}

// Sets the kernel's dynamic shared memory limit once per instantiation and device: the attribute
// belongs to the device current when it is set, so a process that runs attention on two GPUs sets
// it on each.
template <auto Kernel>
void smem_limit(size_t bytes) {
  static std::atomic<bool> done[kMaxDevices] = {};
  const int dev = current_device_index("attention");
  if (done[dev].load(std::memory_order_acquire)) return;
  MT_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(Kernel),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  done[dev].store(true, std::memory_order_release);
}

unsigned grid_of(int64_t blocks, const char* op) {
  MT_CHECK(blocks < (int64_t{1} << 31), "{}: {} blocks are too many for one launch", op, blocks);
  return static_cast<unsigned>(blocks);
}

template <class T, int DM>
void fwd_launch(const AttentionParams& p, const Dims& dm) {
  constexpr int P = DM + 8;
  const int64_t ntiles = ceil_div(dm.T, kFwdBr);
  const size_t smem = sizeof(T) * P * (kFwdBr + 4 * kFwdBc);
  smem_limit<tc_fwd<T, DM>>(smem);
  const float sl2 = static_cast<float>(p.scale) * kLog2e;
  tc_fwd<T, DM><<<grid_of(ntiles * dm.B * dm.Hq, "attention"), kThreads, smem, cuda::current_stream()>>>(
      p.q.ptr<const T>(), p.k.ptr<const T>(), p.v.ptr<const T>(), p.out.ptr<T>(), p.lse.ptr<float>(), dm, Lay(p.q),
      Lay(p.k), Lay(p.v), Lay(p.out), ntiles, sl2, p.causal);
  MT_CUDA_LAUNCH_CHECK();
}

// A second stream of each device and the two events that fork work onto it and join it back.
struct Fork {
  cudaStream_t side = nullptr;
  cudaEvent_t start = nullptr, done = nullptr;
};
const Fork& fork_of_current_device() {
  static std::mutex mu;
  static Fork forks[kMaxDevices];
  const int dev = current_device_index("attention_bwd");
  std::lock_guard<std::mutex> lock(mu);
  Fork& f = forks[dev];
  if (!f.side) {  // lives until the process ends, like the compute streams
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&f.side, cudaStreamNonBlocking));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&f.start, cudaEventDisableTiming));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming));
  }
  return f;
}

template <class T, int DM>
void bwd_launch(const AttentionBwdParams& p, const Dims& dm) {
  constexpr int P = DM + 8;
  cudaStream_t st = cuda::current_stream();
  const int64_t rows = dm.B * dm.Hq * dm.T;
  StreamScratch di(static_cast<size_t>(std::max<int64_t>(rows, 1)) * sizeof(float));
  if (rows > 0) {
    tc_bwd_di<T><<<grid_for(rows * 32), 256, 0, st>>>(p.gout.ptr<const T>(), p.out.ptr<const T>(), di.as<float>(),
                                                      dm, Lay(p.gout), Lay(p.out));
    MT_CUDA_LAUNCH_CHECK();
  }
  const float sl2 = static_cast<float>(p.scale) * kLog2e, scale = static_cast<float>(p.scale);
  // dQ runs on the device's side stream beside dK/dV (both only read Q, K, V, dO, lse and Di),
  // so each grid fills the other's tail; the current stream waits for it before anything after.
  const Fork& fork = fork_of_current_device();
  MT_CUDA_CHECK(cudaEventRecord(fork.start, st));
  MT_CUDA_CHECK(cudaStreamWaitEvent(fork.side, fork.start, 0));
  if (dm.S > 0 && dm.B * dm.Hkv > 0) {
    constexpr int BQ = kv_bq<DM>();
    const size_t smem = sizeof(T) * P * (2 * kKvBc + 4 * BQ) + sizeof(float) * 4 * BQ;
    smem_limit<tc_bwd_dkdv<T, DM>>(smem);
    tc_bwd_dkdv<T, DM><<<grid_of(ceil_div(dm.S, kKvBc) * dm.B * dm.Hkv, "attention_bwd"), kThreads, smem, st>>>(
        p.q.ptr<const T>(), p.k.ptr<const T>(), p.v.ptr<const T>(), p.lse.ptr<const float>(), p.gout.ptr<const T>(),
        di.as<const float>(), p.gk.ptr<T>(), p.gv.ptr<T>(), dm, Lay(p.q), Lay(p.k), Lay(p.v), Lay(p.gout), Lay(p.gk),
        Lay(p.gv), sl2, scale, p.causal);
    MT_CUDA_LAUNCH_CHECK();
  }
  if (rows > 0) {
    constexpr int BK = q_bk<DM>();
    const int64_t ntiles = ceil_div(dm.T, kQBr);
    const size_t smem = sizeof(T) * P * (2 * kQBr + 4 * BK);
    smem_limit<tc_bwd_dq<T, DM>>(smem);
    tc_bwd_dq<T, DM><<<grid_of(ntiles * dm.B * dm.Hq, "attention_bwd"), kThreads, smem, fork.side>>>(
        p.q.ptr<const T>(), p.k.ptr<const T>(), p.v.ptr<const T>(), p.lse.ptr<const float>(), p.gout.ptr<const T>(),
        di.as<const float>(), p.gq.ptr<T>(), dm, Lay(p.q), Lay(p.k), Lay(p.v), Lay(p.gout), Lay(p.gq), ntiles, sl2,
        scale, p.causal);
    MT_CUDA_LAUNCH_CHECK();
  }
  MT_CUDA_CHECK(cudaEventRecord(fork.done, fork.side));
  MT_CUDA_CHECK(cudaStreamWaitEvent(st, fork.done, 0));
}

void check_tc(const char* op, std::initializer_list<const KView*> operands, const KView& lse) {
  const KView& q = **operands.begin();
  const KView& v = *operands.begin()[2];
  MT_CHECK(attention_tensor_core_ok(q.dtype, q.sizes[3], v.sizes[3]),
           "{}: the tensor-core kernel takes bf16/f16 with head dims multiples of 8 up to 128; got {} D = {}, Dv = {}",
           op, dtype_name(q.dtype), q.sizes[3], v.sizes[3]);
  MT_CHECK(lse.dtype == DType::kF32, "{}: lse must be f32 for {} inputs, got {}", op, dtype_name(q.dtype),
           dtype_name(lse.dtype));
  for (const KView* t : operands)
    MT_CHECK(attention_tc_layout_ok(*t), "{}: operand {} (strides {}) needs unit stride in D, 16-byte aligned rows", op,
             t->sizes, t->strides);
  static std::atomic<int> major_of[kMaxDevices] = {};  // 0: not asked yet (per device: GPUs may differ)
  const int dev = current_device_index(op);
  int major = major_of[dev].load(std::memory_order_relaxed);
  if (major == 0) {
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    major_of[dev].store(major, std::memory_order_relaxed);
  }
  MT_CHECK(major >= 8, "{}: 16-bit attention needs a GPU of compute capability 8.0 or newer (cuda:{} is {}.x)", op,
           dev, major);
}

template <class T>
void fwd_typed(const AttentionParams& p, const Dims& dm) {
  if (std::max(dm.D, dm.Dv) <= 64)
    fwd_launch<T, 64>(p, dm);
  else
    fwd_launch<T, 128>(p, dm);
}

template <class T>
void bwd_typed(const AttentionBwdParams& p, const Dims& dm) {
  if (std::max(dm.D, dm.Dv) <= 64)
    bwd_launch<T, 64>(p, dm);
  else
    bwd_launch<T, 128>(p, dm);
}

}  // namespace

void attention_tc(const AttentionParams& p) {
  check_tc("attention", {&p.q, &p.k, &p.v, &p.out}, p.lse);
  const Dims dm(p.q, p.v);
  if (dm.B * dm.Hq * dm.T == 0) return;
  if (p.q.dtype == DType::kBF16)
    fwd_typed<__nv_bfloat16>(p, dm);
  else
    fwd_typed<__half>(p, dm);
}

void attention_tc_bwd(const AttentionBwdParams& p) {
  check_tc("attention_bwd", {&p.q, &p.k, &p.v, &p.out, &p.gout, &p.gq, &p.gk, &p.gv}, p.lse);
  const Dims dm(p.q, p.v);
  if (p.q.dtype == DType::kBF16)
    bwd_typed<__nv_bfloat16>(p, dm);
  else
    bwd_typed<__half>(p, dm);
}

}  // namespace mt
