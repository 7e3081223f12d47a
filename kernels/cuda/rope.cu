// Rotary position embedding on CUDA, mirroring kernels/cpu/rope.cpp. x is contiguous [rows, D];
// each row finds its cos/sin row through the (possibly zero) strides of the table views, so one
// [T, D/2] table serves every batch and head. A block holds a few rows, one thread per pair of a
// row (the row's table offset is unravelled once per thread). Arithmetic in the tables' type
// (float for f32/bf16/f16 x, double for f64), rounding once on store; both pairings, and inverse.
// The rotate_half pairing on aligned rows takes a 16-byte path (rope_half_vec).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {
namespace {

// Table offsets of row r (x's leading index, unravelled through the table views' sizes), in 32-bit
// arithmetic when every count fits: a 64-bit division costs several times a 32-bit one, and this
// runs once per row and thread.
__device__ __forceinline__ void table_offsets(const CView& cv, const CView& sv, int nlead, int64_t r, bool narrow,
                                              int64_t& coff, int64_t& soff) {
  coff = 0;
  soff = 0;
  if (narrow) {
    uint32_t rem = static_cast<uint32_t>(r);
    for (int d = nlead - 1; d >= 0; --d) {
      const uint32_t n = static_cast<uint32_t>(cv.sizes[d]), i = rem % n;
      rem /= n;
      coff += int64_t{i} * cv.strides[d];
      soff += int64_t{i} * sv.strides[d];
    }
    return;
  }
  int64_t rem = r;
  for (int d = nlead - 1; d >= 0; --d) {
    const int64_t i = rem % cv.sizes[d];
    rem /= cv.sizes[d];
    coff += i * cv.strides[d];
    soff += i * sv.strides[d];
  }
}

template <class T>
__global__ void rope_kernel(const T* __restrict__ x, T* __restrict__ out, CView cos_v, CView sin_v, int64_t rows,
                            int64_t half, bool interleaved, bool inverse) {
  using C = acc_t<T>;
  const C* cs = cos_v.ptr<const C>();
  const C* sn = sin_v.ptr<const C>();
  const int nlead = cos_v.ndim - 1;  // x's leading dims
  const int64_t cstep = cos_v.strides[nlead], sstep = sin_v.strides[nlead];
  const C sign = inverse ? C(-1) : C(1);
  const int64_t D = 2 * half;
  for (int64_t r = blockIdx.x * int64_t{blockDim.y} + threadIdx.y; r < rows; r += int64_t{gridDim.x} * blockDim.y) {
    int64_t coff, soff;
    table_offsets(cos_v, sin_v, nlead, r, /*narrow=*/false, coff, soff);
    const T* xr = x + r * D;
    T* yr = out + r * D;
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const C ci = cs[coff + i * cstep], si = sign * sn[soff + i * sstep];
      const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
      const C a = to_acc(xr[ia]), b = to_acc(xr[ib]);
      yr[ia] = from_acc<T>(a * ci - b * si);
      yr[ib] = from_acc<T>(b * ci + a * si);
    }
  }
}

