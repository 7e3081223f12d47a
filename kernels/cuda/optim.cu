// Optimizer kernels on CUDA: AdamW in one pass over dense tensors, f32 tensors in groups of up to
// 40 per launch (multi-tensor; for mixed precision a bf16/f16 grad read as f32, scaled by the
// clipping coefficient, and a bf16/f16 copy of the new weights written in the same pass), the
// formula of kernels/cpu/optim.cpp with products and sums unfused like the CPU loop so that
// results differ from it only through sqrt and division rounding; the f64 sum of squares of
// gradient clipping; and 8-bit AdamW (the CPU's bits).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/loops.cuh"
#include "kernels/quant8.h"
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

// One AdamW element update (the formula of kernels/cpu/optim.cpp, unfused).
template <class T>
struct AdamWCoef {
  T decay, b1, b2, one_b1, one_b2, step_size, bc2_sqrt, eps;
};
template <class T>
__device__ __forceinline__ void adamw_elem(T& w, T g, T& m, T& v, const AdamWCoef<T>& c) {
  const T mi = fadd(fmul(c.b1, m), fmul(c.one_b1, g));
  const T vi = fadd(fmul(c.b2, v), fmul(fmul(c.one_b2, g), g));
  m = mi;
  v = vi;
  const T denom = fadd(sqrt(vi) / c.bc2_sqrt, c.eps);
  w = fadd(fmul(w, c.decay), -fmul(c.step_size, mi / denom));
}

template <class T>
AdamWCoef<T> coef_of(const AdamWParams& p) {
  return {static_cast<T>(p.decay),         static_cast<T>(p.beta1),     static_cast<T>(p.beta2),
          static_cast<T>(1 - p.beta1),     static_cast<T>(1 - p.beta2), static_cast<T>(p.step_size),
          static_cast<T>(p.bc2_sqrt),      static_cast<T>(p.eps)};
}

// f64: one grid-stride launch per tensor.
__global__ void adamw_kernel_f64(double* __restrict__ w, const double* __restrict__ g, double* __restrict__ m,
                                 double* __restrict__ v, int64_t n, AdamWCoef<double> c) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    adamw_elem(w[i], g[i], m[i], v[i], c);
}

// f32: up to kMulti tensors per launch; block b works on kChunk elements of the tensor whose block
// range holds b, with 16-byte accesses (8 for 16-bit grads and copies) where every array is
// aligned. G: the grad's type (float, or 16-bit read exactly as f32), C: the model copy's type
// (void: none). One launch holds items of one (G, C) kind.
constexpr int kMulti = 40, kChunk = 8192, kMultiThreads = 256;
struct MultiItem {
  float* w;
  const void* g;
  float* m;
  float* v;
  void* copy;
  int64_t n;
  AdamWCoef<float> c;
  float scale;
  bool scaled;
};
struct MultiBatch {
  MultiItem t[kMulti];
  int64_t first_block[kMulti + 1];
  int count;
};

template <class G>
__device__ __forceinline__ float4 load4(const G* p) {
  if constexpr (std::is_same_v<G, float>) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    const Pack<G, 4> a = *reinterpret_cast<const Pack<G, 4>*>(p);
    return make_float4(to_acc(a.v[0]), to_acc(a.v[1]), to_acc(a.v[2]), to_acc(a.v[3]));
  }
}

