// Unary, binary and where kernels on the CPU. Each op is a small lambda over the compute type
// (float for bf16/f16), run by strided_loop with a contiguous fast path that the compiler
// vectorizes. exp in float is kernels/cpu/vmath.h's exp_f32 (vectorizable, within 1 ulp), in
// double libm's; silu, sigmoid and the fused SwiGLU kernels share it, so fused and unfused agree.
#include <cmath>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/vmath.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

template <class In, class Out, class F>
void map1(const KView& in, const KView& out, F f) {
  strided_loop<2>(out.sizes, {&in, &out}, [&](char** p, int64_t n, const int64_t* s) {
    if (s[0] == sizeof(In) && s[1] == sizeof(Out)) {
      const auto* x = reinterpret_cast<const In*>(p[0]);
      auto* y = reinterpret_cast<Out*>(p[1]);
      for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[1] + i * s[1]) = f(load<In>(p[0] + i * s[0]));
    }
  });
}

template <class In, class Out, class F>
void map2(const KView& a, const KView& b, const KView& out, F f) {
  strided_loop<3>(out.sizes, {&a, &b, &out}, [&](char** p, int64_t n, const int64_t* s) {
    auto* y = reinterpret_cast<Out*>(p[2]);
    if (s[0] == sizeof(In) && s[1] == sizeof(In) && s[2] == sizeof(Out)) {
      const auto* x0 = reinterpret_cast<const In*>(p[0]);
      const auto* x1 = reinterpret_cast<const In*>(p[1]);
      for (int64_t i = 0; i < n; ++i) y[i] = f(x0[i], x1[i]);
    } else if (s[0] == sizeof(In) && s[1] == 0 && s[2] == sizeof(Out)) {  // tensor op scalar
      const auto* x0 = reinterpret_cast<const In*>(p[0]);
      const In x1 = load<In>(p[1]);
      for (int64_t i = 0; i < n; ++i) y[i] = f(x0[i], x1);
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[2] + i * s[2]) = f(load<In>(p[0] + i * s[0]), load<In>(p[1] + i * s[1]));
    }
  });
}

// Applies f over the compute type of T, for floating T only.
template <class F>
void float_unary(const UnaryParams& p, const char* name, F f) {
  MT_DISPATCH_FLOAT(p.in.dtype, name, {
    using C = compute_t<scalar_t>;
    map1<scalar_t, scalar_t>(p.in, p.out, [&](scalar_t x) { return scalar_t(f(C(x))); });
  });
}

template <class F>
void any_unary(const UnaryParams& p, const char* name, F f) {
  (void)name;
  MT_DISPATCH_ALL(p.in.dtype, name, {
    using C = std::conditional_t<std::is_same_v<scalar_t, bool>, int, compute_t<scalar_t>>;
    map1<scalar_t, scalar_t>(p.in, p.out, [&](scalar_t x) { return convert<scalar_t>(f(C(x))); });
  });
}

