// Vectorizable math for the CPU kernels: an f32 exp the compiler can turn into SIMD code, and sums
// with a fixed number of accumulator lanes. Both give the same bits whether a loop runs them
// vectorized or one element at a time, wherever the element sits in memory: no library calls, no
// alignment-dependent head or tail (Eigen's array functions compute a misaligned head with std::exp
// and the rest with their own polynomial, so an element's value would depend on its address).
// Requires -ffp-contract=off (meson.build): every a * b + c here rounds twice, as written.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mt::cpu {

// e^x in f32 within 1 ulp of the exact value (measured over every float in [-87.3, 88.7]:
// tests/tensor/test_vmath.cpp). Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, a degree-7
// polynomial for e^r (the minimax coefficients of the Cephes library's expf), then 2^n as two
// normal factors. Results below FLT_MIN (x < -87.34) are 0 (std::exp would give a subnormal);
// x > 88.72 gives inf, NaN stays NaN.
inline float exp_f32(float x) {
  constexpr float kHi = 88.72283935546875f;
  constexpr float kLo = -87.33654022216797f;
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // Clamped so that n is a small integer; NaN lands on kHi (the comparison is false), so the
  // conversion to int below stays defined, and is passed through at the end.
  float xc = x < kHi ? x : kHi;
  xc = xc > kLo ? xc : kLo;
  const float n = (xc * 1.44269504088896341f + kShifter) - kShifter;
  float r = xc - n * 0.693359375f;  // ln2's high part: n * it is exact for |n| <= 128
  r = r - n * -2.12194440e-4f;      // and its low part
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * (r * r) + r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1, n2 = ni - n1;  // n in [-126, 128]: each half a normal exponent
  const int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  y = y * s1 * s2;
  y = x > kHi ? HUGE_VALF : y;
  y = x < kLo ? 0.0f : y;
  return x != x ? x : y;
}

// The exp of a kernel's compute type: exp_f32 for float (f32, bf16, f16 data), std::exp for
// double (f64 data, the gradient checks' type, keeps libm's correctly rounded exp).
template <class C>
inline C exp_c(C x) {
  if constexpr (std::is_same_v<C, float>)
    return exp_f32(x);
  else
    return std::exp(x);
}

inline constexpr int kSumLanes = 8;

// sum over i in [0, n) of f(i) in double, element i added into lane i % 8, the lanes combined as
// ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)): a fixed order the compiler can vectorize (a single
// running sum is a chain of dependent adds it must keep in order).
template <class F>
inline double lane_sum(int64_t n, F&& f) {
  double acc[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) acc[l] += f(i + l);
  for (int l = 0; i + l < n; ++l) acc[l] += f(i + l);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// max over i in [0, n) of f(i) (float), in the same 8 lanes: exact in any order, but one running
// max is a chain the compiler will not vectorize under strict IEEE semantics. NaNs are skipped
// (the comparison is false), -inf for n == 0.
template <class F>
inline float lane_max(int64_t n, F&& f) {
  float acc[kSumLanes];
  for (float& a : acc) a = -HUGE_VALF;
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) {
      const float v = f(i + l);
      acc[l] = v > acc[l] ? v : acc[l];
    }
  for (int l = 0; i + l < n; ++l) {
    const float v = f(i + l);
    acc[l] = v > acc[l] ? v : acc[l];
  }
  float m = acc[0];
  for (int l = 1; l < kSumLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

}  // namespace mt::cpu