template <class G, class C>
__global__ void __launch_bounds__(kMultiThreads) adamw_multi_kernel(const __grid_constant__ MultiBatch b) {
  int i = 0;
  while (i + 1 < b.count && blockIdx.x >= b.first_block[i + 1]) ++i;
  const MultiItem& t = b.t[i];
  const G* g = static_cast<const G*>(t.g);
  [[maybe_unused]] C* copy = nullptr;
  if constexpr (!std::is_void_v<C>) copy = static_cast<C*>(t.copy);
  const int64_t begin = (blockIdx.x - b.first_block[i]) * int64_t{kChunk};
  const int64_t end = min(t.n, begin + kChunk);
  auto grad = [&](float x) { return t.scaled ? fmul(x, t.scale) : x; };
  uintptr_t addr = reinterpret_cast<uintptr_t>(t.w) | reinterpret_cast<uintptr_t>(t.m) |
                   reinterpret_cast<uintptr_t>(t.v);
  bool vec = (addr & 15) == 0 && (reinterpret_cast<uintptr_t>(g) & (4 * sizeof(G) - 1)) == 0;
  if constexpr (!std::is_void_v<C>) vec = vec && (reinterpret_cast<uintptr_t>(copy) & (4 * sizeof(C) - 1)) == 0;
  int64_t tail = begin;
  if (vec) {
    const int64_t packs_end = begin + (end - begin) / 4 * 4;
    for (int64_t j = begin + 4 * threadIdx.x; j < packs_end; j += 4 * kMultiThreads) {
      float4 w = *reinterpret_cast<const float4*>(t.w + j), m = *reinterpret_cast<const float4*>(t.m + j);
      float4 v = *reinterpret_cast<const float4*>(t.v + j);
      const float4 gv = load4(g + j);
      adamw_elem(w.x, grad(gv.x), m.x, v.x, t.c);
      adamw_elem(w.y, grad(gv.y), m.y, v.y, t.c);
      adamw_elem(w.z, grad(gv.z), m.z, v.z, t.c);
      adamw_elem(w.w, grad(gv.w), m.w, v.w, t.c);
      *reinterpret_cast<float4*>(t.w + j) = w;
      *reinterpret_cast<float4*>(t.m + j) = m;
      *reinterpret_cast<float4*>(t.v + j) = v;
      if constexpr (!std::is_void_v<C>) {
        Pack<C, 4> o;
        o.v[0] = cvt<C>(w.x);
        o.v[1] = cvt<C>(w.y);
        o.v[2] = cvt<C>(w.z);
        o.v[3] = cvt<C>(w.w);
        *reinterpret_cast<Pack<C, 4>*>(copy + j) = o;
      }
    }
    tail = packs_end;
  }
  for (int64_t j = tail + threadIdx.x; j < end; j += kMultiThreads) {
    adamw_elem(t.w[j], grad(to_acc(g[j])), t.m[j], t.v[j], t.c);
    if constexpr (!std::is_void_v<C>) copy[j] = cvt<C>(t.w[j]);
  }
}

// Kind of an item: grad type x copy type, 3 x 3.
int kind_of(const AdamWParams& p) {
  const auto code = [](DType d) { return d == DType::kBF16 ? 1 : d == DType::kF16 ? 2 : 0; };
  MT_CHECK(p.grad.dtype == DType::kF32 || p.grad.dtype == DType::kBF16 || p.grad.dtype == DType::kF16,
           "adamw kernel: grad dtype {} for an f32 param (f32, bf16, f16)", dtype_name(p.grad.dtype));
  MT_CHECK(!p.param_copy.data || p.param_copy.dtype == DType::kBF16 || p.param_copy.dtype == DType::kF16,
           "adamw kernel: param_copy must be bf16 or f16, got {}", dtype_name(p.param_copy.dtype));
  return code(p.grad.dtype) * 3 + (p.param_copy.data ? code(p.param_copy.dtype) : 0);
}

template <class G>
void launch_multi_g(int copy_kind, unsigned blocks, const MultiBatch& b) {
  cudaStream_t st = cuda::current_stream();
  if (copy_kind == 0)
    adamw_multi_kernel<G, void><<<blocks, kMultiThreads, 0, st>>>(b);
  else if (copy_kind == 1)
    adamw_multi_kernel<G, __nv_bfloat16><<<blocks, kMultiThreads, 0, st>>>(b);
  else
    adamw_multi_kernel<G, __half><<<blocks, kMultiThreads, 0, st>>>(b);
}

