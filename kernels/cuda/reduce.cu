// Reductions on CUDA. Each output element is reduced by a group of G threads (1, 32 or 256,
// picked from the sizes): every thread folds the elements k = lane, lane + G, ... of the output's
// reduced sub-space in order, then the group combines its partial states by a fixed shared-memory
// tree. Few outputs with long reductions split each output over several blocks, whose partial
// states land in a small workspace from the caching allocator and are combined in a fixed order
// by a second kernel. Every choice depends only on the shapes: results are deterministic.
// Accumulators: double for f32/f64 sums, float for bf16/f16 (rounded once on store), int64 for
// integers; prod in double; var by Chan's parallel update in double (the CPU uses two passes, so
// var agrees to rounding, not bit for bit); max/min/argmax/argmin pick the CPU's element (first
// NaN, else first extreme) and are exact.
#include "kernels/cuda/loops.cuh"
#include "kernels/registry.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/memory.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;

struct RGeom {
  int nkeep = 0;
  int64_t keep_size[kMaxDims], in_keep_stride[kMaxDims], out_keep_stride[kMaxDims];
  int nr = 0;  // coalesced reduced dims, innermost first
  int64_t r_size[kMaxDims], r_stride[kMaxDims];
  int64_t count = 1;
  int64_t correction = 1;
  bool mean = false;

  __device__ void bases(int64_t o, int64_t* in_off, int64_t* out_off) const {
    int64_t a = 0, b = 0;
    for (int d = nkeep - 1; d >= 0; --d) {
      const int64_t i = o % keep_size[d];
      o /= keep_size[d];
      a += i * in_keep_stride[d];
      b += i * out_keep_stride[d];
    }
    *in_off = a;
    *out_off = b;
  }
  __device__ __forceinline__ int64_t roff(int64_t k) const {
    if (nr == 1) return k * r_stride[0];
    int64_t off = 0;
    for (int d = 0; d < nr; ++d) {
      off += (k % r_size[d]) * r_stride[d];
      k /= r_size[d];
    }
    return off;
  }
};

RGeom make_rgeom(const ReduceParams& p) {
  RGeom g;
  const KView& in = p.in;
  g.nkeep = in.ndim() - p.n_reduce;
  for (int d = 0; d < g.nkeep; ++d) {
    g.keep_size[d] = in.sizes[d];
    g.in_keep_stride[d] = in.strides[d];
    g.out_keep_stride[d] = p.out.strides[d];
  }
  for (int d = in.ndim() - 1; d >= g.nkeep; --d) {
    g.count *= in.sizes[d];
    if (in.sizes[d] == 1) continue;
    if (g.nr > 0 && in.strides[d] == g.r_stride[g.nr - 1] * g.r_size[g.nr - 1]) {
      g.r_size[g.nr - 1] *= in.sizes[d];
    } else {
      g.r_size[g.nr] = in.sizes[d];
      g.r_stride[g.nr] = in.strides[d];
      ++g.nr;
    }
  }
  if (g.nr == 0) {
    g.nr = 1;
    g.r_size[0] = 1;
    g.r_stride[0] = 0;
  }
  g.correction = p.correction;
  g.mean = p.op == ReduceOp::kMean;
  return g;
}

// Stores v into out (any dtype) at element offset off.
template <class V>
__device__ void store_any(void* out, DType dt, int64_t off, V v) {
  switch (dt) {
    case DType::kF64: static_cast<double*>(out)[off] = cvt<double>(v); break;
    case DType::kF32: static_cast<float*>(out)[off] = cvt<float>(v); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(out)[off] = cvt<__nv_bfloat16>(v); break;
    case DType::kF16: static_cast<__half*>(out)[off] = cvt<__half>(v); break;
    case DType::kI64: static_cast<int64_t*>(out)[off] = cvt<int64_t>(v); break;
    case DType::kI32: static_cast<int32_t*>(out)[off] = cvt<int32_t>(v); break;
    case DType::kU8: static_cast<uint8_t*>(out)[off] = cvt<uint8_t>(v); break;
    case DType::kBool: static_cast<bool*>(out)[off] = cvt<bool>(v); break;
  }
}

// ---- the reductions: a POD state, fold one element, combine two states, store ----------------

template <class A>
struct SumRed {
  struct State { A s; };
  __device__ State init() const { return {A(0)}; }
  template <class C> __device__ void step(State& st, C x, int64_t) const { st.s += static_cast<A>(x); }
  __device__ void combine(State& a, const State& b) const { a.s += b.s; }
  __device__ void store(const State& st, const RGeom& g, void* out, DType dt, int64_t off) const {
    if (g.mean) store_any(out, dt, off, static_cast<double>(st.s) / static_cast<double>(g.count));
    else store_any(out, dt, off, st.s);
  }
};

