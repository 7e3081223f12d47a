// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the
// element mapping of docs/rng.md, written once for host and device: the value of a random tensor
// at global element j is a pure function of (seed, offset, j, distribution, parameters), so the
// CPU kernel, a future CUDA kernel and every shard of a tensor produce the same bits.
// Header-only; nothing here may call host-only code (the core must compile under nvcc).
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt::philox {

inline constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
inline constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments

struct U32x4 {
  uint32_t v[4];
};

MT_HOST_DEVICE inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Ten rounds with the key bumped between rounds, exactly as Random123's philox4x32_R(10, ...).
MT_HOST_DEVICE inline U32x4 philox4x32_10(U32x4 c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(kM0, c.v[0], &hi0);
    const uint32_t lo1 = mulhilo(kM1, c.v[2], &hi1);
    c = U32x4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// Block b of the stream of `seed`: key = (lo32(seed), hi32(seed)), counter = (lo32(b), hi32(b), 0, 0).
MT_HOST_DEVICE inline U32x4 block(uint64_t seed, uint64_t b) {
  U32x4 c{{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), 0u, 0u}};
  return philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// ---- uint32 -> floating conversions (all exact: no rounding happens inside them) --------------

// 24 high bits -> float in [0, 1), multiples of 2^-24.
MT_HOST_DEVICE inline float unit_f24(uint32_t x) {
  return static_cast<float>(x >> 8) * 5.9604644775390625e-08f;  // 2^-24
}
// 32 bits -> double in [0, 1), multiples of 2^-32.
MT_HOST_DEVICE inline double unit_f32_as_double(uint32_t x) {
  return static_cast<double>(x) * 2.3283064365386962890625e-10;  // 2^-32
}
// 53 high bits of (hi:lo) -> double in [0, 1), multiples of 2^-53.
MT_HOST_DEVICE inline double unit_f53(uint32_t lo, uint32_t hi) {
  const uint64_t x = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return static_cast<double>(x) * 1.1102230246251565404236316680908203125e-16;  // 2^-53
}

// ---- the element mapping (docs/rng.md) --------------------------------------------------------

// Lanes (uint32 words of a block) one element consumes: 1 or 2; elements per block E = 4 / lanes.
// Two lanes for f64 uniforms (53 bits), normals (Box-Muller's u1, u2) and randint over a range of
// 2^32 or more values. Templated on RandomDist (kernels/params.h) and DType (runtime/dtype.h) so
// that this header includes neither: they pull in fmt, which device compilers may refuse.
template <class Dist, class DT>
MT_HOST_DEVICE inline int lanes_per_element(Dist dist, DT dtype, double a, double b) {
  if (dist == Dist::kNormal) return 2;
  if (dist == Dist::kUniform) return dtype == DT::kF64 ? 2 : 1;
  if (dist == Dist::kRandint) return b - a >= 4294967296.0 ? 2 : 1;
  return 1;  // bernoulli
}

// Where global element j finds its lanes: block offset + j / E, first lane (j % E) * lanes.
struct Stream {
  uint64_t seed, offset;
  int lanes;  // 1 or 2

  MT_HOST_DEVICE uint64_t block_of(uint64_t j) const { return offset + j / static_cast<uint64_t>(4 / lanes); }
  MT_HOST_DEVICE int lane_of(uint64_t j) const {
    return static_cast<int>(j % static_cast<uint64_t>(4 / lanes)) * lanes;
  }
};

// Plain IEEE multiply and add, never contracted to an FMA (nvcc contracts by default), so that
// host and device round alike.
MT_HOST_DEVICE inline float mul_rn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}
MT_HOST_DEVICE inline float add_rn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(x, y);
#else
  return x + y;
#endif
}
MT_HOST_DEVICE inline double mul_rn(double x, double y) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(x, y);
#else
  return x * y;
#endif
}
MT_HOST_DEVICE inline double add_rn(double x, double y) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(x, y);
#else
  return x + y;
#endif
}

// Values of one element from its lanes x0 (and x1 when it uses two). Floating results come in the
// precision the docs fix (float for 32-bit uniforms, double otherwise); the caller rounds them to
// the output dtype.
MT_HOST_DEVICE inline float uniform_f32(float lo, float hi, uint32_t x0) {
  return add_rn(lo, mul_rn(hi - lo, unit_f24(x0)));
}
MT_HOST_DEVICE inline double uniform_f64(double lo, double hi, uint32_t x0, uint32_t x1) {
  return add_rn(lo, mul_rn(hi - lo, unit_f53(x0, x1)));
}
// Box-Muller, cosine branch only: one value per element, independent of its neighbours.
MT_HOST_DEVICE inline double normal_f64(double mean, double std, uint32_t x0, uint32_t x1) {
  const double u1 = 1.0 - unit_f32_as_double(x0);  // (0, 1]: log is finite
  const double u2 = unit_f32_as_double(x1);
  // ::log etc.: the C functions, on the host and on CUDA devices, never an mt:: op of the same name
  // that an including file declared before (tensor/ops.h's log(const Tensor&), in a unity build).
  const double z = mul_rn(::sqrt(-2.0 * ::log(u1)), ::cos(mul_rn(6.283185307179586, u2)));
  return add_rn(mean, mul_rn(std, z));
}
MT_HOST_DEVICE inline bool bernoulli(double p, uint32_t x0) {
  return static_cast<double>(unit_f24(x0)) < p;
}
MT_HOST_DEVICE inline int64_t randint(int64_t low, uint64_t range, int lanes, uint32_t x0, uint32_t x1) {
  const uint64_t x = lanes == 2 ? ((static_cast<uint64_t>(x1) << 32) | x0) : x0;
  return static_cast<int64_t>(static_cast<uint64_t>(low) + x % range);
}

}  // namespace mt::philox