void adamw_multi(const AdamWMultiParams& p) {
  MultiBatch b{};
  int kind = -1;
  auto flush = [&] {
    if (b.count == 0) return;
    const int64_t blocks = b.first_block[b.count];
    MT_CHECK(blocks < (int64_t{1} << 31), "adamw: {} blocks are too many for one launch", blocks);
    const unsigned nb = static_cast<unsigned>(blocks);
    if (kind / 3 == 0)
      launch_multi_g<float>(kind % 3, nb, b);
    else if (kind / 3 == 1)
      launch_multi_g<__nv_bfloat16>(kind % 3, nb, b);
    else
      launch_multi_g<__half>(kind % 3, nb, b);
    MT_CUDA_LAUNCH_CHECK();
    b = MultiBatch{};
  };
  for (const AdamWParams& item : p.items) {
    const int64_t n = item.param.numel();
    if (n == 0) continue;
    if (item.param.dtype == DType::kF64) {
      MT_CHECK(item.grad.dtype == DType::kF64 && !item.param_copy.data,
               "adamw kernel: f64 params take f64 grads, no copy");
      AdamWCoef<double> c = coef_of<double>(item);
      MT_CHECK(item.grad_scale == 1, "adamw kernel: grad_scale is for f32 params");
      adamw_kernel_f64<<<grid_for(n), 256, 0, cuda::current_stream()>>>(
          item.param.ptr<double>(), item.grad.ptr<const double>(), item.exp_avg.ptr<double>(),
          item.exp_avg_sq.ptr<double>(), n, c);
      MT_CUDA_LAUNCH_CHECK();
      continue;
    }
    MT_CHECK(item.param.dtype == DType::kF32, "adamw kernel: {} tensors are not supported on CUDA (f32 or f64)",
             dtype_name(item.param.dtype));
    const int k = kind_of(item);
    if (k != kind) {
      flush();
      kind = k;
    }
    b.t[b.count] = {item.param.ptr<float>(),
                    item.grad.data,
                    item.exp_avg.ptr<float>(),
                    item.exp_avg_sq.ptr<float>(),
                    item.param_copy.data,
                    n,
                    coef_of<float>(item),
                    static_cast<float>(item.grad_scale),
                    item.grad_scale != 1};
    b.first_block[b.count + 1] = b.first_block[b.count] + ceil_div(n, int64_t{kChunk});
    if (++b.count == kMulti) flush();
  }
  flush();
}

void adamw(const AdamWParams& p) {
  AdamWMultiParams one;
  one.items.push_back(p);
  adamw_multi(one);
}

// ---- sum of squares (gradient clipping) ----------------------------------------------------------

// Pass 1: block b writes the f64 sum of squares of elements [b * kSqChunk, (b + 1) * kSqChunk)
// (a fixed tree over a fixed assignment of elements to threads); pass 2: one block adds the
// partials in a fixed tree and adds the total to out[0]. Deterministic for a given size.
constexpr int kSqThreads = 256, kSqChunk = 16 * 1024;

template <int N>
__device__ __forceinline__ double block_sum(double s, double* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x / 32] = s;
  __syncthreads();
  s = threadIdx.x < N / 32 ? sh[threadIdx.x] : 0.0;
  if (threadIdx.x < 32) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  }
  return s;
}

template <class T>
__global__ void __launch_bounds__(kSqThreads) sum_sq_partial(const T* __restrict__ x, int64_t n,
                                                            double* __restrict__ partial) {
  __shared__ double sh[kSqThreads / 32];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSqChunk, end = min(n, begin + kSqChunk);
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kSqThreads) {
    const double v = static_cast<double>(to_acc(x[i]));
    s += v * v;
  }
  s = block_sum<kSqThreads>(s, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kSqThreads) sum_sq_final(const double* __restrict__ partial, int64_t nblocks,
                                                          double* __restrict__ out) {
  __shared__ double sh[kSqThreads / 32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < nblocks; i += kSqThreads) s += partial[i];
  s = block_sum<kSqThreads>(s, sh);
  if (threadIdx.x == 0) out[0] += s;
}

void sum_sq(const SumSqParams& p) {
  const int64_t n = p.x.numel();
  if (n == 0) return;
  cudaStream_t st = cuda::current_stream();
  const int64_t blocks = ceil_div(n, int64_t{kSqChunk});
  MT_CHECK(blocks < (int64_t{1} << 31), "sum_sq: {} elements are too many for one launch", n);
  StreamScratch partial(static_cast<size_t>(blocks) * sizeof(double));
  MT_CUDA_DISPATCH_FLOAT(p.x.dtype, "sum_sq", {
    sum_sq_partial<scalar_t><<<static_cast<unsigned>(blocks), kSqThreads, 0, st>>>(p.x.ptr<const scalar_t>(), n,
                                                                                   partial.as<double>());
  });
  MT_CUDA_LAUNCH_CHECK();
  sum_sq_final<<<1, kSqThreads, 0, st>>>(partial.as<const double>(), blocks, p.out.ptr<double>());
  MT_CUDA_LAUNCH_CHECK();
}

