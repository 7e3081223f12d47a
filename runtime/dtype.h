// Element types. bf16 and f16 are storage types with round-to-nearest-even conversion from
// float; arithmetic on them happens in float (see compute_t). This lives in runtime/ rather than
// tensor/ because kernels/ (below tensor/) must name dtypes too.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mt {

enum class DType : uint8_t { kF64, kF32, kBF16, kF16, kI64, kI32, kU8, kBool };
inline constexpr int kNumDTypes = 8;

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) {  // NOLINT: implicit on purpose, like a builtin float type
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  operator float() const {  // NOLINT
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  Float16(float f);           // NOLINT
  operator float() const;     // NOLINT
};

float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);
inline Float16::Float16(float f) : bits(float_to_f16(f)) {}
inline Float16::operator float() const { return f16_to_float(bits); }

const char* dtype_name(DType t);
int64_t dtype_size(DType t);
inline bool is_floating(DType t) { return t <= DType::kF16; }
inline bool is_integral(DType t) { return t >= DType::kI64; }  // bool counts as integral

// Result type of a binary op, PyTorch-like: bool < u8 < i32 < i64 < f16/bf16 < f32 < f64, with
// bf16 + f16 = f32.
DType promote(DType a, DType b);

// d rounded to float with round-to-odd: rounding the result once more to bf16 or f16 (nearest
// even) then gives the correctly rounded value of d, which double -> float -> half would not.
inline float float_round_to_odd(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) != d && !std::isnan(d)) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (!(u & 1u)) {  // even neighbour: take the odd one on the other side of d
      u = std::fabs(static_cast<double>(f)) > std::fabs(d) ? u - 1 : u + 1;
      std::memcpy(&f, &u, 4);
    }
  }
  return f;
}

template <class T> struct dtype_of;
template <> struct dtype_of<double> { static constexpr DType value = DType::kF64; };
template <> struct dtype_of<float> { static constexpr DType value = DType::kF32; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct dtype_of<Float16> { static constexpr DType value = DType::kF16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::kBool; };

// Type arithmetic happens in: float for the 16-bit floats, the type itself otherwise.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<BFloat16> { using type = float; };
template <> struct compute_type<Float16> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

}  // namespace mt

// Kernel dispatch over dtypes: the body sees `scalar_t`.
#define MT_DTYPE_CASE(enum_v, type, ...) \
  case ::mt::DType::enum_v: {            \
    using scalar_t = type;               \
    __VA_ARGS__;                         \
    break;                               \
  }

#define MT_DISPATCH_FLOAT(dt, name, ...)                                              \
  switch (dt) {                                                                       \
    MT_DTYPE_CASE(kF64, double, __VA_ARGS__)                                          \
    MT_DTYPE_CASE(kF32, float, __VA_ARGS__)                                           \
    MT_DTYPE_CASE(kBF16, ::mt::BFloat16, __VA_ARGS__)                                 \
    MT_DTYPE_CASE(kF16, ::mt::Float16, __VA_ARGS__)                                   \
    default:                                                                          \
      MT_FAIL("{}: dtype {} is not supported (floating types only)", name, ::mt::dtype_name(dt)); \
  }

#define MT_DISPATCH_ALL(dt, name, ...)                        \
  switch (dt) {                                               \
    MT_DTYPE_CASE(kF64, double, __VA_ARGS__)                  \
    MT_DTYPE_CASE(kF32, float, __VA_ARGS__)                   \
    MT_DTYPE_CASE(kBF16, ::mt::BFloat16, __VA_ARGS__)         \
    MT_DTYPE_CASE(kF16, ::mt::Float16, __VA_ARGS__)           \
    MT_DTYPE_CASE(kI64, int64_t, __VA_ARGS__)                 \
    MT_DTYPE_CASE(kI32, int32_t, __VA_ARGS__)                 \
    MT_DTYPE_CASE(kU8, uint8_t, __VA_ARGS__)                  \
    MT_DTYPE_CASE(kBool, bool, __VA_ARGS__)                   \
  }

#define MT_DISPATCH_INDEX(dt, name, ...)                                                   \
  switch (dt) {                                                                            \
    MT_DTYPE_CASE(kI64, int64_t, __VA_ARGS__)                                              \
    MT_DTYPE_CASE(kI32, int32_t, __VA_ARGS__)                                              \
    default:                                                                               \
      MT_FAIL("{}: index dtype {} is not supported (i64 or i32)", name, ::mt::dtype_name(dt)); \
  }

template <>
struct fmt::formatter<mt::DType> : fmt::formatter<std::string_view> {
  auto format(mt::DType t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(mt::dtype_name(t), ctx);
  }
};