// rotate_half pairing with 16-byte accesses (LLaMA's layout; the scalar kernel above made 4 small
// loads per pair and unravelled the row's table offset for every pair): thread j of a row rotates
// pairs (jN + e, half + jN + e), e < N, from one N-vector of each half of x and N cos and N sin
// values loaded 16 bytes at a time. Per pair the arithmetic of rope_kernel. Needs half % N == 0,
// x, out and every table row 16-byte aligned, and tables contiguous along the pair dim.
template <class T>
__global__ void rope_half_vec(const T* __restrict__ x, T* __restrict__ out, CView cos_v, CView sin_v, int64_t rows,
                              int64_t half, bool inverse, bool narrow) {
  using C = acc_t<T>;
  constexpr int N = 16 / sizeof(T), NC = 16 / sizeof(C);  // x and table values per 16 bytes
  const C* cs = cos_v.ptr<const C>();
  const C* sn = sin_v.ptr<const C>();
  const int nlead = cos_v.ndim - 1;
  const C sign = inverse ? C(-1) : C(1);
  const int64_t nvec = half / N;
  for (int64_t r = blockIdx.x * int64_t{blockDim.y} + threadIdx.y; r < rows; r += int64_t{gridDim.x} * blockDim.y) {
    int64_t coff, soff;
    table_offsets(cos_v, sin_v, nlead, r, narrow, coff, soff);
    const T* xr = x + r * 2 * half;
    T* yr = out + r * 2 * half;
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      const Pack<T, N> a = reinterpret_cast<const Pack<T, N>*>(xr)[j];
      const Pack<T, N> b = reinterpret_cast<const Pack<T, N>*>(xr + half)[j];
      C c[N], sv[N];
#pragma unroll
      for (int q = 0; q < N / NC; ++q) {
        const Pack<C, NC> cq = reinterpret_cast<const Pack<C, NC>*>(cs + coff + j * N)[q];
        const Pack<C, NC> sq = reinterpret_cast<const Pack<C, NC>*>(sn + soff + j * N)[q];
#pragma unroll
        for (int e = 0; e < NC; ++e) {
          c[q * NC + e] = cq.v[e];
          sv[q * NC + e] = sq.v[e];
        }
      }
      Pack<T, N> oa, ob;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const C ci = c[e], si = sign * sv[e];
        const C av = to_acc(a.v[e]), bv = to_acc(b.v[e]);
        oa.v[e] = from_acc<T>(av * ci - bv * si);
        ob.v[e] = from_acc<T>(bv * ci + av * si);
      }
      reinterpret_cast<Pack<T, N>*>(yr)[j] = oa;
      reinterpret_cast<Pack<T, N>*>(yr + half)[j] = ob;
    }
  }
}

// Whether rope_half_vec applies (see its requirements).
template <class T>
bool half_vec_fits(const RopeParams& p, int64_t half) {
  using C = acc_t<T>;
  if (p.style != RopeStyle::kHalf || half % (16 / sizeof(T)) != 0) return false;
  if (!aligned16(p.x.data) || !aligned16(p.out.data) || !aligned16(p.cos.data) || !aligned16(p.sin.data)) return false;
  const int nt = p.cos.ndim();
  if (p.cos.strides[nt - 1] != 1 || p.sin.strides[nt - 1] != 1) return false;
  for (int d = 0; d + 1 < nt; ++d)
    if ((p.cos.strides[d] * sizeof(C)) % 16 != 0 || (p.sin.strides[d] * sizeof(C)) % 16 != 0) return false;
  return true;
}

template <class T>
void rope_typed(const RopeParams& p) {
  const int nd = p.x.ndim();
  const int64_t D = p.x.sizes[nd - 1], half = D / 2;
  const int64_t rows = D ? p.x.numel() / D : 0;
  if (rows == 0 || half == 0) return;
  if (half_vec_fits<T>(p, half)) {
    // Threads across a row's vectors (up to 128), the rest of a 256-thread block across rows.
    const int64_t nvec = half / (16 / static_cast<int64_t>(sizeof(T)));
    int vx = 1;
    while (vx < 128 && vx < nvec) vx *= 2;
    const int vy = 256 / vx;
    const int64_t vblocks = std::min<int64_t>(ceil_div(rows, vy), int64_t{1} << 30);
    rope_half_vec<T><<<static_cast<unsigned>(vblocks), dim3(vx, vy), 0, cuda::current_stream()>>>(
        p.x.ptr<const T>(), p.out.ptr<T>(), cview(p.cos), cview(p.sin), rows, half, p.inverse,
        rows <= int64_t{UINT32_MAX});
    MT_CUDA_LAUNCH_CHECK();
    return;
  }
  // Threads across the pairs of a row (up to 128), the rest of a 256-thread block across rows.
  int bx = 32;
  while (bx < 128 && bx < half) bx *= 2;
  const int by = 256 / bx;
  const int64_t blocks = std::min<int64_t>(ceil_div(rows, by), int64_t{1} << 30);
  rope_kernel<T><<<static_cast<unsigned>(blocks), dim3(bx, by), 0, cuda::current_stream()>>>(
      p.x.ptr<const T>(), p.out.ptr<T>(), cview(p.cos), cview(p.sin), rows, half,
      p.style == RopeStyle::kInterleaved, p.inverse);
  MT_CUDA_LAUNCH_CHECK();
}

void rope(const RopeParams& p) {
  MT_CUDA_DISPATCH_FLOAT(p.x.dtype, "rotary_embedding", { rope_typed<scalar_t>(p); });
}

}  // namespace

void register_cuda_rope(KernelTable& t) { t.rope = rope; }

}  // namespace mt
