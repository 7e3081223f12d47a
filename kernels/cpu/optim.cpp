// Optimizer kernels on the CPU: AdamW in one pass over dense tensors (no temporaries), OpenMP
// over elements. Each element's update depends on that element alone, so the result does not
// depend on the thread count; with math functions that never set errno (meson.build) the loop
// vectorizes. sum_sq: the f64 sum of squares of gradient clipping, over fixed blocks added in
// order, each block summed in vmath.h's fixed lanes (also independent of the thread count).
// adamw8bit: 8-bit AdamW, OpenMP over its blocks (each block's update depends on that block alone).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/vmath.h"
#include "kernels/quant8.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt {
namespace {

// G: the grad's storage type (T, or BFloat16/Float16 for an f32 param); C: param_copy's storage
// type (void: none).
template <class T, class G, class C>
void adamw_typed(const AdamWParams& p) {
  T* w = p.param.ptr<T>();
  const G* g = p.grad.ptr<const G>();
  T* m = p.exp_avg.ptr<T>();
  T* v = p.exp_avg_sq.ptr<T>();
  [[maybe_unused]] C* copy = nullptr;
  if constexpr (!std::is_void_v<C>) copy = p.param_copy.ptr<C>();
  const int64_t n = p.param.numel();
  const T decay = static_cast<T>(p.decay), b1 = static_cast<T>(p.beta1), b2 = static_cast<T>(p.beta2);
  const T one_b1 = static_cast<T>(1 - p.beta1), one_b2 = static_cast<T>(1 - p.beta2);
  const T step_size = static_cast<T>(p.step_size), bc2_sqrt = static_cast<T>(p.bc2_sqrt);
  const T eps = static_cast<T>(p.eps), scale = static_cast<T>(p.grad_scale);
  const bool scaled = p.grad_scale != 1;
#pragma omp parallel for if (n > 32768) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T gi = static_cast<T>(static_cast<compute_t<G>>(g[i]));
    if (scaled) gi = gi * scale;
    const T mi = b1 * m[i] + one_b1 * gi;
    const T vi = b2 * v[i] + one_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / bc2_sqrt + eps;
    w[i] = w[i] * decay - step_size * (mi / denom);
    if constexpr (!std::is_void_v<C>) copy[i] = cpu::convert<C>(w[i]);
  }
}

template <class G>
void adamw_f32(const AdamWParams& p) {
  if (!p.param_copy.data)
    adamw_typed<float, G, void>(p);
  else if (p.param_copy.dtype == DType::kBF16)
    adamw_typed<float, G, BFloat16>(p);
  else if (p.param_copy.dtype == DType::kF16)
    adamw_typed<float, G, Float16>(p);
  else
    MT_FAIL("adamw kernel: param_copy must be bf16 or f16, got {}", dtype_name(p.param_copy.dtype));
}

void adamw(const AdamWParams& p) {
  if (p.param.dtype == DType::kF64) {
    MT_CHECK(p.grad.dtype == DType::kF64 && !p.param_copy.data, "adamw kernel: f64 params take f64 grads, no copy");
    adamw_typed<double, double, void>(p);
  } else if (p.param.dtype == DType::kF32) {
    switch (p.grad.dtype) {
      case DType::kF32: adamw_f32<float>(p); break;
      case DType::kBF16: adamw_f32<BFloat16>(p); break;
      case DType::kF16: adamw_f32<Float16>(p); break;
      default: MT_FAIL("adamw kernel: grad dtype {} for an f32 param (f32, bf16, f16)", dtype_name(p.grad.dtype));
    }
  } else {
    MT_FAIL("adamw kernel: {} tensors are not supported (f32 or f64)", dtype_name(p.param.dtype));
  }
}

void adamw_multi(const AdamWMultiParams& p) {
  for (const AdamWParams& item : p.items) adamw(item);
}

