// Optimizer kernels on CUDA: AdamW in one pass over dense tensors (one launch per tensor instead
// of about ten elementwise ops), the formula of kernels/cpu/optim.cpp, products and sums unfused
// like the CPU loop so that results differ from it only through sqrt and division rounding.
#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {
namespace {

template <class T> __device__ __forceinline__ T fmul(T a, T b) {
  if constexpr (std::is_same_v<T, float>) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
}
template <class T> __device__ __forceinline__ T fadd(T a, T b) {
  if constexpr (std::is_same_v<T, float>) return __fadd_rn(a, b);
  else return __dadd_rn(a, b);
}

template <class T>
__global__ void adamw_kernel(T* __restrict__ w, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                             int64_t n, T decay, T b1, T b2, T one_b1, T one_b2, T step_size, T bc2_sqrt, T eps) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const T gi = g[i];
    const T mi = fadd(fmul(b1, m[i]), fmul(one_b1, gi));
    const T vi = fadd(fmul(b2, v[i]), fmul(fmul(one_b2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const T denom = fadd(sqrt(vi) / bc2_sqrt, eps);
    w[i] = fadd(fmul(w[i], decay), -fmul(step_size, mi / denom));
  }
}

template <class T>
void adamw_typed(const AdamWParams& p) {
  const int64_t n = p.param.numel();
  if (n == 0) return;
  adamw_kernel<T><<<grid_for(n), 256, 0, cuda::current_stream()>>>(
      p.param.ptr<T>(), p.grad.ptr<const T>(), p.exp_avg.ptr<T>(), p.exp_avg_sq.ptr<T>(), n, static_cast<T>(p.decay),
      static_cast<T>(p.beta1), static_cast<T>(p.beta2), static_cast<T>(1 - p.beta1), static_cast<T>(1 - p.beta2),
      static_cast<T>(p.step_size), static_cast<T>(p.bc2_sqrt), static_cast<T>(p.eps));
  MT_CUDA_LAUNCH_CHECK();
}

void adamw(const AdamWParams& p) {
  if (p.param.dtype == DType::kF64)
    adamw_typed<double>(p);
  else if (p.param.dtype == DType::kF32)
    adamw_typed<float>(p);
  else
    MT_FAIL("adamw kernel: {} tensors are not supported on CUDA (f32 or f64)", dtype_name(p.param.dtype));
}

}  // namespace

void register_cuda_optim(KernelTable& t) { t.adamw = adamw; }

}  // namespace mt
