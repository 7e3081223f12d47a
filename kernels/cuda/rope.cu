// Rotary position embedding on CUDA, mirroring kernels/cpu/rope.cpp. x is contiguous [rows, D];
// each row finds its cos/sin row through the (possibly zero) strides of the table views, so one
// [T, D/2] table serves every batch and head. A block holds a few rows, one thread per pair of a
// row (the row's table offset is unravelled once per thread). Arithmetic in the tables' type
// (float for f32/bf16/f16 x, double for f64), rounding once on store; both pairings, and inverse.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {
namespace {

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
    int64_t coff = 0, soff = 0, rem = r;
    for (int d = nlead - 1; d >= 0; --d) {
      const int64_t i = rem % cos_v.sizes[d];
      rem /= cos_v.sizes[d];
      coff += i * cos_v.strides[d];
      soff += i * sin_v.strides[d];
    }
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

template <class T>
void rope_typed(const RopeParams& p) {
  const int nd = p.x.ndim();
  const int64_t D = p.x.sizes[nd - 1], half = D / 2;
  const int64_t rows = D ? p.x.numel() / D : 0;
  if (rows == 0 || half == 0) return;
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
