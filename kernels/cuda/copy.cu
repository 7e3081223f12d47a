// fill, arange and copy (any strides, any dtype pair) on CUDA. Values match the CPU bit for bit:
// the same conversions (cvt in common.cuh) and, for arange, the same unfused double arithmetic.
#include <cstring>

#include "kernels/cpu/loops.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/registry.h"
#include "runtime/dtype.h"

namespace mt::cuda {
namespace {

// The host type with the same bits as device type T (for values converted on the host).
template <class T> struct HostOf { using type = T; };
template <> struct HostOf<__nv_bfloat16> { using type = BFloat16; };
template <> struct HostOf<__half> { using type = Float16; };

void fill(const FillParams& p) {
  MT_CUDA_DISPATCH_ALL(p.out.dtype, "fill", {
    using H = typename HostOf<scalar_t>::type;
    // Converted once on the host with the CPU's own convert, so both backends store equal bits.
    const H hv = is_floating(p.out.dtype) ? cpu::convert<H>(p.value) : cpu::convert<H>(p.int_value);
    scalar_t v;
    std::memcpy(static_cast<void*>(&v), &hv, sizeof(v));
    scalar_t* o = p.out.ptr<scalar_t>();
    launch_elementwise<1>(p.out.sizes, {&p.out}, [=] __device__(const int64_t* off) { o[off[0]] = v; });
  });
}

void arange(const ArangeParams& p) {
  MT_CUDA_DISPATCH_ALL(p.out.dtype, "arange", {
    scalar_t* o = p.out.ptr<scalar_t>();
    const int64_t st = p.out.strides[0];
    const double start = p.start, step = p.step;
    const int64_t n = p.out.sizes[0];
    KView lin;  // a 1-D contiguous index space
    lin.sizes = Shape{n};
    lin.strides = Shape{1};
    launch_elementwise<1>(lin.sizes, {&lin}, [=] __device__(const int64_t* off) {
      const double v = __dadd_rn(start, __dmul_rn(static_cast<double>(off[0]), step));
      o[off[0] * st] = cvt<scalar_t>(v);
    });
  });
}

// Dense, aligned operands (casts of whole tensors: master weights to the model, gradients to
// the masters) take 16-byte accesses; same-dtype dense copies are a device memcpy.
template <class S, class D>
void copy_typed(const CopyParams& p) {
  const S* in = p.src.ptr<const S>();
  D* out = p.out.ptr<D>();
  const int64_t n = p.out.sizes.numel();
  const auto at = [](const void* x) { return reinterpret_cast<uintptr_t>(x); };
  const bool disjoint = at(in + n) <= at(out) || at(out + n) <= at(in);
  if (disjoint && dense_aligned<2>(p.out.sizes, {&p.src, &p.out})) {
    if constexpr (std::is_same_v<S, D>) {
      MT_CUDA_CHECK(cudaMemcpyAsync(out, in, static_cast<size_t>(n) * sizeof(D), cudaMemcpyDeviceToDevice,
                                    current_stream()));
      return;
    } else {
      return launch_dense_map1(in, out, n, [] __device__(S x) { return cvt<D>(x); });
    }
  }
  launch_elementwise<2>(p.out.sizes, {&p.src, &p.out},
                        [=] __device__(const int64_t* off) { out[off[1]] = cvt<D>(in[off[0]]); });
}

// Same dtype: move bytes by element size (4 kernels instead of 8).
template <class U>
void copy_bits(const CopyParams& p) { copy_typed<U, U>(p); }

void copy(const CopyParams& p) {
  if (p.src.dtype == p.out.dtype) {
    switch (dtype_size(p.src.dtype)) {
      case 1: return copy_bits<uint8_t>(p);
      case 2: return copy_bits<uint16_t>(p);
      case 4: return copy_bits<uint32_t>(p);
      default: return copy_bits<uint64_t>(p);
    }
  }
  MT_CUDA_DISPATCH_ALL(p.src.dtype, "copy", {
    using src_t = scalar_t;
    MT_CUDA_DISPATCH_ALL(p.out.dtype, "copy", { copy_typed<src_t, scalar_t>(p); });
  });
}

}  // namespace
}  // namespace mt::cuda

namespace mt {
void register_cuda_copy(KernelTable& t) {
  t.fill = cuda::fill;
  t.arange = cuda::arange;
  t.copy = cuda::copy;
}
}  // namespace mt
