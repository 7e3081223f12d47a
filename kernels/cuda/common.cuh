// Shared by every CUDA kernel file (kernels/cuda/*.cu): error checks, the stream kernels launch
// on, a POD view that device code can index (KView holds Shape, whose methods are host-only),
// and float conversions for the 16-bit storage types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/view.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/memory.h"
#include "runtime/error.h"

// Throws mt::Error with the CUDA error string, the expression, file and line.
#define MT_CUDA_CHECK(expr)                                                                      \
  do {                                                                                           \
    cudaError_t err_ = (expr);                                                                   \
    if (err_ != cudaSuccess)                                                                     \
      ::mt::cuda_fail(err_, #expr, __FILE__, __LINE__);                                          \
  } while (0)
// After a launch: reports launch-configuration errors at the launching line.
#define MT_CUDA_LAUNCH_CHECK() MT_CUDA_CHECK(cudaGetLastError())

namespace mt {

[[noreturn]] void cuda_fail(cudaError_t err, const char* expr, const char* file, int line);

namespace cuda {
// The stream that kernels of the calling thread launch on (runtime/cuda/stream.h owns it).
cudaStream_t current_stream();
}  // namespace cuda

// A view device code can index: data pointer, rank, sizes and element strides by value.
struct CView {
  void* data;
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];

  template <class T>
  __host__ __device__ T* ptr() const { return static_cast<T*>(data); }
  // Element offset of the `linear`-th element in row-major order of sizes.
  __host__ __device__ int64_t offset(int64_t linear) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t i = linear % sizes[d];
      linear /= sizes[d];
      off += i * strides[d];
    }
    return off;
  }
};

inline CView cview(const KView& v) {
  CView c{};
  c.data = v.data;
  c.ndim = v.sizes.size();
  for (int i = 0; i < c.ndim; ++i) {
    c.sizes[i] = v.sizes[i];
    c.strides[i] = v.strides[i];
  }
  return c;
}

// Device storage types of meshtrain dtypes: kF64 double, kF32 float, kBF16 __nv_bfloat16,
// kF16 __half, kI64 int64_t, kI32 int32_t, kU8 uint8_t, kBool bool. Arithmetic happens in
// acc_t (float for 16-bit floats) and rounds once on store (round to nearest even, like the CPU).
template <class T> struct Acc { using type = T; };
template <> struct Acc<__nv_bfloat16> { using type = float; };
template <> struct Acc<__half> { using type = float; };
template <class T> using acc_t = typename Acc<T>::type;

