// Optimizer kernels on the CPU: AdamW in one pass over dense tensors (no temporaries), OpenMP
// over elements. Each element's update depends on that element alone, so the result does not
// depend on the thread count. sum_sq: the f64 sum of squares of gradient clipping, over fixed
// blocks added in order (also independent of the thread count).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt {
namespace {

template <class T>
void adamw_typed(const AdamWParams& p) {
  T* w = p.param.ptr<T>();
  const T* g = p.grad.ptr<const T>();
  T* m = p.exp_avg.ptr<T>();
  T* v = p.exp_avg_sq.ptr<T>();
  const int64_t n = p.param.numel();
  const T decay = static_cast<T>(p.decay), b1 = static_cast<T>(p.beta1), b2 = static_cast<T>(p.beta2);
  const T one_b1 = static_cast<T>(1 - p.beta1), one_b2 = static_cast<T>(1 - p.beta2);
  const T step_size = static_cast<T>(p.step_size), bc2_sqrt = static_cast<T>(p.bc2_sqrt);
  const T eps = static_cast<T>(p.eps);
#pragma omp parallel for if (n > 32768) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    const T mi = b1 * m[i] + one_b1 * gi;
    const T vi = b2 * v[i] + one_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / bc2_sqrt + eps;
    w[i] = w[i] * decay - step_size * (mi / denom);
  }
}

void adamw(const AdamWParams& p) {
  if (p.param.dtype == DType::kF64)
    adamw_typed<double>(p);
  else if (p.param.dtype == DType::kF32)
    adamw_typed<float>(p);
  else
    MT_FAIL("adamw kernel: {} tensors are not supported (f32 or f64)", dtype_name(p.param.dtype));
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
