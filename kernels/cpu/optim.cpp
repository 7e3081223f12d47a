// Optimizer kernels on the CPU: AdamW in one pass over dense tensors (no temporaries), OpenMP
// over elements. Each element's update depends on that element alone, so the result does not
// depend on the thread count. sum_sq: the f64 sum of squares of gradient clipping, over fixed
// blocks added in order (also independent of the thread count).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/loops.h"
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

constexpr int64_t kSumSqBlock = 8192;

template <class T>
double sum_sq_typed(const T* x, int64_t n) {
  const int64_t blocks = (n + kSumSqBlock - 1) / kSumSqBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for if (n > 4 * kSumSqBlock) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kSumSqBlock);
    double s = 0;
    for (int64_t i = b * kSumSqBlock; i < end; ++i) {
      const double v = static_cast<double>(static_cast<compute_t<T>>(x[i]));
      s += v * v;
    }
    partial[static_cast<size_t>(b)] = s;
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
}

}  // namespace mt