template <class T> __device__ __forceinline__ acc_t<T> to_acc(T x) { return x; }
template <> __device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
// A NaN keeps its payload (sign, and the mantissa shifted up), as the CPU's f16_to_float does; the
// hardware conversion would give the canonical NaN instead.
template <> __device__ __forceinline__ float to_acc(__half x) {
  const unsigned h = __half_as_ushort(x);
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0u)
    return __uint_as_float(((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
  return __half2float(x);
}

template <class T, class A> __device__ __forceinline__ T from_acc(A x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc(double x) { return __double2bfloat16(x); }
template <> __device__ __forceinline__ __half from_acc(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __half from_acc(double x) { return __double2half(x); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Blocks for a 1-D grid-stride launch over n elements (capped; kernels loop).
inline unsigned grid_for(int64_t n, int threads = 256) {
  int64_t b = ceil_div(n, threads);
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

}  // namespace mt

// Like MT_DISPATCH_FLOAT (runtime/dtype.h) with device storage types: binds `scalar_t` and runs
// the block, e.g. MT_CUDA_DISPATCH_FLOAT(p.x.dtype, "rms_norm", { launch<scalar_t>(p); });
#define MT_CUDA_DTYPE_CASE(enum_name, type, ...) \
  case ::mt::DType::enum_name: {                 \
    using scalar_t = type;                       \
    __VA_ARGS__;                                 \
    break;                                       \
  }
#define MT_CUDA_DISPATCH_FLOAT(dt, name, ...)                                                 \
  switch (dt) {                                                                               \
    MT_CUDA_DTYPE_CASE(kF64, double, __VA_ARGS__)                                             \
    MT_CUDA_DTYPE_CASE(kF32, float, __VA_ARGS__)                                              \
    MT_CUDA_DTYPE_CASE(kBF16, __nv_bfloat16, __VA_ARGS__)                                     \
    MT_CUDA_DTYPE_CASE(kF16, __half, __VA_ARGS__)                                             \
    default:                                                                                  \
      MT_FAIL("{}: dtype {} is not supported on cuda (floating types only)", name,             \
              ::mt::dtype_name(dt));                                                          \
  }

// ---- conversions identical to the CPU's (kernels/cpu/loops.h convert<D>(x)) ---------------------
// Appended for the copy/pointwise/reduce/random kernels; from_acc above stays as it is.
#include <type_traits>

namespace mt {

// float -> bf16 exactly like mt::BFloat16(float): round to nearest even, NaN kept quiet with its
// sign and high payload bits (the CUDA intrinsic returns a canonical NaN instead).
__device__ __forceinline__ __nv_bfloat16 bf16_from_float(float f) {
  uint32_t u = __float_as_uint(f);
  __nv_bfloat16_raw r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.x = static_cast<unsigned short>((u >> 16) | 0x40u);
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    r.x = static_cast<unsigned short>(u >> 16);
  }
  return __nv_bfloat16(r);
}
// float -> f16 like mt::float_to_f16: round to nearest even, NaN -> sign | 0x7e00.
__device__ __forceinline__ __half f16_from_float(float f) {
  if (f != f) {
    __half_raw r;
    r.x = static_cast<unsigned short>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
    return __half(r);
  }
  return __float2half_rn(f);
}
// double -> float rounded to odd (device twin of mt::float_round_to_odd): rounding that once more to a 16-bit
// float gives the correctly rounded value of d.
__device__ __forceinline__ float dev_float_round_to_odd(double d) {
  float f = __double2float_rn(d);
  if (static_cast<double>(f) != d && d == d) {
    uint32_t u = __float_as_uint(f);
    if (!(u & 1u)) {
      u = fabs(static_cast<double>(f)) > fabs(d) ? u - 1 : u + 1;
      f = __uint_as_float(u);
    }
  }
  return f;
}

template <class T> inline constexpr bool kIsHalf = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

template <class D> __device__ __forceinline__ D half_from_float(float f) {
  if constexpr (std::is_same_v<D, __nv_bfloat16>) return bf16_from_float(f);
  else return f16_from_float(f);
}

// Any storage type to any other through their compute types, as on the CPU: to bool is x != 0;
// to bf16/f16 from f64 or an integer rounds once (through round-to-odd); 16-bit floats compute
// in float.
template <class D, class S>
__device__ __forceinline__ D cvt(S x) {
  if constexpr (std::is_same_v<D, S>) {
    return x;
  } else if constexpr (std::is_same_v<D, bool>) {
    return to_acc(x) != acc_t<S>(0);
  } else if constexpr (kIsHalf<D>) {
    if constexpr (std::is_same_v<acc_t<S>, float>) return half_from_float<D>(to_acc(x));
    else return half_from_float<D>(dev_float_round_to_odd(static_cast<double>(to_acc(x))));
  } else if constexpr (std::is_integral_v<D> && !std::is_integral_v<acc_t<S>>) {
    // Floating to integer: truncate to int64, then wrap (the CPU's convert, kernels/cpu/loops.h).
    return static_cast<D>(static_cast<int64_t>(to_acc(x)));
  } else {
    return static_cast<D>(static_cast<acc_t<D>>(to_acc(x)));
  }
}

// V adjacent elements moved as one access (16 bytes when sizeof(T) * V == 16).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
// Whether p may be read or written 16 bytes (one Pack of 16 bytes) at a time.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Scratch memory for the few kernels whose params have no workspace (norm weight-gradient
// partials, index_add sort buffers, attention backward row sums, sum_sq partials): a block of the
// caching allocator on the current device, ordered on its current stream, returned to that
// stream's free list on scope exit. (cudaMallocAsync's default pool gives its memory back to the
// driver at every synchronization, so a training step mapped it again each time.)
class StreamScratch {
 public:
  explicit StreamScratch(size_t bytes) {
    if (bytes) ptr_ = cuda::alloc(bytes, cuda::current_device());
  }
  ~StreamScratch() {
    if (ptr_) cuda::free(ptr_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <class A>
  A* as() const { return static_cast<A*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

}  // namespace mt

// Like MT_CUDA_DISPATCH_FLOAT over all eight dtypes.
#define MT_CUDA_DISPATCH_ALL(dt, name, ...)                 \
  switch (dt) {                                             \
    MT_CUDA_DTYPE_CASE(kF64, double, __VA_ARGS__)           \
    MT_CUDA_DTYPE_CASE(kF32, float, __VA_ARGS__)            \
    MT_CUDA_DTYPE_CASE(kBF16, __nv_bfloat16, __VA_ARGS__)   \
    MT_CUDA_DTYPE_CASE(kF16, __half, __VA_ARGS__)           \
    MT_CUDA_DTYPE_CASE(kI64, int64_t, __VA_ARGS__)          \
    MT_CUDA_DTYPE_CASE(kI32, int32_t, __VA_ARGS__)          \
    MT_CUDA_DTYPE_CASE(kU8, uint8_t, __VA_ARGS__)           \
    MT_CUDA_DTYPE_CASE(kBool, bool, __VA_ARGS__)            \
    default:                                                \
      MT_FAIL("{}: dtype {} is not supported on cuda", name, ::mt::dtype_name(dt)); \
  }
