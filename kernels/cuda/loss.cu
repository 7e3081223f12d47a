// Fused softmax cross-entropy on CUDA, mirroring kernels/cpu/loss.cpp, for vocabularies of 128k
// and more. Forward: one block per row, one read of the logits with an online (max, sum) per
// thread merged over the block: only loss and lse [N] are written, no second [N, V] buffer.
// Backward: grad_logits written directly from logits and the saved lse (prob = exp(x - lse)),
// blocks tiling [rows x column chunks] so that a few long rows still fill the device.
// Sums in acc_t (float for f32/bf16/f16, double for f64); rows whose target is ignore_index get
// loss 0 (forward) and zero gradient (backward).
#include <algorithm>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/registry.h"

namespace mt {
namespace {

template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};
template <class T>
constexpr int kVec = 16 / sizeof(T);

// loss / lse / grad_loss dtype: f64 for f64 logits, else f32 (== acc_t).
template <class T>
using loss_t = acc_t<T>;

__device__ __forceinline__ int64_t target_at(const void* t, bool i64, int64_t stride, int64_t n) {
  return i64 ? static_cast<const int64_t*>(t)[n * stride] : static_cast<int64_t>(static_cast<const int32_t*>(t)[n * stride]);
}

constexpr int kThreads = 512;
constexpr int kLoads = 8;  // backward: vectors a thread loads before using them

// exp of a logit's offset in the accumulation type. 16-bit logits take the hardware exp2
// (__expf: a few float ulps, far below their own rounding, and about 4x fewer instructions,
// which the 128k-vocabulary rows are bound by); f32 and f64 keep the exact exp of the CPU's
// formula.
template <class T, class A>
__device__ __forceinline__ A logit_exp(A x) {
  if constexpr (sizeof(T) == 2) return __expf(x);
  else return exp(x);
}

// kFwdLoads vectors in flight per thread. 4 rather than 8 (a whole 32k-vocabulary bf16 row): 38
// registers instead of 53, so 3 blocks fit a multiprocessor instead of 2 and one block's loads
// overlap the others' folds and block reductions (H100, [4096, 32768] bf16: 0.81 of a copy's
// bandwidth against 0.77; f64 keeps its registers). The fold order, and so the result, does not
// depend on it.
constexpr int kFwdLoads = 4;
template <class T, int N>
__global__ void __launch_bounds__(kThreads, sizeof(T) <= 4 ? 3 : 1) ce_fwd(const T* __restrict__ logits, const void* target, bool tgt_i64,
                                                   int64_t tgt_stride, loss_t<T>* loss, int64_t loss_stride,
                                                   loss_t<T>* lse_out, int64_t lse_stride, int64_t rows, int64_t V,
                                                   int64_t ignore_index) {
  using A = acc_t<T>;
  __shared__ A shm[32], shs[32];
  const int64_t nv = V / N;
  for (int64_t n = blockIdx.x; n < rows; n += gridDim.x) {
    const T* row = logits + n * V;
    A m = -INFINITY, s = 0;
    const Vec<T, N>* rv = reinterpret_cast<const Vec<T, N>*>(row);
    auto fold = [&](const Vec<T, N>& a) {
      A vm = to_acc(a.v[0]);  // one rescale per vector at most
#pragma unroll
      for (int e = 1; e < N; ++e) vm = max(vm, to_acc(a.v[e]));
      if (vm > m) {
        s = m == -INFINITY ? A(0) : s * exp(m - vm);
        m = vm;
      }
      if (m != -INFINITY) {
#pragma unroll
        for (int e = 0; e < N; ++e) s += logit_exp<T>(to_acc(a.v[e]) - m);
      } else if (vm != vm) {  // NaN before any finite value: poison the row like the CPU
        m = vm;
      }
    };
    // kFwdLoads vectors in flight per thread, folded in the same order as one at a time.
    int64_t k = threadIdx.x;
    for (; k + (kFwdLoads - 1) * int64_t{blockDim.x} < nv; k += kFwdLoads * int64_t{blockDim.x}) {
      Vec<T, N> a[kFwdLoads];
#pragma unroll
      for (int u = 0; u < kFwdLoads; ++u) a[u] = rv[k + u * int64_t{blockDim.x}];
#pragma unroll
      for (int u = 0; u < kFwdLoads; ++u) fold(a[u]);
    }
    for (; k < nv; k += blockDim.x) fold(rv[k]);
    block_max_sum(m, s, shm, shs);
    if (threadIdx.x == 0) {
      const A lse = m == -INFINITY || m == INFINITY ? m : m + log(s);
      lse_out[n * lse_stride] = lse;
      const int64_t t = target_at(target, tgt_i64, tgt_stride, n);
      loss[n * loss_stride] = t == ignore_index ? A(0) : lse - to_acc(row[t]);
    }
  }
}

// grad[n, v] = g[n] * (exp(x[n, v] - lse[n]) - [v == target[n]]); block (x: row, y: column chunk).
template <class T, int N>
__global__ void __launch_bounds__(kThreads) ce_bwd(const T* __restrict__ logits, const void* target, bool tgt_i64,
                                                   int64_t tgt_stride, const loss_t<T>* lse, int64_t lse_stride,
                                                   const loss_t<T>* grad_loss, int64_t gl_stride,
                                                   T* __restrict__ grad, int64_t rows, int64_t V,
                                                   int64_t ignore_index) {
  using A = acc_t<T>;
  const int64_t nv = V / N;
  for (int64_t n = blockIdx.x; n < rows; n += gridDim.x) {
    const int64_t t = target_at(target, tgt_i64, tgt_stride, n);
    const bool ignored = t == ignore_index;
    const A g = ignored ? A(0) : grad_loss[n * gl_stride];
    const A l = lse[n * lse_stride];
    const Vec<T, N>* xv = reinterpret_cast<const Vec<T, N>*>(logits + n * V);
    Vec<T, N>* gv = reinterpret_cast<Vec<T, N>*>(grad + n * V);
    auto one = [&](int64_t k, const Vec<T, N>& a) {
      Vec<T, N> o;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const A prob = logit_exp<T>(to_acc(a.v[e]) - l);
        o.v[e] = from_acc<T>(ignored ? A(0) : g * (prob - (k * N + e == t ? A(1) : A(0))));
      }
      gv[k] = o;
    };
    const int64_t step = int64_t{gridDim.y} * blockDim.x;
    int64_t k = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
    for (; k + (kLoads - 1) * step < nv; k += kLoads * step) {  // kLoads loads in flight
      Vec<T, N> a[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) a[u] = xv[k + u * step];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) one(k + u * step, a[u]);
    }
    for (; k < nv; k += step) one(k, xv[k]);
  }
}