void unary(const UnaryParams& p) {
  const double a = p.alpha, b = p.beta;
  switch (p.op) {
    case UnaryOp::kNeg: return any_unary(p, "neg", [](auto x) { return -x; });
    case UnaryOp::kAbs: return any_unary(p, "abs", [](auto x) { return x < 0 ? -x : x; });
    case UnaryOp::kRelu: return any_unary(p, "relu", [](auto x) { return x > 0 ? x : decltype(x)(0); });
    case UnaryOp::kSign:
      return any_unary(p, "sign", [](auto x) { return decltype(x)((x > 0) - (x < 0)); });
    case UnaryOp::kAffine:
      { MT_DISPATCH_ALL(p.in.dtype, "affine", {
        using C = std::conditional_t<std::is_floating_point_v<compute_t<scalar_t>>, compute_t<scalar_t>, double>;
        if constexpr (!std::is_floating_point_v<compute_t<scalar_t>>) {
          // Integer scalars on an integer tensor: exact in 64-bit (wrapping) arithmetic, since
          // double would lose the low bits of large i64 values.
          if (a == std::floor(a) && b == std::floor(b) && std::fabs(a) < 0x1p63 && std::fabs(b) < 0x1p63) {
            const auto ia = static_cast<uint64_t>(static_cast<int64_t>(a));
            const auto ib = static_cast<uint64_t>(static_cast<int64_t>(b));
            map1<scalar_t, scalar_t>(p.in, p.out, [&](scalar_t x) {
              return convert<scalar_t>(static_cast<int64_t>(ia * static_cast<uint64_t>(static_cast<int64_t>(x)) + ib));
            });
            return;
          }
        }
        const C ca = static_cast<C>(a), cb = static_cast<C>(b);
        map1<scalar_t, scalar_t>(p.in, p.out, [&](scalar_t x) { return convert<scalar_t>(ca * C(compute_t<scalar_t>(x)) + cb); });
      }); return; }
    case UnaryOp::kClamp:
      { MT_DISPATCH_ALL(p.in.dtype, "clamp", {
        map1<scalar_t, scalar_t>(p.in, p.out, [&](scalar_t x) {
          double v = static_cast<double>(compute_t<scalar_t>(x));
          if (std::isnan(v) || (v >= a && v <= b)) return x;  // unchanged (exact for large i64)
          return convert<scalar_t>(v < a ? a : (v > b ? b : v));
        });
      }); return; }
    case UnaryOp::kLogicalNot:
      { MT_DISPATCH_ALL(p.in.dtype, "logical_not", {
        map1<scalar_t, bool>(p.in, p.out, [](scalar_t x) { return !convert<bool>(x); });
      }); return; }
    case UnaryOp::kExp: return float_unary(p, "exp", [](auto x) { return exp_c(x); });
    case UnaryOp::kLog: return float_unary(p, "log", [](auto x) { return std::log(x); });
    case UnaryOp::kSqrt: return float_unary(p, "sqrt", [](auto x) { return std::sqrt(x); });
    case UnaryOp::kRsqrt: return float_unary(p, "rsqrt", [](auto x) { return decltype(x)(1) / std::sqrt(x); });
    case UnaryOp::kSin: return float_unary(p, "sin", [](auto x) { return std::sin(x); });
    case UnaryOp::kCos: return float_unary(p, "cos", [](auto x) { return std::cos(x); });
    case UnaryOp::kReciprocal: return float_unary(p, "reciprocal", [](auto x) { return decltype(x)(1) / x; });
    case UnaryOp::kTanh: return float_unary(p, "tanh", [](auto x) { return std::tanh(x); });
    case UnaryOp::kSigmoid:
      return float_unary(p, "sigmoid", [](auto x) { return decltype(x)(1) / (decltype(x)(1) + exp_c(-x)); });
    case UnaryOp::kSilu:
      return float_unary(p, "silu", [](auto x) { return x / (decltype(x)(1) + exp_c(-x)); });
    case UnaryOp::kSiluGrad:
      return float_unary(p, "silu_grad", [](auto x) {
        using C = decltype(x);
        C s = C(1) / (C(1) + exp_c(-x));
        return s * (C(1) + x * (C(1) - s));
      });
    case UnaryOp::kGelu:
      return float_unary(p, "gelu", [](auto x) {
        using C = decltype(x);
        return C(0.5) * x * (C(1) + std::erf(x / C(kSqrt2)));
      });
    case UnaryOp::kGeluGrad:
      return float_unary(p, "gelu_grad", [](auto x) {
        using C = decltype(x);
        return C(0.5) * (C(1) + std::erf(x / C(kSqrt2))) + x * C(kInvSqrt2Pi) * std::exp(C(-0.5) * x * x);
      });
    case UnaryOp::kGeluTanh:
      return float_unary(p, "gelu_tanh", [](auto x) {
        using C = decltype(x);
        return C(0.5) * x * (C(1) + std::tanh(C(kSqrt2OverPi) * (x + C(0.044715) * x * x * x)));
      });
    case UnaryOp::kGeluTanhGrad:
      return float_unary(p, "gelu_tanh_grad", [](auto x) {
        using C = decltype(x);
        C t = std::tanh(C(kSqrt2OverPi) * (x + C(0.044715) * x * x * x));
        return C(0.5) * (C(1) + t) +
               C(0.5) * x * (C(1) - t * t) * C(kSqrt2OverPi) * (C(1) + C(3 * 0.044715) * x * x);
      });
    case UnaryOp::kPowScalar:
      return float_unary(p, "pow", [a](auto x) {
        using C = decltype(x);
        if (a == 2) return x * x;
        if (a == 1) return x;
        if (a == 0.5) return std::sqrt(x);
        return static_cast<C>(std::pow(x, static_cast<C>(a)));
      });
  }
  MT_ASSERT(false, "unknown unary op {}", static_cast<int>(p.op));
}

template <class T, class F>
void arith(const BinaryParams& p, F f) {
  using C = compute_t<T>;
  map2<T, T>(p.a, p.b, p.out, [&](T x, T y) { return convert<T>(f(C(x), C(y))); });
}

template <class T, class F>
void compare(const BinaryParams& p, F f) {
  using C = compute_t<T>;
  map2<T, bool>(p.a, p.b, p.out, [&](T x, T y) { return f(C(x), C(y)); });
}

