// Batched GEMM on CUDA through cuBLASLt. Row-major out[M, N] = a[M, K] @ b[K, N] is computed as the
// column-major product out^T = b^T a^T, so each operand is described in place: a matrix with unit
// stride along its columns is a column-major matrix of the transposed shape (op N), one with unit
// stride along its rows is used with op T. Transposed views therefore cost no copy. Batch dims
// that collapse to one stride per operand (zero for broadcast operands) become one strided-batch
// call; other batch layouts loop over their outer dims. dtypes: f64 (64F compute), f32 (32F, or
// TF32 tensor cores when allowed: runtime/cuda/device.h), bf16 and f16 in with f32 accumulation and
// a bf16/f16 or f32 out. Descriptors and the heuristic's algorithm are cached per geometry; the
// 32 MiB workspace per (device, stream) comes from the caching allocator once.
// MT_GEMM_TUNE=1 (off by default until measured in training; docs/cuda.md): the first call of a
// large 16-bit geometry also times cuBLASLt's next heuristic candidates on its own operands and
// keeps the fastest whose result has the same bits as the first choice's (a 64-bit digest of the
// output), so the choice changes speed, never numbers; MT_GEMM_TUNE=2 also prints each choice.
#include <cublasLt.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/mat_layout.h"
#include "kernels/registry.h"
#include "runtime/cuda/cublaslt.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/memory.h"

#define MT_CUBLAS_CHECK(expr)                                                                                      \
  do {                                                                                                             \
    cublasStatus_t st_ = (expr);                                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                              \
      MT_FAIL("cuBLASLt error {} ({}) in `{}` at {}:{}", static_cast<int>(st_), cublaslt().get_status_string(st_), \
              #expr, __FILE__, __LINE__);                                                                          \
  } while (0)

namespace mt::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kMaxDevices = 64;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF64: return CUDA_R_64F;
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: MT_FAIL("matmul: dtype {} is not supported by the CUDA kernel (f64, f32, bf16, f16)", dtype_name(t));
  }
}

// Largest power of two (<= 256) dividing the address and every batch step in bytes.
int64_t alignment(const void* p, int64_t batch_stride_bytes) {
  int64_t a = 256;
  auto addr = reinterpret_cast<uintptr_t>(p);
  while (a > 1 && (addr % a || (batch_stride_bytes && batch_stride_bytes % a))) a /= 2;
  return a;
}

// One cuBLASLt problem, also the cache key (plain int64 fields: hashed as bytes).
struct Key {
  int64_t device, in_type, out_type, compute, trans_a, trans_b, m, n, k, lda, ldb, ldc, batch, sa, sb, sc,
      align_a, align_b, align_c;
  bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    const auto* w = reinterpret_cast<const int64_t*>(&k);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(Key) / sizeof(int64_t); ++i) h = (h ^ static_cast<uint64_t>(w[i])) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool tuned = false;  // MT_GEMM_TUNE: the candidates were timed (or cannot be)
};

struct State {
  std::mutex mu;
  cublasLtHandle_t handle[kMaxDevices] = {};
  std::unordered_map<Key, Plan, KeyHash> plans;
  std::unordered_map<cudaStream_t, void*> workspace;  // per stream (streams belong to one device)
};

State& state() {
  static State* s = new State;  // never destroyed: handles outlive static destructors
  return *s;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  MT_CUBLAS_CHECK(cublaslt().matrix_layout_create(&l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    MT_CUBLAS_CHECK(
        cublaslt().matrix_layout_set_attribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    MT_CUBLAS_CHECK(cublaslt().matrix_layout_set_attribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof(stride)));
  }
  return l;
}

// The algorithm search's constraints: workspace and the operands' alignments.
cublasLtMatmulPreference_t make_preference(const Key& key) {
  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUBLAS_CHECK(cublaslt().matmul_preference_create(&pref));
  const uint64_t ws = kWorkspaceBytes;
  MT_CUBLAS_CHECK(
      cublaslt().matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const auto al_a = static_cast<uint32_t>(key.align_b), al_b = static_cast<uint32_t>(key.align_a),
             al_c = static_cast<uint32_t>(key.align_c);  // Lt A is our b and Lt B our a
  MT_CUBLAS_CHECK(
      cublaslt().matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4));
  MT_CUBLAS_CHECK(
      cublaslt().matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4));
  MT_CUBLAS_CHECK(
      cublaslt().matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, 4));
  MT_CUBLAS_CHECK(
      cublaslt().matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, 4));
  return pref;
}

