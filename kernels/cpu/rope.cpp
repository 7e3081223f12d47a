// Rotary position embedding on the CPU. x is contiguous [rows, D]; each row finds its cos/sin
// row through the (possibly zero) strides of the table views, so one [T, D/2] table serves every
// batch and head without being expanded. Arithmetic happens in the tables' compute type (float
// for f32/bf16/f16 x, double for f64), rounding once on store.
#include <cmath>

#include "kernels/cpu/loops.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

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

  parallel_for(rows, D, [&](int64_t r) {
    // Table offsets of this row: unravel r over x's leading dims.
    int64_t coff = 0, soff = 0, rem = r;
    for (int d = nd - 2; d >= 0; --d) {
      int64_t i = rem % p.x.sizes[d];
      rem /= p.x.sizes[d];
      coff += i * p.cos.strides[d];
      soff += i * p.sin.strides[d];
    }
    const T* xr = x + r * D;
    T* yr = out + r * D;
    const C* c = cs + coff;
    const C* s = sn + soff;
    if (p.style == RopeStyle::kHalf) {
      for (int64_t i = 0; i < half; ++i) {
        C ci = c[i * cstep], si = sign * s[i * sstep];
        C a = C(xr[i]), b = C(xr[i + half]);
        yr[i] = T(a * ci - b * si);
        yr[i + half] = T(b * ci + a * si);
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        C ci = c[i * cstep], si = sign * s[i * sstep];
        C a = C(xr[2 * i]), b = C(xr[2 * i + 1]);
        yr[2 * i] = T(a * ci - b * si);
        yr[2 * i + 1] = T(b * ci + a * si);
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