void binary(const BinaryParams& p) {
  MT_DISPATCH_ALL(p.a.dtype, "binary", {
    using T = scalar_t;
    switch (p.op) {
      case BinaryOp::kAdd: arith<T>(p, [](auto x, auto y) { return x + y; }); break;
      case BinaryOp::kSub: arith<T>(p, [](auto x, auto y) { return x - y; }); break;
      case BinaryOp::kMul: arith<T>(p, [](auto x, auto y) { return x * y; }); break;
      case BinaryOp::kDiv:
        arith<T>(p, [](auto x, auto y) {
          if constexpr (std::is_integral_v<decltype(x)>) return y == 0 ? decltype(x)(0) : decltype(x)(x / y);
          else return x / y;
        });
        break;
      case BinaryOp::kMaximum:
        arith<T>(p, [](auto x, auto y) { return (x != x || x > y) ? x : y; });
        break;
      case BinaryOp::kMinimum:
        arith<T>(p, [](auto x, auto y) { return (x != x || x < y) ? x : y; });
        break;
      case BinaryOp::kPow:
        arith<T>(p, [](auto x, auto y) { return static_cast<decltype(x)>(std::pow(x, y)); });
        break;
      case BinaryOp::kSiluMul:
      case BinaryOp::kSiluGradMul:
        if constexpr (std::is_floating_point_v<compute_t<T>>) {
          // The unary silu / silu_grad formulas, rounded to T as those ops store them, then mul.
          if (p.op == BinaryOp::kSiluMul)
            arith<T>(p, [](auto x, auto y) {
              using C = decltype(x);
              return C(T(x / (C(1) + exp_c(-x)))) * y;
            });
          else
            arith<T>(p, [](auto x, auto y) {
              using C = decltype(x);
              const C s = C(1) / (C(1) + exp_c(-x));
              return C(T(s * (C(1) + x * (C(1) - s)))) * y;
            });
        } else {
          MT_FAIL("{}: floating dtypes only, got {}", p.op == BinaryOp::kSiluMul ? "silu_mul" : "silu_grad_mul",
                  dtype_name(p.a.dtype));
        }
        break;
      case BinaryOp::kEq: compare<T>(p, [](auto x, auto y) { return x == y; }); break;
      case BinaryOp::kNe: compare<T>(p, [](auto x, auto y) { return x != y; }); break;
      case BinaryOp::kLt: compare<T>(p, [](auto x, auto y) { return x < y; }); break;
      case BinaryOp::kLe: compare<T>(p, [](auto x, auto y) { return x <= y; }); break;
      case BinaryOp::kGt: compare<T>(p, [](auto x, auto y) { return x > y; }); break;
      case BinaryOp::kGe: compare<T>(p, [](auto x, auto y) { return x >= y; }); break;
      case BinaryOp::kLogicalAnd: compare<T>(p, [](auto x, auto y) { return x != 0 && y != 0; }); break;
      case BinaryOp::kLogicalOr: compare<T>(p, [](auto x, auto y) { return x != 0 || y != 0; }); break;
    }
  });
}

// SwiGLU's backward in one pass (params.h): the formulas of binary's kMul, kSiluGradMul and
// kSiluMul above, rounded to T where those kernels store their results.
void silu_mul_bwd(const SiluMulBwdParams& p) {
  MT_DISPATCH_FLOAT(p.a.dtype, "silu_mul_bwd", {
    using T = scalar_t;
    using C = compute_t<T>;
    const auto one = [](C x, C y, C g, T& da, T& db) {
      const C gy = C(convert<T>(g * y));
      const C e = exp_c(-x);  // one exp for both formulas: the same value either would compute
      const C sig = C(1) / (C(1) + e);
      da = convert<T>(C(T(sig * (C(1) + x * (C(1) - sig)))) * gy);
      db = convert<T>(C(T(x / (C(1) + e))) * g);
    };
    strided_loop<5>(p.da.sizes, {&p.a, &p.b, &p.g, &p.da, &p.db}, [&](char** q, int64_t n, const int64_t* s) {
      bool dense = true;
      for (int k = 0; k < 5; ++k) dense = dense && s[k] == static_cast<int64_t>(sizeof(T));
      if (dense) {  // the contiguous case, in a loop the compiler vectorizes
        const T *a = reinterpret_cast<const T*>(q[0]), *b = reinterpret_cast<const T*>(q[1]);
        const T* g = reinterpret_cast<const T*>(q[2]);
        T *da = reinterpret_cast<T*>(q[3]), *db = reinterpret_cast<T*>(q[4]);
        for (int64_t i = 0; i < n; ++i) one(C(a[i]), C(b[i]), C(g[i]), da[i], db[i]);
      } else {
        for (int64_t i = 0; i < n; ++i)
          one(C(load<T>(q[0] + i * s[0])), C(load<T>(q[1] + i * s[1])), C(load<T>(q[2] + i * s[2])),
              *reinterpret_cast<T*>(q[3] + i * s[3]), *reinterpret_cast<T*>(q[4] + i * s[4]));
      }
    });
  });
}

void where(const WhereParams& p) {
  MT_DISPATCH_ALL(p.a.dtype, "where", {
    using T = scalar_t;
    strided_loop<4>(p.out.sizes, {&p.cond, &p.a, &p.b, &p.out}, [](char** q, int64_t n, const int64_t* s) {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(q[3] + i * s[3]) =
            load<bool>(q[0] + i * s[0]) ? load<T>(q[1] + i * s[1]) : load<T>(q[2] + i * s[2]);
    });
  });
}

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_pointwise(KernelTable& t) {
  t.unary = cpu::unary;
  t.binary = cpu::binary;
  t.silu_mul_bwd = cpu::silu_mul_bwd;
  t.where = cpu::where;
}
}  // namespace mt