// ---- adamw8bit: 8-bit AdamW (kernels/quant8.h) --------------------------------------------------
// One thread block per quantization block (block_rows whole rows). Pass 1 decodes the moments with
// the block's old absmax, updates them and the weights, and finds the new absmax (a max, exact in
// any order); pass 2 recomputes each thread's own moments from the codes it has not overwritten
// yet and encodes them against the new absmax. Every operation is the CPU kernel's, unfused and
// correctly rounded (division, sqrt, rint), so weights, codes and absmax are the CPU's bits.
constexpr int kQ8Threads = 256;

__device__ __forceinline__ float q8_decode_m(uint8_t code, float absmax) {
  const float t = __fdiv_rn(static_cast<float>(code & 0x7fu), 127.0f);
  const float v = __fmul_rn(absmax, __fmul_rn(t, t));
  return (code & 0x80u) ? -v : v;
}
__device__ __forceinline__ float q8_decode_v(uint8_t code, float absmax) {
  const float t = __fdiv_rn(static_cast<float>(code), 255.0f);
  const float t2 = __fmul_rn(t, t);
  return __fmul_rn(absmax, __fmul_rn(t2, t2));
}
__device__ __forceinline__ uint8_t q8_encode_m(float x, float absmax) {
  if (!(absmax > 0)) return 0;
  float r = __fdiv_rn(fabsf(x), absmax);
  if (r > 1) r = 1;
  const auto k = static_cast<uint8_t>(rintf(__fmul_rn(127.0f, __fsqrt_rn(r))));
  return (x < 0 && k != 0) ? static_cast<uint8_t>(k | 0x80u) : k;
}
__device__ __forceinline__ uint8_t q8_encode_v(float x, float absmax) {
  if (!(absmax > 0) || !(x > 0)) return 0;
  float r = __fdiv_rn(x, absmax);
  if (r > 1) r = 1;
  const float k = rintf(__fmul_rn(255.0f, __fsqrt_rn(__fsqrt_rn(r))));
  return static_cast<uint8_t>(k < 1.0f ? 1.0f : k);  // a positive v is coded 1 at least (kernels/quant8.h)
}

struct Q8Coef {
  float decay, b1, b2, one_b1, one_b2, step_size, bc2_sqrt, eps, scale;
  bool scaled;
};

__device__ __forceinline__ float block_max(float x, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x / 32] = x;
  __syncthreads();
  x = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.f;
  if (threadIdx.x < 32) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    if (threadIdx.x == 0) sh[0] = x;
  }
  __syncthreads();
  const float r = sh[0];
  __syncthreads();  // sh is reused by the next call
  return r;
}

// One thread block per 8-bit block. kFused: the whole update; kMax: only the block's new absmax,
// into bam (nothing else written); kApply: the update, coded against the absmax in bam (reduced
// over the ranks that share the block). Local row 0 is `first` rows into its block.
template <class G, class C>
__global__ void __launch_bounds__(kQ8Threads) adamw8bit_kernel(float* __restrict__ w, const G* __restrict__ g,
                                                                uint8_t* __restrict__ mq, uint8_t* __restrict__ vq,
                                                                float* __restrict__ am, C* __restrict__ copy,
                                                                int64_t rows, int64_t rn, int64_t block_rows,
                                                                int64_t first, Q8Phase phase, float* __restrict__ bam,
                                                                Q8Coef c) {
  __shared__ float sh[32];
  const int64_t b = blockIdx.x;
  const int64_t r0 = max(int64_t{0}, b * block_rows - first), r1 = min(rows, (b + 1) * block_rows - first);
  const int64_t i0 = r0 * rn, len = (r1 - r0) * rn;
  const float am_m = am[2 * r0], am_v = am[2 * r0 + 1];
  auto moments = [&](int64_t i, float& mi, float& vi) {
    float gi = to_acc(g[i]);
    if (c.scaled) gi = __fmul_rn(gi, c.scale);
    mi = __fadd_rn(__fmul_rn(c.b1, q8_decode_m(mq[i], am_m)), __fmul_rn(c.one_b1, gi));
    vi = __fadd_rn(__fmul_rn(c.b2, q8_decode_v(vq[i], am_v)), __fmul_rn(__fmul_rn(c.one_b2, gi), gi));
  };
  float new_m = 0, new_v = 0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const int64_t i = i0 + j;
    float mi, vi;
    moments(i, mi, vi);
    new_m = fmaxf(new_m, fabsf(mi));
    new_v = fmaxf(new_v, vi);
    if (phase == Q8Phase::kMax) continue;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
    const float wi = __fsub_rn(__fmul_rn(w[i], c.decay), __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
    w[i] = wi;
    if constexpr (!std::is_void_v<C>) copy[i] = from_acc<C>(wi);
  }
  new_m = block_max(new_m, sh);  // every thread has read am before any writes it below
  new_v = block_max(new_v, sh);
  if (phase == Q8Phase::kMax) {
    if (threadIdx.x == 0) {
      bam[2 * b] = new_m;
      bam[2 * b + 1] = new_v;
    }
    return;
  }
  if (phase == Q8Phase::kApply) {
    new_m = bam[2 * b];
    new_v = bam[2 * b + 1];
  }
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const int64_t i = i0 + j;
    float mi, vi;
    moments(i, mi, vi);
    mq[i] = q8_encode_m(mi, new_m);
    vq[i] = q8_encode_v(vi, new_v);
  }
  for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
    am[2 * r] = new_m;
    am[2 * r + 1] = new_v;
  }
}