template <class T>
void cross_entropy_typed(const CrossEntropyParams& p) {
  const int64_t N = p.logits.sizes[0], V = p.logits.sizes[1];
  if (N == 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(N, int64_t{1} << 30));
  cudaStream_t st = cuda::current_stream();
  const bool i64 = p.target.dtype == DType::kI64;
  auto go = [&](auto vec) {
    constexpr int NV = decltype(vec)::value;
    ce_fwd<T, NV><<<grid, kThreads, 0, st>>>(p.logits.ptr<const T>(), p.target.data, i64, p.target.strides[0],
                                              p.loss.ptr<loss_t<T>>(), p.loss.strides[0], p.lse.ptr<loss_t<T>>(),
                                              p.lse.strides[0], N, V, p.ignore_index);
  };
  if (V % kVec<T> == 0 && aligned16(p.logits.data))
    go(std::integral_constant<int, kVec<T>>{});
  else
    go(std::integral_constant<int, 1>{});
  MT_CUDA_LAUNCH_CHECK();
}

template <class T>
void cross_entropy_bwd_typed(const CrossEntropyBwdParams& p) {
  const int64_t N = p.logits.sizes[0], V = p.logits.sizes[1];
  if (N == 0 || V == 0) return;
  cudaStream_t st = cuda::current_stream();
  const bool i64 = p.target.dtype == DType::kI64;
  auto go = [&](auto vec) {
    constexpr int NV = decltype(vec)::value;
    // Column chunks of 4 vectors per thread; rows in x (up to 2^30 blocks, then grid-stride).
    const int64_t per_block = int64_t{kThreads} * 4;
    const unsigned gy = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(V / NV, per_block), 1, 65535));
    const unsigned gx = static_cast<unsigned>(std::min<int64_t>(N, int64_t{1} << 30));
    ce_bwd<T, NV><<<dim3(gx, gy), kThreads, 0, st>>>(
        p.logits.ptr<const T>(), p.target.data, i64, p.target.strides[0], p.lse.ptr<const loss_t<T>>(),
        p.lse.strides[0], p.grad_loss.ptr<const loss_t<T>>(), p.grad_loss.strides[0], p.grad_logits.ptr<T>(), N, V,
        p.ignore_index);
  };
  if (V % kVec<T> == 0 && aligned16(p.logits.data) && aligned16(p.grad_logits.data))
    go(std::integral_constant<int, kVec<T>>{});
  else
    go(std::integral_constant<int, 1>{});
  MT_CUDA_LAUNCH_CHECK();
}

void cross_entropy(const CrossEntropyParams& p) {
  MT_CUDA_DISPATCH_FLOAT(p.logits.dtype, "cross_entropy", { cross_entropy_typed<scalar_t>(p); });
}
void cross_entropy_bwd(const CrossEntropyBwdParams& p) {
  MT_CUDA_DISPATCH_FLOAT(p.logits.dtype, "cross_entropy_bwd", { cross_entropy_bwd_typed<scalar_t>(p); });
}

}  // namespace

void register_cuda_loss(KernelTable& t) {
  t.cross_entropy = cross_entropy;
  t.cross_entropy_bwd = cross_entropy_bwd;
}

}  // namespace mt