Plan& plan_for(State& st, const Key& key, cublasLtHandle_t h) {
  auto it = st.plans.find(key);
  if (it != st.plans.end()) return it->second;
  Plan p;
  const auto compute = static_cast<cublasComputeType_t>(key.compute);
  const cudaDataType_t scale = compute == CUBLAS_COMPUTE_64F ? CUDA_R_64F : CUDA_R_32F;
  MT_CUBLAS_CHECK(cublaslt().matmul_desc_create(&p.desc, compute, scale));
  const auto ta = static_cast<cublasOperation_t>(key.trans_a), tb = static_cast<cublasOperation_t>(key.trans_b);
  MT_CUBLAS_CHECK(cublaslt().matmul_desc_set_attribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MT_CUBLAS_CHECK(cublaslt().matmul_desc_set_attribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const auto in_t = static_cast<cudaDataType_t>(key.in_type), out_t = static_cast<cudaDataType_t>(key.out_type);
  // Lt A = our b: stored [n x k] (op N) or [k x n] (op T); Lt B = our a: [k x m] or [m x k].
  p.la = ta == CUBLAS_OP_N ? make_layout(in_t, key.n, key.k, key.ldb, key.batch, key.sb)
                           : make_layout(in_t, key.k, key.n, key.ldb, key.batch, key.sb);
  p.lb = tb == CUBLAS_OP_N ? make_layout(in_t, key.k, key.m, key.lda, key.batch, key.sa)
                           : make_layout(in_t, key.m, key.k, key.lda, key.batch, key.sa);
  p.lc = make_layout(out_t, key.n, key.m, key.ldc, key.batch, key.sc);
  cublasLtMatmulPreference_t pref = make_preference(key);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  MT_CUBLAS_CHECK(cublaslt().matmul_algo_get_heuristic(h, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &result, &returned));
  (void)cublaslt().matmul_preference_destroy(pref);
  MT_CHECK(returned > 0,
           "matmul: cuBLASLt has no algorithm for [{} x {}] @ [{} x {}] (batch {}, lda {}, ldb {}, alignments {}/{}/{})",
           key.m, key.k, key.k, key.n, key.batch, key.lda, key.ldb, key.align_a, key.align_b, key.align_c);
  p.algo = result.algo;
  return st.plans.emplace(key, p).first->second;
}

// ---- MT_GEMM_TUNE: the fastest candidate with the first choice's bits ----------------------------

constexpr int kTuneCandidates = 8;

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// out[0] += sum over the batch's outputs of mix(bits, position) (mod 2^64: the same in any order),
// out[1] += how many are not +-0. W: the output element's bits.
template <class W>
__global__ void digest_kernel(const W* __restrict__ c, int64_t per, int64_t batch, int64_t sc,
                              unsigned long long* out) {
  unsigned long long h = 0, nz = 0;
  const int64_t total = per * batch, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t b = i / per;
    const W v = c[b * sc + (i - b * per)];
    h += mix64(static_cast<unsigned long long>(v) ^ (static_cast<unsigned long long>(i) << 32) ^
               static_cast<unsigned long long>(i) >> 32);
    nz += static_cast<W>(v << 1) != 0 ? 1 : 0;  // the sign bit shifted out: -0 counts as zero
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    h += __shfl_xor_sync(0xffffffffu, h, o);
    nz += __shfl_xor_sync(0xffffffffu, nz, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(out, h);
    atomicAdd(out + 1, nz);
  }
}

struct Digest {
  unsigned long long hash = 0, nonzero = 0;
  bool operator==(const Digest& o) const { return hash == o.hash && nonzero == o.nonzero; }
};

// The digest of the output the plan's call wrote at c (synchronizes the stream).
Digest digest(const void* c, const Key& key, int64_t osize, unsigned long long* buf, cudaStream_t s) {
  const int64_t per = key.m * key.n, total = per * key.batch;
  MT_CUDA_CHECK(cudaMemsetAsync(buf, 0, 2 * sizeof(unsigned long long), s));
  if (osize == 2)
    digest_kernel<<<grid_for(total), 256, 0, s>>>(static_cast<const uint16_t*>(c), per, key.batch, key.sc, buf);
  else
    digest_kernel<<<grid_for(total), 256, 0, s>>>(static_cast<const uint32_t*>(c), per, key.batch, key.sc, buf);
  MT_CUDA_LAUNCH_CHECK();
  Digest d;
  unsigned long long host[2] = {0, 0};
  MT_CUDA_CHECK(cudaMemcpyAsync(host, buf, sizeof(host), cudaMemcpyDeviceToHost, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  d.hash = host[0];
  d.nonzero = host[1];
  return d;
}

// Whether a geometry is worth timing and its digest can tell reduction orders apart: 16-bit
// inputs, one strided-batch call that overwrites its output, at least 64K outputs of 64+ terms, 1M
// for a 16-bit output: rounded to bf16, an f32 sum in another order changes about 1e-4 of the
// outputs at K = 64, so 64K of them could all agree by chance (about 0.2% per candidate); 1M
// cannot (a review, 2026-12-07).
bool tunable(const Key& key, int64_t outer, double beta) {
  const bool half_in = key.in_type == CUDA_R_16BF || key.in_type == CUDA_R_16F;
  const bool half_out = key.out_type == CUDA_R_16BF || key.out_type == CUDA_R_16F;
  return half_in && outer == 1 && beta == 0 && key.k >= 64 &&
         key.m * key.n * key.batch >= (int64_t{1} << (half_out ? 20 : 16));
}

// How an algorithm cuts K: its split count and the scheme that adds the pieces. A candidate that
// cuts K otherwise sums in another order, so it is never taken, even when the first call's digest
// agrees (sums of few distinct or exactly representable values can match in any order, and later
// calls on real data would then differ in their last bits).
struct KSplit {
  int32_t splits = -1;
  uint32_t scheme = ~0u;
  bool operator==(const KSplit& o) const { return splits == o.splits && scheme == o.scheme; }  // .cu: C++17
};
KSplit k_split_of(const cublasLtMatmulAlgo_t& a) {
  KSplit k;
  size_t n = 0;
  if (cublaslt().matmul_algo_config_get_attribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k.splits, sizeof(k.splits),
                                                  &n) != CUBLAS_STATUS_SUCCESS)
    k.splits = -1;
  if (cublaslt().matmul_algo_config_get_attribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &k.scheme,
                                                  sizeof(k.scheme), &n) != CUBLAS_STATUS_SUCCESS)
    k.scheme = ~0u;
  return k;
}

// Times cuBLASLt's top candidates for `plan` on this call's operands (pc is overwritten; the
// caller's call then writes it for real) and keeps the fastest whose output digest equals the
// current choice's; a candidate must beat it by 2% to be taken. A degenerate output (mostly
// zeros, where other summation orders could agree by chance) keeps the current choice.
void tune(Plan& plan, const Key& key, cublasLtHandle_t h, const void* alpha, const void* beta, const void* pa,
          const void* pb, void* pc, void* ws, cudaStream_t stream, int64_t osize) {
  plan.tuned = true;
  std::vector<cublasLtMatmulHeuristicResult_t> cand(kTuneCandidates);
  int found = 0;
  cublasLtMatmulPreference_t pref = make_preference(key);
  const cublasStatus_t hs = cublaslt().matmul_algo_get_heuristic(h, plan.desc, plan.la, plan.lb, plan.lc, plan.lc, pref,
                                                                 kTuneCandidates, cand.data(), &found);
  (void)cublaslt().matmul_preference_destroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found <= 1) return;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublaslt().matmul(h, plan.desc, alpha, pb, plan.la, pa, plan.lb, beta, pc, plan.lc, pc, plan.lc, &algo, ws,
                             kWorkspaceBytes, stream);
  };
  // The digest buffer and the timing events, released on every path (an error below throws).
  struct Scratch {
    cudaStream_t stream;
    void* buf = nullptr;
    cudaEvent_t t0 = nullptr, t1 = nullptr;
    ~Scratch() {
      (void)cudaStreamSynchronize(stream);  // the digest kernels may still read buf
      if (t0) (void)cudaEventDestroy(t0);
      if (t1) (void)cudaEventDestroy(t1);
      if (buf) cuda::free(buf);
    }
  } scratch{stream};
  scratch.buf = cuda::alloc(2 * sizeof(unsigned long long), static_cast<int>(key.device));
  void* const buf = scratch.buf;
  MT_CUDA_CHECK(cudaEventCreate(&scratch.t0));
  MT_CUDA_CHECK(cudaEventCreate(&scratch.t1));
  const cudaEvent_t t0 = scratch.t0, t1 = scratch.t1;
  auto ms_of = [&](const cublasLtMatmulAlgo_t& algo) {  // after a warm call
    constexpr int kReps = 3;
    MT_CUDA_CHECK(cudaEventRecord(t0, stream));
    for (int r = 0; r < kReps; ++r)
      if (run(algo) != CUBLAS_STATUS_SUCCESS) return std::numeric_limits<double>::infinity();
    MT_CUDA_CHECK(cudaEventRecord(t1, stream));
    MT_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    return static_cast<double>(ms) / kReps;
  };
  MT_CUBLAS_CHECK(run(plan.algo));
  const Digest ref = digest(pc, key, osize, static_cast<unsigned long long*>(buf), stream);
  const int64_t outputs = key.m * key.n * key.batch;
  int chosen = -1, tried = 0;
  double best = 0, first = 0;
  if (ref.nonzero * 2 >= static_cast<unsigned long long>(outputs)) {
    const KSplit first_split = k_split_of(plan.algo);
    const bool any = gemm_tune_level() >= 3;  // tests: the first same-bits candidate, whatever its time
    best = first = ms_of(plan.algo);
    for (int i = 0; i < found; ++i) {
      if (cand[i].state != CUBLAS_STATUS_SUCCESS) continue;  // a heuristic entry without a usable algorithm
      if (std::memcmp(&cand[i].algo, &plan.algo, sizeof(plan.algo)) == 0) continue;
      if (!(k_split_of(cand[i].algo) == first_split)) continue;  // another K order
      if (run(cand[i].algo) != CUBLAS_STATUS_SUCCESS) continue;
      if (!(digest(pc, key, osize, static_cast<unsigned long long*>(buf), stream) == ref)) continue;  // other bits
      ++tried;
      const double ms = ms_of(cand[i].algo);
      if (any ? chosen < 0 : ms < 0.98 * best) {
        best = ms;
        chosen = i;
      }
    }
    if (chosen >= 0) {
      plan.algo = cand[chosen].algo;
      count_gemm_tune_taken();
    }
  }
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));  // errors said here; Scratch releases the rest
  if (gemm_tune_level() >= 2)
    std::fprintf(stderr, "MT_GEMM_TUNE: [%lld x %lld] @ [%lld x %lld] batch %lld (ops %lld/%lld): %s, %d of %d "
                 "candidates with the same bits, %.3f ms -> %.3f ms\n",
                 static_cast<long long>(key.m), static_cast<long long>(key.k), static_cast<long long>(key.k),
                 static_cast<long long>(key.n), static_cast<long long>(key.batch),
                 static_cast<long long>(key.trans_b), static_cast<long long>(key.trans_a),
                 chosen >= 0 ? "candidate taken" : "first choice kept", tried, found - 1, first,
                 chosen >= 0 ? best : first);
}