// 8-bit AdamW: one block of block_rows rows at a time (kernels/params.h, AdamW8bitParams). The
// new moments of a block are kept in f32 until its new absmax is known, then quantized; in the
// two-phase form the caller reduces the blocks' absmax over the ranks between the phases.
template <class G, class C>
void adamw8bit_typed(const AdamW8bitParams& p) {
  float* w = p.param.ptr<float>();
  const G* g = p.grad.ptr<const G>();
  uint8_t* mq = p.exp_avg.ptr<uint8_t>();
  uint8_t* vq = p.exp_avg_sq.ptr<uint8_t>();
  float* am = p.absmax.ptr<float>();
  [[maybe_unused]] C* copy = nullptr;
  if constexpr (!std::is_void_v<C>) copy = p.param_copy.ptr<C>();
  const int64_t n = p.param.numel(), rn = p.row_numel, rows = n / rn;
  const int64_t first = p.row_offset % p.block_rows;  // rows of the first block before local row 0
  const int64_t blocks = quant8::local_blocks(rows, p.row_offset, p.block_rows);
  const float decay = static_cast<float>(p.decay), b1 = static_cast<float>(p.beta1), b2 = static_cast<float>(p.beta2);
  const float one_b1 = static_cast<float>(1 - p.beta1), one_b2 = static_cast<float>(1 - p.beta2);
  const float step_size = static_cast<float>(p.step_size), bc2_sqrt = static_cast<float>(p.bc2_sqrt);
  const float eps = static_cast<float>(p.eps), scale = static_cast<float>(p.grad_scale);
  const bool scaled = p.grad_scale != 1;
  const Q8Phase phase = p.phase;
  float* bam = phase == Q8Phase::kFused ? nullptr : p.block_absmax.ptr<float>();
#pragma omp parallel for if (n > 32768) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    thread_local std::vector<float> buf;
    const int64_t r0 = std::max<int64_t>(0, b * p.block_rows - first);
    const int64_t r1 = std::min(rows, (b + 1) * p.block_rows - first);
    const int64_t i0 = r0 * rn, len = (r1 - r0) * rn;
    if (static_cast<int64_t>(buf.size()) < 2 * len) buf.resize(static_cast<size_t>(2 * len));
    const float am_m = am[2 * r0], am_v = am[2 * r0 + 1];
    float new_m = 0, new_v = 0;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = i0 + j;
      float gi = static_cast<float>(static_cast<compute_t<G>>(g[i]));
      if (scaled) gi = gi * scale;
      const float mi = b1 * quant8::decode_m(mq[i], am_m) + one_b1 * gi;
      const float vi = b2 * quant8::decode_v(vq[i], am_v) + one_b2 * gi * gi;
      new_m = std::max(new_m, std::fabs(mi));
      new_v = std::max(new_v, vi);
      if (phase == Q8Phase::kMax) continue;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      w[i] = w[i] * decay - step_size * (mi / denom);
      if constexpr (!std::is_void_v<C>) copy[i] = cpu::convert<C>(w[i]);
      buf[static_cast<size_t>(2 * j)] = mi;
      buf[static_cast<size_t>(2 * j + 1)] = vi;
    }
    if (phase == Q8Phase::kMax) {  // this shard's part of the block's absmax; nothing else changes
      bam[2 * b] = new_m;
      bam[2 * b + 1] = new_v;
      continue;
    }
    if (phase == Q8Phase::kApply) {  // the whole block's, reduced over the ranks that share it
      new_m = bam[2 * b];
      new_v = bam[2 * b + 1];
    }
    for (int64_t j = 0; j < len; ++j) {
      mq[i0 + j] = quant8::encode_m(buf[static_cast<size_t>(2 * j)], new_m);
      vq[i0 + j] = quant8::encode_v(buf[static_cast<size_t>(2 * j + 1)], new_v);
    }
    for (int64_t r = r0; r < r1; ++r) {
      am[2 * r] = new_m;
      am[2 * r + 1] = new_v;
    }
  }
}

template <class G>
void adamw8bit_grad(const AdamW8bitParams& p) {
  if (!p.param_copy.data)
    adamw8bit_typed<G, void>(p);
  else if (p.param_copy.dtype == DType::kBF16)
    adamw8bit_typed<G, BFloat16>(p);
  else if (p.param_copy.dtype == DType::kF16)
    adamw8bit_typed<G, Float16>(p);
  else
    MT_FAIL("adamw8bit kernel: param_copy must be bf16 or f16, got {}", dtype_name(p.param_copy.dtype));
}

void adamw8bit(const AdamW8bitParams& p) {
  quant8::check_params(p);
  switch (p.grad.dtype) {
    case DType::kF32: adamw8bit_grad<float>(p); break;
    case DType::kBF16: adamw8bit_grad<BFloat16>(p); break;
    case DType::kF16: adamw8bit_grad<Float16>(p); break;
    default: MT_FAIL("adamw8bit kernel: grad dtype {} (f32, bf16, f16)", dtype_name(p.grad.dtype));
  }
}

constexpr int64_t kSumSqBlock = 8192;

template <class T>
double sum_sq_typed(const T* x, int64_t n) {
  const int64_t blocks = (n + kSumSqBlock - 1) / kSumSqBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for if (n > 4 * kSumSqBlock) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const T* xb = x + b * kSumSqBlock;
    partial[static_cast<size_t>(b)] = cpu::lane_sum(std::min(kSumSqBlock, n - b * kSumSqBlock), [xb](int64_t i) {
      const double v = static_cast<double>(static_cast<compute_t<T>>(xb[i]));
      return v * v;
    });
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

void sum_sq(const SumSqParams& p) {
  double s = 0;
  MT_DISPATCH_FLOAT(p.x.dtype, "sum_sq", s = sum_sq_typed<scalar_t>(p.x.ptr<const scalar_t>(), p.x.numel()));
  *p.out.ptr<double>() += s;
}

}  // namespace

void register_cpu_optim(KernelTable& t) {
  t.adamw = adamw;
  t.adamw_multi = adamw_multi;
  t.sum_sq = sum_sq;
  t.adamw8bit = adamw8bit;
}

}  // namespace mt
