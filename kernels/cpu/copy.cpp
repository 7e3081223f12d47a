// fill, arange and copy (strided, with dtype conversion) on the CPU.
#include "kernels/cpu/loops.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

void fill(const FillParams& p) {
  MT_DISPATCH_ALL(p.out.dtype, "fill", {
    const scalar_t v = is_floating(p.out.dtype) ? convert<scalar_t>(p.value)
                                                : convert<scalar_t>(p.int_value);
    strided_loop<1>(p.out.sizes, {&p.out}, [&](char** ptr, int64_t n, const int64_t* s) {
      if (s[0] == sizeof(scalar_t)) {
        auto* o = reinterpret_cast<scalar_t*>(ptr[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = v;
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<scalar_t*>(ptr[0] + i * s[0]) = v;
      }
    });
  });
}

void arange(const ArangeParams& p) {
  MT_DISPATCH_ALL(p.out.dtype, "arange", {
    auto* o = p.out.ptr<scalar_t>();
    const int64_t st = p.out.strides[0];
    for (int64_t i = 0; i < p.out.sizes[0]; ++i)
      o[i * st] = convert<scalar_t>(p.start + static_cast<double>(i) * p.step);
  });
}

template <class S, class D>
void copy_typed(const CopyParams& p) {
  strided_loop<2>(p.out.sizes, {&p.src, &p.out}, [](char** ptr, int64_t n, const int64_t* s) {
    if (s[0] == sizeof(S) && s[1] == sizeof(D)) {
      const auto* in = reinterpret_cast<const S*>(ptr[0]);
      auto* out = reinterpret_cast<D*>(ptr[1]);
      for (int64_t i = 0; i < n; ++i) out[i] = convert<D>(in[i]);
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<D*>(ptr[1] + i * s[1]) = convert<D>(load<S>(ptr[0] + i * s[0]));
    }
  });
}

void copy(const CopyParams& p) {
  MT_DISPATCH_ALL(p.src.dtype, "copy", {
    using src_t = scalar_t;
    MT_DISPATCH_ALL(p.out.dtype, "copy", { copy_typed<src_t, scalar_t>(p); });
  });
}

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_copy(KernelTable& t) {
  t.fill = cpu::fill;
  t.arange = cpu::arange;
  t.copy = cpu::copy;
}
}  // namespace mt