template <class G, class C>
void adamw8bit_launch(const AdamW8bitParams& p, const Q8Coef& c) {
  const int64_t rows = p.param.numel() / p.row_numel, first = p.row_offset % p.block_rows;
  const int64_t blocks = quant8::local_blocks(rows, p.row_offset, p.block_rows);
  MT_CHECK(blocks < (int64_t{1} << 31), "adamw8bit: {} blocks are too many for one launch", blocks);
  if (blocks == 0) return;
  C* copy = nullptr;
  if constexpr (!std::is_void_v<C>) copy = p.param_copy.ptr<C>();
  float* bam = p.phase == Q8Phase::kFused ? nullptr : p.block_absmax.ptr<float>();
  adamw8bit_kernel<G, C><<<static_cast<unsigned>(blocks), kQ8Threads, 0, cuda::current_stream()>>>(
      p.param.ptr<float>(), p.grad.ptr<const G>(), p.exp_avg.ptr<uint8_t>(), p.exp_avg_sq.ptr<uint8_t>(),
      p.absmax.ptr<float>(), copy, rows, p.row_numel, p.block_rows, first, p.phase, bam, c);
  MT_CUDA_LAUNCH_CHECK();
}

template <class G>
void adamw8bit_grad(const AdamW8bitParams& p, const Q8Coef& c) {
  if (!p.param_copy.data)
    adamw8bit_launch<G, void>(p, c);
  else if (p.param_copy.dtype == DType::kBF16)
    adamw8bit_launch<G, __nv_bfloat16>(p, c);
  else if (p.param_copy.dtype == DType::kF16)
    adamw8bit_launch<G, __half>(p, c);
  else
    MT_FAIL("adamw8bit kernel: param_copy must be bf16 or f16, got {}", dtype_name(p.param_copy.dtype));
}

void adamw8bit(const AdamW8bitParams& p) {
  quant8::check_params(p);
  if (p.param.numel() == 0) return;
  Q8Coef c{static_cast<float>(p.decay),     static_cast<float>(p.beta1),     static_cast<float>(p.beta2),
           static_cast<float>(1 - p.beta1), static_cast<float>(1 - p.beta2), static_cast<float>(p.step_size),
           static_cast<float>(p.bc2_sqrt),  static_cast<float>(p.eps),       static_cast<float>(p.grad_scale),
           p.grad_scale != 1};
  switch (p.grad.dtype) {
    case DType::kF32: adamw8bit_grad<float>(p, c); break;
    case DType::kBF16: adamw8bit_grad<__nv_bfloat16>(p, c); break;
    case DType::kF16: adamw8bit_grad<__half>(p, c); break;
    default: MT_FAIL("adamw8bit kernel: grad dtype {} (f32, bf16, f16)", dtype_name(p.grad.dtype));
  }
}

}  // namespace

void register_cuda_optim(KernelTable& t) {
  t.adamw = adamw;
  t.adamw_multi = adamw_multi;
  t.sum_sq = sum_sq;
  t.adamw8bit = adamw8bit;
}

}  // namespace mt
