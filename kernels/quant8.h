// The 8-bit codes of 8-bit AdamW's moments (optim/adamw8bit.h, the `adamw8bit` kernel family):
// block-wise dynamic quantization against the block's absmax, non-linear so that small values
// keep their relative precision (a linear code would round most of a block's v to 0 and blow up
// m / sqrt(v)):
//   m (signed):  code = sign bit 7 | k (0..127),  value = absmax * (k / 127)^2
//   v (>= 0):    code = k (0..255),               value = absmax * (k / 255)^4
// Quantizing rounds k in the transformed domain: k = round(127 sqrt(|m| / absmax)),
// max(1, round(255 sqrt(sqrt(v / absmax)))) for v > 0. Only division, sqrt and products:
// IEEE-exact operations, so the codes are the same on every CPU and GPU. The block's largest value maps to k = 127 (255)
// and decodes to absmax exactly; an all-zero block has absmax 0 and codes 0.
// Round trip bound (tests/optim/test_adamw8bit.cpp): |x - decode(encode(x))| <= absmax * (a^2 - r)
// with r = |x| / absmax and a = min(1, sqrt(r) + 0.5 / 127) for m,
// a = min(1, max(r^(1/4) + 0.5 / 255, 1 / 255))^2 for v > 0 (plus f32 rounding).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/params.h"
#include "runtime/error.h"

namespace mt::quant8 {

inline uint8_t encode_m(float x, float absmax) {
  if (!(absmax > 0)) return 0;
  float r = std::fabs(x) / absmax;
  if (r > 1) r = 1;
  const auto k = static_cast<uint8_t>(std::nearbyint(127.0f * std::sqrt(r)));
  return (x < 0 && k != 0) ? static_cast<uint8_t>(k | 0x80u) : k;
}

inline float decode_m(uint8_t code, float absmax) {
  const float t = static_cast<float>(code & 0x7fu) / 127.0f;
  const float v = absmax * (t * t);
  return (code & 0x80u) ? -v : v;
}

// A positive v is coded 1 at least: a v coded 0 under a nonzero m would make AdamW's step m / eps.
// Rounding it up to the smallest code only makes the step smaller.
inline uint8_t encode_v(float x, float absmax) {
  if (!(absmax > 0) || !(x > 0)) return 0;
  float r = x / absmax;
  if (r > 1) r = 1;
  const float k = std::nearbyint(255.0f * std::sqrt(std::sqrt(r)));
  return static_cast<uint8_t>(k < 1.0f ? 1.0f : k);
}

inline float decode_v(uint8_t code, float absmax) {
  const float t = static_cast<float>(code) / 255.0f;
  const float t2 = t * t;
  return absmax * (t2 * t2);
}

// Blocks of `block_rows` rows that a shard of `rows` rows starting at row `row_offset` of its tensor
// meets (the first and last may be partial; AdamW8bitParams): the kernels' launch size, and the
// optimizer's count of a shard's shared blocks.
inline int64_t local_blocks(int64_t rows, int64_t row_offset, int64_t block_rows) {
  return rows == 0 ? 0 : (rows + row_offset % block_rows + block_rows - 1) / block_rows;
}

// The adamw8bit kernels' argument checks (CPU and CUDA): f32 param, u8 codes, f32 absmax with
// two values per row of row_numel elements.
inline void check_params(const AdamW8bitParams& p) {
  MT_CHECK(p.param.dtype == DType::kF32, "adamw8bit kernel: the param must be f32, got {}", dtype_name(p.param.dtype));
  MT_CHECK(p.exp_avg.dtype == DType::kU8 && p.exp_avg_sq.dtype == DType::kU8 && p.absmax.dtype == DType::kF32,
           "adamw8bit kernel: codes must be u8 and absmax f32");
  MT_CHECK(p.row_numel > 0 && p.block_rows > 0 && p.param.numel() % p.row_numel == 0 &&
               p.absmax.numel() == 2 * (p.param.numel() / p.row_numel),
           "adamw8bit kernel: {} elements are not rows of {} with 2 absmax per row ({} given)", p.param.numel(),
           p.row_numel, p.absmax.numel());
  MT_CHECK(p.row_offset >= 0, "adamw8bit kernel: row_offset {} < 0", p.row_offset);
  if (p.phase != Q8Phase::kFused) {
    const int64_t blocks = local_blocks(p.param.numel() / p.row_numel, p.row_offset, p.block_rows);
    MT_CHECK(p.block_absmax.dtype == DType::kF32 && p.block_absmax.numel() == 2 * blocks,
             "adamw8bit kernel: the two-phase form needs an f32 block_absmax of {} elements ({} given)", 2 * blocks,
             p.block_absmax.numel());
  }
}

}  // namespace mt::quant8