// out = beta * out (K == 0: the product is empty).
template <class T>
__global__ void scale_kernel(T* out, int64_t n, float beta) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    out[i] = beta == 0.f ? from_acc<T>(0.f) : from_acc<T>(beta * to_acc(out[i]));
}

struct BatchDim {
  int64_t size, sa, sb, sc;
};

void matmul(const MatmulParams& p) {
  const KView &a = p.a, &b = p.b, &out = p.out;
  if (out.numel() == 0) return;
  const MatLayout la = layout_of(a), lb = layout_of(b);
  const int64_t m = la.rows, k = la.cols, n = lb.cols;
  cudaStream_t stream = current_stream();
  if (k == 0) {
    MT_CUDA_DISPATCH_FLOAT(out.dtype, "matmul", {
      scale_kernel<scalar_t><<<grid_for(out.numel()), 256, 0, stream>>>(out.ptr<scalar_t>(), out.numel(),
                                                                        static_cast<float>(p.beta));
      MT_CUDA_LAUNCH_CHECK();
    });
    return;
  }
  MT_CHECK(a.dtype == b.dtype, "matmul: operands differ in dtype ({} and {})", dtype_name(a.dtype), dtype_name(b.dtype));
  const bool half_in = a.dtype == DType::kBF16 || a.dtype == DType::kF16;
  MT_CHECK(out.dtype == a.dtype || (half_in && out.dtype == DType::kF32),
           "matmul: out dtype {} for {} inputs (expected the input dtype, or f32 for 16-bit inputs)",
           dtype_name(out.dtype), dtype_name(a.dtype));
  // Batch dims, coalesced from the innermost; size-1 dims dropped.
  std::vector<BatchDim> dims;
  for (int d = out.ndim() - 3; d >= 0; --d) {
    if (out.sizes[d] == 1) continue;
    BatchDim bd{out.sizes[d], a.strides[d], b.strides[d], out.strides[d]};
    if (!dims.empty()) {
      BatchDim& in = dims.back();
      if (bd.sa == in.sa * in.size && bd.sb == in.sb * in.size && bd.sc == in.sc * in.size) {
        in.size *= bd.size;
        continue;
      }
    }
    dims.push_back(bd);
  }
  const BatchDim inner = dims.empty() ? BatchDim{1, 0, 0, m * n} : dims.front();
  int64_t outer = 1;
  for (size_t i = 1; i < dims.size(); ++i) outer *= dims[i].size;

  const int dev = current_device();
  const int64_t esize = dtype_size(a.dtype), osize = dtype_size(out.dtype);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  MT_CHECK(dev < kMaxDevices, "matmul: cuda:{} is beyond the {} supported devices", dev, kMaxDevices);
  if (!st.handle[dev]) MT_CUBLAS_CHECK(cublaslt().create(&st.handle[dev]));
  void*& ws = st.workspace[stream];
  if (!ws) ws = cuda::alloc(kWorkspaceBytes, dev);  // kept for the life of the process

  Key key{};
  key.device = dev;
  key.in_type = cuda_type(a.dtype);
  key.out_type = cuda_type(out.dtype);
  key.compute = a.dtype == DType::kF64                    ? CUBLAS_COMPUTE_64F
                : a.dtype == DType::kF32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                          : CUBLAS_COMPUTE_32F;
  key.trans_b = la.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;  // our a is Lt's B
  key.trans_a = lb.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;  // our b is Lt's A
  key.m = m;
  key.n = n;
  key.k = k;
  key.lda = std::max<int64_t>(la.ld, la.row_major ? k : m);
  key.ldb = std::max<int64_t>(lb.ld, lb.row_major ? n : k);
  key.ldc = n;
  key.batch = inner.size;
  key.sa = inner.size > 1 ? inner.sa : 0;
  key.sb = inner.size > 1 ? inner.sb : 0;
  key.sc = inner.size > 1 ? inner.sc : 0;
  key.align_a = alignment(a.data, key.sa * esize);
  key.align_b = alignment(b.data, key.sb * esize);
  key.align_c = alignment(out.data, key.sc * osize);
  for (size_t i = 1; i < dims.size(); ++i) {  // outer batch steps constrain alignment too
    key.align_a = std::min(key.align_a, alignment(a.data, dims[i].sa * esize));
    key.align_b = std::min(key.align_b, alignment(b.data, dims[i].sb * esize));
    key.align_c = std::min(key.align_c, alignment(out.data, dims[i].sc * osize));
  }
  Plan& plan = plan_for(st, key, st.handle[dev]);

  const double alpha64 = p.alpha, beta64 = p.beta;
  const float alpha32 = static_cast<float>(p.alpha), beta32 = static_cast<float>(p.beta);
  const bool f64 = key.compute == CUBLAS_COMPUTE_64F;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  if (!plan.tuned && gemm_tune_level() > 0) {
    if (tunable(key, outer, p.beta))
      tune(plan, key, st.handle[dev], alpha, beta, a.data, b.data, out.data, ws, stream, osize);
    else
      plan.tuned = true;
  }
  for (int64_t o = 0; o < outer; ++o) {
    int64_t oa = 0, ob = 0, oc = 0, rem = o;
    for (size_t i = 1; i < dims.size(); ++i) {
      const int64_t idx = rem % dims[i].size;
      rem /= dims[i].size;
      oa += idx * dims[i].sa;
      ob += idx * dims[i].sb;
      oc += idx * dims[i].sc;
    }
    const char* pa = static_cast<const char*>(a.data) + oa * esize;
    const char* pb = static_cast<const char*>(b.data) + ob * esize;
    char* pc = static_cast<char*>(out.data) + oc * osize;
    MT_CUBLAS_CHECK(cublaslt().matmul(st.handle[dev], plan.desc, alpha, pb, plan.la, pa, plan.lb, beta, pc, plan.lc, pc,
                                      plan.lc, &plan.algo, ws, kWorkspaceBytes, stream));
  }
}

}  // namespace
}  // namespace mt::cuda

namespace mt {
void register_cuda_matmul(KernelTable& t) { t.matmul = cuda::matmul; }
}  // namespace mt