struct ProdRed {
  struct State { double p; };
  __device__ State init() const { return {1.0}; }
  template <class C> __device__ void step(State& st, C x, int64_t) const { st.p *= static_cast<double>(x); }
  __device__ void combine(State& a, const State& b) const { a.p *= b.p; }
  __device__ void store(const State& st, const RGeom&, void* out, DType dt, int64_t off) const {
    store_any(out, dt, off, st.p);
  }
};

struct VarRed {
  struct State { double n, mean, m2; };
  __device__ State init() const { return {0, 0, 0}; }
  template <class C> __device__ void step(State& st, C x, int64_t) const {
    const double v = static_cast<double>(x);
    st.n += 1;
    const double d = v - st.mean;
    st.mean += d / st.n;
    st.m2 += d * (v - st.mean);
  }
  __device__ void combine(State& a, const State& b) const {
    if (b.n == 0) return;
    if (a.n == 0) {
      a = b;
      return;
    }
    const double n = a.n + b.n, d = b.mean - a.mean;
    a.mean += d * (b.n / n);
    a.m2 += b.m2 + d * d * (a.n * b.n / n);
    a.n = n;
  }
  __device__ void store(const State& st, const RGeom& g, void* out, DType dt, int64_t off) const {
    const double denom = static_cast<double>(g.count - g.correction);
    store_any(out, dt, off, denom > 0 ? st.m2 / denom : __longlong_as_double(0x7ff8000000000000LL));
  }
};

// max/min and argmax/argmin: the first NaN wins; else the extreme value at the lowest index.
template <class C>
struct ExtremeRed {
  bool want_max, want_index;
  struct State { C v; int64_t i; bool any, nan; };
  __device__ State init() const { return {C(0), 0, false, false}; }
  __device__ bool better(C a, C b) const { return want_max ? a > b : a < b; }
  __device__ void step(State& st, C x, int64_t i) const {
    if (st.nan) return;
    if (!st.any || x != x || better(x, st.v)) st = {x, i, true, x != x};
  }
  __device__ void combine(State& a, const State& b) const {
    if (!b.any) return;
    if (!a.any) { a = b; return; }
    if (a.nan || b.nan) {
      if (b.nan && (!a.nan || b.i < a.i)) a = b;
      return;
    }
    if (better(b.v, a.v) || (b.v == a.v && b.i < a.i)) a = b;
  }
  __device__ void store(const State& st, const RGeom&, void* out, DType dt, int64_t off) const {
    if (want_index) store_any(out, dt, off, st.i);
    else store_any(out, dt, off, st.v);
  }
};

// Items are (output, chunk) pairs; a group of G threads reduces one item's range of the reduced
// index space. One chunk: store the result; several: write the partial state to ws.
template <class T, class R, int G>
__global__ void reduce_kernel(const T* in, void* out, DType out_dt, RGeom g, R red, int64_t nout,
                              int64_t nchunks, int64_t chunk, typename R::State* ws) {
  using State = typename R::State;
  __shared__ State sh[kThreads];
  constexpr int kGroups = kThreads / G;
  const int lane = threadIdx.x % G, group = threadIdx.x / G;
  const int64_t items = nout * nchunks;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kGroups; base < items;
       base += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t item = base + group;
    State st = red.init();
    int64_t out_off = 0;
    if (item < items) {
      const int64_t o = item / nchunks, c = item % nchunks;
      int64_t in_off;
      g.bases(o, &in_off, &out_off);
      const int64_t k0 = c * chunk, k1 = min(g.count, k0 + chunk);
      for (int64_t k = k0 + lane; k < k1; k += G) red.step(st, to_acc(in[in_off + g.roff(k)]), k);
    }
    if constexpr (G > 1) {
      sh[threadIdx.x] = st;
      for (int s = G / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (lane < s) red.combine(sh[threadIdx.x], sh[threadIdx.x + s]);
      }
      __syncthreads();
      st = sh[threadIdx.x];
      __syncthreads();  // sh is rewritten by the next iteration
    }
    if (lane == 0 && item < items) {
      if (nchunks == 1) red.store(st, g, out, out_dt, out_off);
      else ws[item] = st;
    }
  }
}

