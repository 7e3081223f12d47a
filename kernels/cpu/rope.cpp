// Rotary position embedding on the CPU. x is contiguous [rows, D]; each row finds its cos/sin
// row through the (possibly zero) strides of the table views, so one [T, D/2] table serves every
// batch and head without being expanded. Arithmetic happens in the tables' compute type (float
// for f32/bf16/f16 x, double for f64), rounding once on store.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/loops.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

// One row: y = rotate(x) by the row's cos c and sin s (table steps cstep, sstep; sign -1 inverts).
// Contiguous tables (steps 1, the front end's usual case) take loops the compiler vectorizes;
// the arithmetic is the same either way, so are the bits.
template <class T, class C>
inline void rope_row(RopeStyle style, int64_t half, const T* xr, T* yr, const C* c, const C* s, int64_t cstep,
                     int64_t sstep, C sign) {
  if (cstep == 1 && sstep == 1) {
    if (style == RopeStyle::kHalf) {
      for (int64_t i = 0; i < half; ++i) {
        const C ci = c[i], si = sign * s[i], a = C(xr[i]), b = C(xr[i + half]);
        yr[i] = T(a * ci - b * si);
        yr[i + half] = T(b * ci + a * si);
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        const C ci = c[i], si = sign * s[i], a = C(xr[2 * i]), b = C(xr[2 * i + 1]);
        yr[2 * i] = T(a * ci - b * si);
        yr[2 * i + 1] = T(b * ci + a * si);
      }
    }
    return;
  }
  for (int64_t i = 0; i < half; ++i) {
    const C ci = c[i * cstep], si = sign * s[i * sstep];
    const int64_t ia = style == RopeStyle::kHalf ? i : 2 * i, ib = style == RopeStyle::kHalf ? i + half : 2 * i + 1;
    const C a = C(xr[ia]), b = C(xr[ib]);
    yr[ia] = T(a * ci - b * si);
    yr[ib] = T(b * ci + a * si);
  }
}

template <class T>
void rope_typed(const RopeParams& p) {
  using C = compute_t<T>;  // the front end gives tables of this type (f32, or f64 for f64 x)
  const int nd = p.x.ndim();
  const int64_t D = p.x.sizes[nd - 1], half = D / 2;
  const int64_t rows = D ? p.x.numel() / D : 0;
  const T* x = p.x.ptr<T>();
  T* out = p.out.ptr<T>();
  const C* cs = p.cos.ptr<C>();
  const C* sn = p.sin.ptr<C>();
  const int64_t cstep = p.cos.strides[nd - 1], sstep = p.sin.strides[nd - 1];
  const C sign = p.inverse ? C(-1) : C(1);
  // Rows in chunks: each chunk unravels its first row over x's leading dims once, then steps an
  // odometer (a division per row cost more than a row of 64 values).
  constexpr int64_t kChunk = 64;
  const int64_t chunks = (rows + kChunk - 1) / kChunk;
  parallel_for(chunks, kChunk * D, [&](int64_t ch) {
    const int64_t r0 = ch * kChunk, r1 = std::min(rows, r0 + kChunk);
    int64_t idx[kMaxDims] = {};
    int64_t coff = 0, soff = 0, rem = r0;
    for (int d = nd - 2; d >= 0; --d) {
      idx[d] = rem % p.x.sizes[d];
      rem /= p.x.sizes[d];
      coff += idx[d] * p.cos.strides[d];
      soff += idx[d] * p.sin.strides[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      rope_row<T, C>(p.style, half, x + r * D, out + r * D, cs + coff, sn + soff, cstep, sstep, sign);
      for (int d = nd - 2; d >= 0; --d) {  // next row: carry through the leading dims
        coff += p.cos.strides[d];
        soff += p.sin.strides[d];
        if (++idx[d] < p.x.sizes[d]) break;
        coff -= idx[d] * p.cos.strides[d];
        soff -= idx[d] * p.sin.strides[d];
        idx[d] = 0;
      }
    }
  });
}

void rope(const RopeParams& p) { MT_DISPATCH_FLOAT(p.x.dtype, "rotary_embedding", { rope_typed<scalar_t>(p); }); }

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_rope(KernelTable& t) { t.rope = cpu::rope; }
}  // namespace mt
