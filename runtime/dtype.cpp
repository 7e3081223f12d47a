// dtype names, sizes, promotion, and IEEE half conversion (round to nearest even).
#include "runtime/dtype.h"

#include "runtime/error.h"

namespace mt {

const char* dtype_name(DType t) {
  static const char* kNames[] = {"f64", "f32", "bf16", "f16", "i64", "i32", "u8", "bool"};
  return kNames[static_cast<int>(t)];
}

int64_t dtype_size(DType t) {
  static const int64_t kSizes[] = {8, 4, 2, 2, 8, 4, 1, 1};
  return kSizes[static_cast<int>(t)];
}

DType promote(DType a, DType b) {
  if (a == b) return a;
  // rank: bool 0, u8 1, i32 2, i64 3, f16/bf16 4, f32 5, f64 6
  auto rank = [](DType t) {
    switch (t) {
      case DType::kBool: return 0;
      case DType::kU8: return 1;
      case DType::kI32: return 2;
      case DType::kI64: return 3;
      case DType::kF16:
      case DType::kBF16: return 4;
      case DType::kF32: return 5;
      case DType::kF64: return 6;
    }
    return 0;
  };
  int ra = rank(a), rb = rank(b);
  if (ra == 4 && rb == 4) return DType::kF32;  // bf16 with f16
  return ra > rb ? a : b;
}

float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {  // result is subnormal or zero
    if (absu < 0x33000000u) return static_cast<uint16_t>(sign);  // < half of smallest subnormal
    uint32_t exp = absu >> 23;
    uint32_t man = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 + (113 - exp) - 1 adjustments folded
    // value = man * 2^(exp-150); half subnormal unit = 2^-24 -> q = man >> (126 - exp)
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u);  // round to nearest even on bit 13
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

}  // namespace mt