template <class R>
__global__ void combine_kernel(const typename R::State* ws, void* out, DType out_dt, RGeom g, R red,
                               int64_t nout, int64_t nchunks) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < nout; o += step) {
    typename R::State st = ws[o * nchunks];
    for (int64_t c = 1; c < nchunks; ++c) red.combine(st, ws[o * nchunks + c]);
    int64_t in_off, out_off;
    g.bases(o, &in_off, &out_off);
    red.store(st, g, out, out_dt, out_off);
  }
}

template <class T, class R, int G>
void launch_group(const ReduceParams& p, const RGeom& g, R red, int64_t nout, int64_t nchunks, int64_t chunk,
                  typename R::State* ws) {
  const int64_t blocks = ceil_div(nout * nchunks * G, kThreads);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535 * 8));
  reduce_kernel<T, R, G><<<grid, kThreads, 0, current_stream()>>>(p.in.ptr<const T>(), p.out.data, p.out.dtype, g,
                                                                   red, nout, nchunks, chunk, ws);
  MT_CUDA_LAUNCH_CHECK();
}

// The split below sizes its chunks for a GPU of this many multiprocessors (H100 and H200 SXM), not
// for the GPU at hand: the chunks fix the order of the partial sums, and results must depend on the
// shapes only, so that two GPUs of different sizes give the same bits (docs/cuda.md, "Notes").
constexpr int64_t kSplitSms = 132;

template <class T, class R>
void run(const ReduceParams& p, R red) {
  const RGeom g = make_rgeom(p);
  const int64_t nout = p.out.numel();
  if (nout == 0) return;
  const bool contiguous_reduce = g.r_stride[0] == 1;
  int G = 256;
  if (g.count <= 16 || (!contiguous_reduce && nout >= 1024)) G = 1;
  else if (g.count <= 1024) G = 32;
  // Split long reductions of few outputs over several blocks.
  int64_t nchunks = 1, chunk = std::max<int64_t>(g.count, 1);
  const int64_t blocks = ceil_div(nout * G, kThreads);
  if (G == 256 && g.count >= 32768 && blocks < 2 * kSplitSms) {
    nchunks = std::min<int64_t>({ceil_div(g.count, 8192), ceil_div(4 * kSplitSms, blocks), 1024});
    chunk = ceil_div(g.count, nchunks);
    nchunks = ceil_div(g.count, chunk);
  }
  using State = typename R::State;
  State* ws = nullptr;
  const int dev = current_device();
  if (nchunks > 1) ws = static_cast<State*>(cuda::alloc(static_cast<size_t>(nout * nchunks) * sizeof(State), dev));
  switch (G) {
    case 1: launch_group<T, R, 1>(p, g, red, nout, nchunks, chunk, ws); break;
    case 32: launch_group<T, R, 32>(p, g, red, nout, nchunks, chunk, ws); break;
    default: launch_group<T, R, 256>(p, g, red, nout, nchunks, chunk, ws); break;
  }
  if (nchunks > 1) {
    combine_kernel<R><<<grid_for(nout), 256, 0, current_stream()>>>(ws, p.out.data, p.out.dtype, g, red, nout,
                                                                     nchunks);
    MT_CUDA_LAUNCH_CHECK();
    cuda::free(ws);  // stream-ordered: the next user of the block runs after combine_kernel
  }
}

template <class T>
void reduce_typed(const ReduceParams& p) {
  using C = acc_t<T>;
  constexpr bool kFloat = std::is_floating_point_v<C>;
  using SumAcc = std::conditional_t<kFloat, std::conditional_t<kIsHalf<T>, float, double>, int64_t>;
  switch (p.op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return run<T>(p, SumRed<SumAcc>{});
    case ReduceOp::kProd: return run<T>(p, ProdRed{});
    case ReduceOp::kVar: return run<T>(p, VarRed{});
    case ReduceOp::kMax: return run<T>(p, ExtremeRed<C>{true, false});
    case ReduceOp::kMin: return run<T>(p, ExtremeRed<C>{false, false});
    case ReduceOp::kArgmax: return run<T>(p, ExtremeRed<C>{true, true});
    case ReduceOp::kArgmin: return run<T>(p, ExtremeRed<C>{false, true});
  }
}

void reduce(const ReduceParams& p) { MT_CUDA_DISPATCH_ALL(p.in.dtype, "reduce", { reduce_typed<scalar_t>(p); }); }

}  // namespace
}  // namespace mt::cuda

namespace mt {
void register_cuda_reduce(KernelTable& t) { t.reduce = cuda::reduce; }
}  // namespace mt
