// Unary, binary and where kernels on CUDA, with the formulas of kernels/cpu/pointwise.cpp over
// the same compute types (float for bf16/f16). Plain IEEE arithmetic (add, sub, mul, div, sqrt,
// comparisons, affine, clamp) gives the CPU's bits; transcendental functions (exp, log, tanh,
// erf, pow, sin, cos) come from CUDA's math library and may differ from glibc by an ulp or two.
// Products and sums are written unfused (__fmul_rn/__fadd_rn) where the CPU does not fuse.
#include <cmath>

#include "kernels/cuda/loops.cuh"
#include "kernels/registry.h"

namespace mt::cuda {
namespace {

constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

// Unfused multiply and add in the compute type (integers: plain operators).
template <class C> __device__ __forceinline__ C mul(C a, C b) {
  if constexpr (std::is_same_v<C, float>) return __fmul_rn(a, b);
  else if constexpr (std::is_same_v<C, double>) return __dmul_rn(a, b);
  else return a * b;
}
template <class C> __device__ __forceinline__ C add(C a, C b) {
  if constexpr (std::is_same_v<C, float>) return __fadd_rn(a, b);
  else if constexpr (std::is_same_v<C, double>) return __dadd_rn(a, b);
  else return a + b;
}

template <class In, class Out, class F>
void map1(const KView& in, const KView& out, F f) {
  const In* x = in.ptr<const In>();
  Out* y = out.ptr<Out>();
  if (dense_aligned<2>(out.sizes, {&in, &out})) return launch_dense_map1(x, y, out.sizes.numel(), f);
  launch_elementwise<2>(out.sizes, {&in, &out}, [=] __device__(const int64_t* o) { y[o[1]] = f(x[o[0]]); });
}

template <class In, class Out, class F>
void map2(const KView& a, const KView& b, const KView& out, F f) {
  const In* x = a.ptr<const In>();
  const In* z = b.ptr<const In>();
  Out* y = out.ptr<Out>();
  if (dense_aligned<3>(out.sizes, {&a, &b, &out})) return launch_dense_map2(x, z, y, out.sizes.numel(), f);
  launch_elementwise<3>(out.sizes, {&a, &b, &out},
                        [=] __device__(const int64_t* o) { y[o[2]] = f(x[o[0]], z[o[1]]); });
}

// f over the compute type, floating dtypes only. F is a functor type with a templated call.
template <class F>
void float_unary(const UnaryParams& p, const char* name, F f) {
  MT_CUDA_DISPATCH_FLOAT(p.in.dtype, name, {
    map1<scalar_t, scalar_t>(p.in, p.out, [=] __device__(scalar_t x) { return cvt<scalar_t>(f(to_acc(x))); });
  });
}

template <class T> using IntOrAcc = std::conditional_t<std::is_same_v<T, bool>, int, acc_t<T>>;

template <class F>
void any_unary(const UnaryParams& p, const char* name, F f) {
  MT_CUDA_DISPATCH_ALL(p.in.dtype, name, {
    using C = IntOrAcc<scalar_t>;
    map1<scalar_t, scalar_t>(p.in, p.out,
                             [=] __device__(scalar_t x) { return cvt<scalar_t>(f(static_cast<C>(to_acc(x)))); });
  });
}

// Functors (generic over float/double/int) for the unary ops.
#define MT_UNARY_FN(Name, body)                                          \
  struct Name {                                                          \
    double a = 0, b = 0;                                                 \
    template <class C> __device__ __forceinline__ C operator()(C x) const { body } \
  };
MT_UNARY_FN(Neg, return -x;)
MT_UNARY_FN(Abs, if constexpr (std::is_unsigned_v<C>) return x; else return x < C(0) ? -x : x;)
MT_UNARY_FN(Relu, return x > C(0) ? x : C(0);)
MT_UNARY_FN(Sign, if constexpr (std::is_unsigned_v<C>) return C(x > C(0)); else return C((x > C(0)) - (x < C(0)));)
MT_UNARY_FN(Exp, return exp(x);)
MT_UNARY_FN(Log, return log(x);)
MT_UNARY_FN(Sqrt, return sqrt(x);)
MT_UNARY_FN(Rsqrt, return C(1) / sqrt(x);)
MT_UNARY_FN(Sin, return sin(x);)
MT_UNARY_FN(Cos, return cos(x);)
MT_UNARY_FN(Reciprocal, return C(1) / x;)
MT_UNARY_FN(Tanh, return tanh(x);)
MT_UNARY_FN(Sigmoid, return C(1) / add(C(1), exp(-x));)
MT_UNARY_FN(Silu, return x / add(C(1), exp(-x));)
MT_UNARY_FN(SiluGrad, C s = C(1) / add(C(1), exp(-x)); return mul(s, add(C(1), mul(x, C(1) - s)));)
MT_UNARY_FN(Gelu, return mul(mul(C(0.5), x), add(C(1), erf(x / C(kSqrt2))));)
MT_UNARY_FN(GeluGrad, return add(mul(C(0.5), add(C(1), erf(x / C(kSqrt2)))),
                                 mul(mul(x, C(kInvSqrt2Pi)), exp(mul(mul(C(-0.5), x), x))));)
MT_UNARY_FN(GeluTanh, C inner = mul(C(kSqrt2OverPi), add(x, mul(mul(mul(C(0.044715), x), x), x)));
            return mul(mul(C(0.5), x), add(C(1), tanh(inner)));)
MT_UNARY_FN(GeluTanhGrad, C t = tanh(mul(C(kSqrt2OverPi), add(x, mul(mul(mul(C(0.044715), x), x), x))));
            return add(mul(C(0.5), add(C(1), t)),
                       mul(mul(mul(mul(C(0.5), x), C(1) - mul(t, t)), C(kSqrt2OverPi)),
                           add(C(1), mul(mul(C(3 * 0.044715), x), x))));)
MT_UNARY_FN(PowScalar, if (a == 2) return mul(x, x); if (a == 1) return x; if (a == 0.5) return sqrt(x);
            return static_cast<C>(pow(x, static_cast<C>(a)));)
#undef MT_UNARY_FN

template <class F>
F with_args(double a, double b) {
  F f;
  f.a = a;
  f.b = b;
  return f;
}

void unary(const UnaryParams& p) {
  const double a = p.alpha, b = p.beta;
  switch (p.op) {
    case UnaryOp::kNeg: return any_unary(p, "neg", Neg{});
    case UnaryOp::kAbs: return any_unary(p, "abs", Abs{});
    case UnaryOp::kRelu: return any_unary(p, "relu", Relu{});
    case UnaryOp::kSign: return any_unary(p, "sign", Sign{});
    case UnaryOp::kAffine: {
      MT_CUDA_DISPATCH_ALL(p.in.dtype, "affine", {
        using T = scalar_t;
        if constexpr (std::is_integral_v<T>) {
          // Integer scalars: exact wrapping 64-bit arithmetic, as on the CPU.
          if (a == std::floor(a) && b == std::floor(b) && std::fabs(a) < 0x1p63 && std::fabs(b) < 0x1p63) {
            const auto ia = static_cast<uint64_t>(static_cast<int64_t>(a));
            const auto ib = static_cast<uint64_t>(static_cast<int64_t>(b));
            map1<T, T>(p.in, p.out, [=] __device__(T x) {
              return cvt<T>(static_cast<int64_t>(ia * static_cast<uint64_t>(static_cast<int64_t>(x)) + ib));
            });
            return;
          }
          map1<T, T>(p.in, p.out, [=] __device__(T x) { return cvt<T>(add(mul(a, static_cast<double>(x)), b)); });
        } else {
          using C = acc_t<T>;
          const C ca = static_cast<C>(a), cb = static_cast<C>(b);
          map1<T, T>(p.in, p.out, [=] __device__(T x) { return cvt<T>(add(mul(ca, to_acc(x)), cb)); });
        }
      });
      return;
    }
    case UnaryOp::kClamp: {
      MT_CUDA_DISPATCH_ALL(p.in.dtype, "clamp", {
        using T = scalar_t;
        map1<T, T>(p.in, p.out, [=] __device__(T x) {
          const double v = static_cast<double>(to_acc(x));
          if (v != v || (v >= a && v <= b)) return x;
          return cvt<T>(v < a ? a : (v > b ? b : v));
        });
      });
      return;
    }
    case UnaryOp::kLogicalNot: {
      MT_CUDA_DISPATCH_ALL(p.in.dtype, "logical_not", {
        map1<scalar_t, bool>(p.in, p.out, [] __device__(scalar_t x) { return !cvt<bool>(x); });
      });
      return;
    }
    case UnaryOp::kExp: return float_unary(p, "exp", Exp{});
    case UnaryOp::kLog: return float_unary(p, "log", Log{});
    case UnaryOp::kSqrt: return float_unary(p, "sqrt", Sqrt{});
    case UnaryOp::kRsqrt: return float_unary(p, "rsqrt", Rsqrt{});
    case UnaryOp::kSin: return float_unary(p, "sin", Sin{});
    case UnaryOp::kCos: return float_unary(p, "cos", Cos{});
    case UnaryOp::kReciprocal: return float_unary(p, "reciprocal", Reciprocal{});
    case UnaryOp::kTanh: return float_unary(p, "tanh", Tanh{});
    case UnaryOp::kSigmoid: return float_unary(p, "sigmoid", Sigmoid{});
    case UnaryOp::kSilu: return float_unary(p, "silu", Silu{});
    case UnaryOp::kSiluGrad: return float_unary(p, "silu_grad", SiluGrad{});
    case UnaryOp::kGelu: return float_unary(p, "gelu", Gelu{});
    case UnaryOp::kGeluGrad: return float_unary(p, "gelu_grad", GeluGrad{});
    case UnaryOp::kGeluTanh: return float_unary(p, "gelu_tanh", GeluTanh{});
    case UnaryOp::kGeluTanhGrad: return float_unary(p, "gelu_tanh_grad", GeluTanhGrad{});
    case UnaryOp::kPowScalar: return float_unary(p, "pow", with_args<PowScalar>(a, b));
  }
  MT_ASSERT(false, "unknown unary op {}", static_cast<int>(p.op));
}

// Binary functors over the compute type C (int for bool, like the CPU's integer promotion).
struct Add { template <class C> __device__ C operator()(C x, C y) const { return add(x, y); } };
struct Sub { template <class C> __device__ C operator()(C x, C y) const { return x - y; } };
struct Mul { template <class C> __device__ C operator()(C x, C y) const { return mul(x, y); } };
struct Div {
  template <class C> __device__ C operator()(C x, C y) const {
    if constexpr (std::is_integral_v<C>) return y == 0 ? C(0) : C(x / y);
    else return x / y;
  }
};
struct Maximum { template <class C> __device__ C operator()(C x, C y) const { return (x != x || x > y) ? x : y; } };
struct Minimum { template <class C> __device__ C operator()(C x, C y) const { return (x != x || x < y) ? x : y; } };
struct Pow {
  template <class C> __device__ C operator()(C x, C y) const {
    if constexpr (std::is_integral_v<C>) return static_cast<C>(pow(static_cast<double>(x), static_cast<double>(y)));
    else return pow(x, y);
  }
};
// silu(x) / silu'(x) as the unary ops compute them, rounded to T as they store them, times y.
template <class T>
struct SiluMul {
  template <class C> __device__ C operator()(C x, C y) const {
    if constexpr (std::is_floating_point_v<C>) return mul(static_cast<C>(to_acc(cvt<T>(Silu{}(x)))), y);
    else return C(0);
  }
};
template <class T>
struct SiluGradMul {
  template <class C> __device__ C operator()(C x, C y) const {
    if constexpr (std::is_floating_point_v<C>) return mul(static_cast<C>(to_acc(cvt<T>(SiluGrad{}(x)))), y);
    else return C(0);
  }
};
struct Eq { template <class C> __device__ bool operator()(C x, C y) const { return x == y; } };
struct Ne { template <class C> __device__ bool operator()(C x, C y) const { return x != y; } };
struct Lt { template <class C> __device__ bool operator()(C x, C y) const { return x < y; } };
struct Le { template <class C> __device__ bool operator()(C x, C y) const { return x <= y; } };
struct Gt { template <class C> __device__ bool operator()(C x, C y) const { return x > y; } };
struct Ge { template <class C> __device__ bool operator()(C x, C y) const { return x >= y; } };
struct And { template <class C> __device__ bool operator()(C x, C y) const { return x != C(0) && y != C(0); } };
struct Or { template <class C> __device__ bool operator()(C x, C y) const { return x != C(0) || y != C(0); } };

template <class T, class F>
void arith(const BinaryParams& p, F f) {
  using C = IntOrAcc<T>;
  map2<T, T>(p.a, p.b, p.out, [=] __device__(T x, T y) {
    return cvt<T>(f(static_cast<C>(to_acc(x)), static_cast<C>(to_acc(y))));
  });
}

template <class T, class F>
void compare(const BinaryParams& p, F f) {
  using C = acc_t<T>;
  map2<T, bool>(p.a, p.b, p.out, [=] __device__(T x, T y) { return f(C(to_acc(x)), C(to_acc(y))); });
}

void binary(const BinaryParams& p) {
  MT_CUDA_DISPATCH_ALL(p.a.dtype, "binary", {
    using T = scalar_t;
    switch (p.op) {
      case BinaryOp::kAdd: arith<T>(p, Add{}); break;
      case BinaryOp::kSub: arith<T>(p, Sub{}); break;
      case BinaryOp::kMul: arith<T>(p, Mul{}); break;
      case BinaryOp::kDiv: arith<T>(p, Div{}); break;
      case BinaryOp::kMaximum: arith<T>(p, Maximum{}); break;
      case BinaryOp::kMinimum: arith<T>(p, Minimum{}); break;
      case BinaryOp::kPow: arith<T>(p, Pow{}); break;
      case BinaryOp::kSiluMul:
      case BinaryOp::kSiluGradMul:
        MT_CHECK(is_floating(p.a.dtype), "{}: floating dtypes only, got {}",
                 p.op == BinaryOp::kSiluMul ? "silu_mul" : "silu_grad_mul", dtype_name(p.a.dtype));
        if (p.op == BinaryOp::kSiluMul)
          arith<T>(p, SiluMul<T>{});
        else
          arith<T>(p, SiluGradMul<T>{});
        break;
      case BinaryOp::kEq: compare<T>(p, Eq{}); break;
      case BinaryOp::kNe: compare<T>(p, Ne{}); break;
      case BinaryOp::kLt: compare<T>(p, Lt{}); break;
      case BinaryOp::kLe: compare<T>(p, Le{}); break;
      case BinaryOp::kGt: compare<T>(p, Gt{}); break;
      case BinaryOp::kGe: compare<T>(p, Ge{}); break;
      case BinaryOp::kLogicalAnd: compare<T>(p, And{}); break;
      case BinaryOp::kLogicalOr: compare<T>(p, Or{}); break;
    }
  });
}

// ---- silu_mul_bwd (params.h): SwiGLU's backward in one pass -----------------------------------

// da = silu'(x) (g y), db = silu(x) g with binary's kMul, kSiluGradMul and kSiluMul roundings.
template <class T>
struct SiluMulBwd {
  __device__ void operator()(T x, T y, T g, T& da, T& db) const {
    using C = acc_t<T>;
    const C cx = to_acc(x), cg = to_acc(g);
    const T gy = cvt<T>(Mul{}(cg, C(to_acc(y))));
    da = cvt<T>(SiluGradMul<T>{}(cx, C(to_acc(gy))));
    db = cvt<T>(SiluMul<T>{}(cx, cg));
  }
};

template <int V, class T>
__global__ void dense_silu_mul_bwd(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ g,
                                   T* __restrict__ da, T* __restrict__ db, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  const SiluMulBwd<T> f;
  for (int64_t i = tid; i < packs; i += step) {
    const Pack<T, V> x = reinterpret_cast<const Pack<T, V>*>(a)[i];
    const Pack<T, V> y = reinterpret_cast<const Pack<T, V>*>(b)[i];
    const Pack<T, V> z = reinterpret_cast<const Pack<T, V>*>(g)[i];
    Pack<T, V> ra, rb;
#pragma unroll
    for (int k = 0; k < V; ++k) f(x.v[k], y.v[k], z.v[k], ra.v[k], rb.v[k]);
    reinterpret_cast<Pack<T, V>*>(da)[i] = ra;
    reinterpret_cast<Pack<T, V>*>(db)[i] = rb;
  }
  for (int64_t i = packs * V + tid; i < n; i += step) f(a[i], b[i], g[i], da[i], db[i]);
}

void silu_mul_bwd(const SiluMulBwdParams& p) {
  MT_CUDA_DISPATCH_FLOAT(p.a.dtype, "silu_mul_bwd", {
    using T = scalar_t;
    const T* a = p.a.ptr<const T>();
    const T* b = p.b.ptr<const T>();
    const T* g = p.g.ptr<const T>();
    T* da = p.da.ptr<T>();
    T* db = p.db.ptr<T>();
    const Shape& sizes = p.da.sizes;
    if (dense_aligned<5>(sizes, {&p.a, &p.b, &p.g, &p.da, &p.db})) {
      constexpr int V = pack_width<T>();
      constexpr int kThreads = 256;
      const int64_t n = sizes.numel();
      dense_silu_mul_bwd<V, T><<<grid_for(ceil_div(n, V), kThreads), kThreads, 0, current_stream()>>>(a, b, g, da,
                                                                                                  db, n);
      MT_CUDA_LAUNCH_CHECK();
    } else {
      launch_elementwise<5>(sizes, {&p.a, &p.b, &p.g, &p.da, &p.db}, [=] __device__(const int64_t* o) {
        SiluMulBwd<T>{}(a[o[0]], b[o[1]], g[o[2]], da[o[3]], db[o[4]]);
      });
    }
  });
}

// where moves elements without arithmetic: dispatch on the element size only.
template <class U>
void where_bits(const WhereParams& p) {
  const bool* c = p.cond.ptr<const bool>();
  const U* a = p.a.ptr<const U>();
  const U* b = p.b.ptr<const U>();
  U* out = p.out.ptr<U>();
  launch_elementwise<4>(p.out.sizes, {&p.cond, &p.a, &p.b, &p.out},
                        [=] __device__(const int64_t* o) { out[o[3]] = c[o[0]] ? a[o[1]] : b[o[2]]; });
}

void where(const WhereParams& p) {
  switch (dtype_size(p.a.dtype)) {
    case 1: return where_bits<uint8_t>(p);
    case 2: return where_bits<uint16_t>(p);
    case 4: return where_bits<uint32_t>(p);
    default: return where_bits<uint64_t>(p);
  }
}

}  // namespace
}  // namespace mt::cuda

namespace mt {
void register_cuda_pointwise(KernelTable& t) {
  t.unary = cuda::unary;
  t.binary = cuda::binary;
  t.silu_mul_bwd = cuda::silu_mul_bwd;
  t.where = cuda::where;
}
}  // namespace mt
