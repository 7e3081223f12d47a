// CUDA throughput in one run, each figure against a baseline measured on the same device:
// bf16 GEMM TFLOP/s (4096^3, 8192^3) through meshtrain's matmul kernel and the mt::matmul front
// end vs bare cuBLASLt with its top heuristic algorithm (goal: 95%); achieved GB/s of elementwise
// add, RMSNorm and cross-entropy vs a device-to-device copy (goal: 80%); causal attention forward
// and backward TFLOP/s at seq 2048, head dim 128, bf16 (goal: 150); the GEMMs of a llama-1b step in
// linear's layouts against the fastest of cuBLASLt's top algorithms (gemm-step). Without a GPU it
// says that it cannot run and exits 0. Usage: bench_cuda [reps=20] [attention|memory|gemm-step]
#include <cublasLt.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/memory.h"
#include "runtime/cuda/stream.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "tensor/ops_nn.h"
#include "tensor/random.h"

using namespace mt;

namespace {

#define BENCH_CUBLAS(expr)                                                                 \
  do {                                                                                     \
    cublasStatus_t st_ = (expr);                                                           \
    MT_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "{} failed: {}", #expr, cublasLtGetStatusString(st_)); \
  } while (0)

int g_reps = 20;

// Milliseconds per call of f on the compute stream (after two warm-up calls).
double time_ms(const std::function<void()>& f) {
  cuda::Stream s = cuda::Stream::compute(0);
  f();
  f();
  cuda::Event start(cuda::EventTiming::kEnabled), stop(cuda::EventTiming::kEnabled);
  start.record(s);
  for (int i = 0; i < g_reps; ++i) f();
  stop.record(s);
  stop.synchronize();
  return start.elapsed_ms(stop) / g_reps;
}

// Row-major bf16 C[m, n] = A[m, k] @ B[k, n] through cuBLASLt, where A (B) may be the transpose of a
// row-major buffer [k, m] ([n, k]), as linear's forward (x W^T) and weight gradient (gY^T x) pass
// them: the layouts of the training step. Keeps cuBLASLt's top `want` heuristic algorithms so
// that each can be timed and its result compared with the first one's.
class GemmAlgos {
 public:
  GemmAlgos(int64_t m, int64_t n, int64_t k, bool a_trans, bool b_trans, int want) {
    BENCH_CUBLAS(cublasLtCreate(&h_));
    BENCH_CUBLAS(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // Column-major C^T[n, m] = op(B^T) op(A^T): the first operand is B's buffer, the second A's.
    const cublasOperation_t ta = b_trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // B row-major [k, n] is column-major [n, k] (ld n); B^T's buffer [n, k] row-major is [k, n] (ld k).
    BENCH_CUBLAS(b_trans ? cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, k, n, k)
                         : cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, n, k, n));
    BENCH_CUBLAS(a_trans ? cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, m, k, m)
                         : cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, k, m, k));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&lc_, CUDA_R_16BF, n, m, n));
    MT_CUDA_CHECK(cudaMalloc(&ws_, kWs));
    cublasLtMatmulPreference_t pref;
    BENCH_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    BENCH_CUBLAS(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWs, sizeof(kWs)));
    res_.resize(static_cast<size_t>(want));
    int found = 0;
    BENCH_CUBLAS(cublasLtMatmulAlgoGetHeuristic(h_, desc_, lb_, la_, lc_, lc_, pref, want, res_.data(), &found));
    res_.resize(static_cast<size_t>(found));
    (void)cublasLtMatmulPreferenceDestroy(pref);
  }
  ~GemmAlgos() {
    (void)cudaFree(ws_);
    (void)cublasLtMatrixLayoutDestroy(lc_);
    (void)cublasLtMatrixLayoutDestroy(la_);
    (void)cublasLtMatrixLayoutDestroy(lb_);
    (void)cublasLtMatmulDescDestroy(desc_);
    (void)cublasLtDestroy(h_);
  }
  GemmAlgos(const GemmAlgos&) = delete;
  GemmAlgos& operator=(const GemmAlgos&) = delete;
  int count() const { return static_cast<int>(res_.size()); }
  void run(int i, const void* a, const void* b, void* c) const {
    const float alpha = 1, beta = 0;
    const cublasLtMatmulAlgo_t* algo = &res_[static_cast<size_t>(i)].algo;
    BENCH_CUBLAS(cublasLtMatmul(h_, desc_, &alpha, b, lb_, a, la_, &beta, c, lc_, c, lc_, algo, ws_, kWs,
                                cuda::Stream::compute(0).handle()));
  }

 private:
  static constexpr size_t kWs = size_t{32} << 20;
  cublasLtHandle_t h_{};
  cublasLtMatmulDesc_t desc_{};
  cublasLtMatrixLayout_t la_{}, lb_{}, lc_{};
  void* ws_ = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> res_;
};

// Bare cuBLASLt bf16 GEMM with its top heuristic algorithm, row-major C[m, n] = A[m, k] @ B[k, n]
// as the column-major product C^T[n, m] = B^T[n, k] A^T[k, m] (the same buffers, no copies).
double bare_cublaslt_ms(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c) {
  const GemmAlgos algos(m, n, k, false, false, 1);
  MT_CHECK(algos.count() > 0, "cuBLASLt found no bf16 algorithm for {} x {} x {}", m, n, k);
  return time_ms([&] { algos.run(0, a, b, c); });
}

const char* verdict(double ratio, double goal) { return ratio >= goal ? "met" : "NOT met"; }

// The GEMMs of one llama-1b training step (8192 tokens, 16 layers) in the layouts linear uses:
// forward y = x W^T, input gradient gX = gY W, weight gradient gW = gY^T x. For each: mt::matmul
// (heuristic #1 of its own descriptors), and the fastest of cuBLASLt's top 8 heuristic algorithms
// for the same layout, with whether its bits equal algorithm #1's; then the step's GEMM time both
// ways (calls per step x time). Tells whether choosing algorithms per shape would pay.
void bench_gemm_step() {
  const auto opts = TensorOptions(DType::kBF16).with_device(Device::cuda(0));
  const int64_t tok = 8192, layers = 16;
  struct Linear {
    const char* name;
    int64_t in, out, per_step;
  };
  const Linear lins[] = {{"q/o", 2048, 2048, 2 * layers}, {"k/v", 2048, 512, 2 * layers},
                         {"gate/up", 2048, 8192, 2 * layers}, {"down", 8192, 2048, layers},
                         {"lm_head", 2048, 128256, 1}};
  double step_mt = 0, step_best = 0;
  for (const Linear& l : lins) {
    Tensor x = uniform({tok, l.in}, -1, 1, opts), w = uniform({l.out, l.in}, -0.05, 0.05, opts);
    Tensor gy = uniform({tok, l.out}, -1, 1, opts);
    struct Case {
      const char* what;
      Tensor a, b;  // logical operands of C = A @ B
      bool a_trans, b_trans;
    };
    const Case cases[] = {{"forward x W^T", x, w.t(), false, true},
                          {"input grad gY W", gy, w, false, false},
                          {"weight grad gY^T x", gy.t(), x, true, false}};
    for (const Case& c : cases) {
      const int64_t m = c.a.size(0), k = c.a.size(1), n = c.b.size(1);
      const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
      auto tf = [&](double ms) { return flops / (ms * 1e-3) * 1e-12; };
      Tensor out;
      const double mt_ms = time_ms([&] { out = matmul(c.a, c.b); });
      GemmAlgos algos(m, n, k, c.a_trans, c.b_trans, 8);
      // The operands' buffers: a transposed view starts where its storage does.
      const void* pa = c.a.data_ptr();
      const void* pb = c.b.data_ptr();
      Tensor first = empty({m, n}, opts), other = empty({m, n}, opts);
      double best = 1e30;
      int best_i = -1;
      for (int i = 0; i < algos.count(); ++i) {
        try {
          const double ms = time_ms([&] { algos.run(i, pa, pb, other.data_ptr()); });
          if (ms < best) {
            best = ms;
            best_i = i;
          }
        } catch (const std::exception&) {
          // an algorithm the heuristic offered but that refuses these pointers
        }
      }
      bool best_same = true;
      if (best_i > 0) {
        algos.run(0, pa, pb, first.data_ptr());
        algos.run(best_i, pa, pb, other.data_ptr());
        MT_CUDA_CHECK(cudaStreamSynchronize(cuda::Stream::compute(0).handle()));
        auto bits = [](const Tensor& t) {
          std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
          MT_CUDA_CHECK(cudaMemcpy(v.data(), t.data_ptr(), v.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
          return v;
        };
        best_same = bits(first) == bits(other);
      }
      if (best_i < 0) {
        fmt::print("gemm-step {} {} [{}x{}x{}]: mt::matmul {:.1f} TFLOP/s | no cuBLASLt algorithm ran\n", l.name,
                   c.what, m, n, k, tf(mt_ms));
        best = mt_ms;
      } else {
        fmt::print("gemm-step {} {} [{}x{}x{}]: mt::matmul {:.1f} TFLOP/s | fastest of cuBLASLt's top {}: #{} {:.1f} "
                   "TFLOP/s ({:.2f}x), bits {} #1's\n",
                   l.name, c.what, m, n, k, tf(mt_ms), algos.count(), best_i + 1, tf(best), mt_ms / best,
                   best_same ? "equal to" : "differ from");
      }
      step_mt += static_cast<double>(l.per_step) * mt_ms;
      step_best += static_cast<double>(l.per_step) * std::min(best, mt_ms);
    }
  }
  fmt::print("gemm-step llama-1b step GEMMs (batch 4 x 2048): mt::matmul {:.1f} ms, best algorithm per shape {:.1f} ms "
             "({:.2f}x)\n",
             step_mt, step_best, step_mt / step_best);
}

// C[m, n] = A[m, k] @ B[k, n] in bf16: the meshtrain kernel and mt::matmul against bare cuBLASLt.
void bench_gemm(int64_t m, int64_t n, int64_t k, const std::string& what) {
  const auto opts = TensorOptions(DType::kBF16).with_device(Device::cuda(0));
  Tensor a = uniform({m, k}, -1, 1, opts), b = uniform({k, n}, -1, 1, opts);
  Tensor c = empty({m, n}, opts);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const double bare = bare_cublaslt_ms(m, n, k, a.data_ptr(), b.data_ptr(), c.data_ptr());
  MatmulParams p;
  p.a = a.view_info();
  p.b = b.view_info();
  p.out = c.view_info();
  const double kernel = time_ms([&] { MT_KERNEL(DeviceType::kCUDA, matmul, p); });
  const double front = time_ms([&] { c = matmul(a, b); });
  auto tf = [&](double ms) { return flops / (ms * 1e-3) * 1e-12; };
  fmt::print("gemm bf16 {}: bare cuBLASLt {:.1f} TFLOP/s | meshtrain kernel {:.1f} TFLOP/s, ratio {:.3f} (goal >= "
             "0.95): {} | mt::matmul {:.1f} TFLOP/s, ratio {:.3f}\n",
             what, tf(bare), tf(kernel), bare / kernel, verdict(bare / kernel, 0.95), tf(front), bare / front);
}
void bench_gemm(int64_t n) { bench_gemm(n, n, n, fmt::format("{}^3", n)); }

// GB/s of f moving `bytes` per call; "n/a" with the reason when the op has no CUDA kernel yet.
void bench_bandwidth(const char* name, double bytes, double copy_gbs, const std::function<void()>& f) {
  try {
    const double ms = time_ms(f);
    const double gbs = bytes / (ms * 1e-3) * 1e-9;
    fmt::print("{:<28} {:8.1f} GB/s, ratio to copy {:.3f} (goal >= 0.80): {}\n", name, gbs, gbs / copy_gbs,
               verdict(gbs / copy_gbs, 0.80));
  } catch (const std::exception& e) {
    fmt::print("{:<28} n/a: {}\n", name, e.what());
  }
}

// Causal GQA attention forward + backward, bf16 [B, H, T, D]: TFLOP/s counting the causal half
// only (forward 2 matmuls of 2*T*T*D/2 per head; backward 2.5x the forward, FlashAttention-2's
// convention) against the 150 TFLOP/s goal.
void bench_attention(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t D) {
  try {
    const auto opts = TensorOptions(DType::kBF16).with_device(Device::cuda(0));
    Tensor q = uniform({B, Hq, T, D}, -1, 1, opts).requires_grad_(true);
    Tensor k = uniform({B, Hkv, T, D}, -1, 1, opts).requires_grad_(true);
    Tensor v = uniform({B, Hkv, T, D}, -1, 1, opts).requires_grad_(true);
    Tensor g = uniform({B, Hq, T, D}, -1, 1, opts);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const double fwd_flops = 4.0 * static_cast<double>(B * Hq) * static_cast<double>(T) * static_cast<double>(T) *
                             static_cast<double>(D) / 2;
    Tensor o;
    const double fwd = time_ms([&] {
      NoGradGuard no_grad;
      o = scaled_dot_product_attention(q, k, v, Causal::kYes, scale);
    });
    const double both = time_ms([&] {
      o = scaled_dot_product_attention(q, k, v, Causal::kYes, scale);
      o.backward(g);
      q.set_grad(Tensor());
      k.set_grad(Tensor());
      v.set_grad(Tensor());
    });
    const double tf = 3.5 * fwd_flops / (both * 1e-3) * 1e-12;
    fmt::print("attention bf16 causal B={} Hq={} Hkv={} T={} D={}: forward {:.1f} TFLOP/s, forward+backward {:.1f} "
               "TFLOP/s (goal >= 150): {}\n",
               B, Hq, Hkv, T, D, fwd_flops / (fwd * 1e-3) * 1e-12, tf, tf >= 150 ? "met" : "NOT met");
  } catch (const std::exception& e) {
    fmt::print("attention bf16 T={} D={}: n/a: {}\n", T, D, e.what());
  }
}

// Backward kernels of the llama-1b step (8192 tokens, hidden 2048, MLP 8192, vocabulary 128256):
// RMSNorm's, SwiGLU's in one pass (against its three unfused passes) and the embedding's
// index_add, over uniform tokens and over a skewed batch (75% one token: one long sorted run).
void bench_backward_kernels(double copy_gbs) {
  const auto bf16 = TensorOptions(DType::kBF16).with_device(Device::cuda(0));
  const int64_t tok = 8192, hidden = 2048, inter = 8192, vocab = 128256;
  {
    Tensor x = uniform({tok, hidden}, -1, 1, bf16), w = ones({hidden}, bf16), y = empty({tok, hidden}, bf16);
    Tensor gy = uniform({tok, hidden}, -1, 1, bf16), gx = empty({tok, hidden}, bf16), gw = empty({hidden}, bf16);
    Tensor rstd = empty({tok}, TensorOptions().with_device(Device::cuda(0)));
    RmsNormParams f{x.view_info(), w.view_info(), y.view_info(), rstd.view_info(), 1e-5};
    MT_KERNEL(DeviceType::kCUDA, rms_norm, f);
    RmsNormBwdParams b{gy.view_info(), x.view_info(), w.view_info(), rstd.view_info(), gx.view_info(), gw.view_info()};
    bench_bandwidth("rms_norm backward bf16 [8192, 2048]", 3.0 * static_cast<double>(tok * hidden) * 2, copy_gbs,
                    [&] { MT_KERNEL(DeviceType::kCUDA, rms_norm_bwd, b); });
  }
  {
    Tensor a = uniform({tok, inter}, -4, 4, bf16), up = uniform({tok, inter}, -1, 1, bf16);
    Tensor g = uniform({tok, inter}, -1, 1, bf16), da = empty({tok, inter}, bf16), db = empty({tok, inter}, bf16);
    SiluMulBwdParams p{a.view_info(), up.view_info(), g.view_info(), da.view_info(), db.view_info()};
    const double bytes = 5.0 * static_cast<double>(tok * inter) * 2;
    bench_bandwidth("silu_mul backward bf16 [8192, 8192]", bytes, copy_gbs,
                    [&] { MT_KERNEL(DeviceType::kCUDA, silu_mul_bwd, p); });
    Tensor t0, t1, t2;
    const double fused = time_ms([&] { MT_KERNEL(DeviceType::kCUDA, silu_mul_bwd, p); });
    const double unfused = time_ms([&] {  // the passes it replaces: g * up, silu'(a) * that, silu(a) * g
      t0 = mul(g, up);
      t1 = silu_mul(a, t0);
      t2 = silu_mul(a, g);
    });
    fmt::print("silu_mul backward: one pass {:.3f} ms vs three passes {:.3f} ms, speedup {:.2f}x\n", fused, unfused,
               unfused / fused);
  }
  for (bool skewed : {false, true}) {
    std::vector<int64_t> ids(static_cast<size_t>(tok));
    uint64_t st = 12345;
    for (size_t i = 0; i < ids.size(); ++i) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      ids[i] = skewed && i % 4 != 0 ? 13 : static_cast<int64_t>((st >> 33) % static_cast<uint64_t>(vocab));
    }
    Tensor ix = from_vector<int64_t>(ids, {tok}).to(Device::cuda(0));
    Tensor src = uniform({tok, hidden}, -1, 1, bf16), out = zeros({vocab, hidden}, bf16);
    IndexAddParams p;
    p.out = out.view_info();
    p.dim = 0;
    p.index = ix.view_info();
    p.src = src.view_info();
    p.alpha = 1;
    bench_bandwidth(skewed ? "embedding backward, 75% one id" : "embedding backward, uniform ids",
                    3.0 * static_cast<double>(tok * hidden) * 2, copy_gbs,
                    [&] { MT_KERNEL(DeviceType::kCUDA, index_add, p); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_reps = std::max(1, std::atoi(argv[1]));
  // "attention": the attention figures alone; "memory": the memory-bound kernels alone (the copy
  // baseline and every GB/s figure), e.g. for A/B runs of a kernel's variants.
  const std::string only = argc > 2 ? argv[2] : "";
  if (cuda::device_count() == 0) {
    fmt::print("bench_cuda: cannot run: no CUDA device ({})\n", cuda::unavailable_reason());
    return 0;
  }
  try {
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    fmt::print("device: {} ({} SMs), {} reps per figure\n", prop.name, prop.multiProcessorCount, g_reps);
    manual_seed(0);
    if (only == "attention") {
      bench_attention(4, 16, 8, 2048, 128);
      bench_attention(4, 32, 8, 2048, 64);
      return 0;
    }
    if (only == "gemm-step") {
      bench_gemm_step();
      return 0;
    }
    if (only != "memory") {
      bench_gemm(4096);
      bench_gemm(8192);
      // llama-1b (Llama 3.2 1B) at batch 4 x 2048 = 8192 tokens: [tokens, in] @ [in, out].
      const int64_t tok = 8192;
      bench_gemm(tok, 2048, 2048, "llama-1b q/o proj 8192x2048x2048");
      bench_gemm(tok, 512, 2048, "llama-1b k/v proj 8192x512x2048");
      bench_gemm(tok, 8192, 2048, "llama-1b gate/up 8192x8192x2048");
      bench_gemm(tok, 2048, 8192, "llama-1b down 8192x2048x8192");
      bench_gemm(tok, 128256, 2048, "llama-1b lm_head 8192x128256x2048");
      bench_gemm_step();
      bench_attention(4, 16, 8, 2048, 128);
      bench_attention(4, 32, 8, 2048, 64);
    }

    const Device gpu = Device::cuda(0);
    const int64_t rows = 8192, hidden = 4096, vocab = 32768, tokens = 4096;
    // Device-to-device copy of 256 MiB: the bandwidth baseline (read + write).
    const int64_t n = int64_t{64} << 20;
    Tensor src = ones({n}, TensorOptions().with_device(gpu)), dst = empty({n}, TensorOptions().with_device(gpu));
    cudaStream_t s = cuda::Stream::compute(0).handle();
    const double copy_ms = time_ms([&] {
      MT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(n) * 4,
                                    cudaMemcpyDeviceToDevice, s));
    });
    const double copy_gbs = 2.0 * static_cast<double>(n) * 4 / (copy_ms * 1e-3) * 1e-9;
    fmt::print("{:<28} {:8.1f} GB/s (baseline)\n", "device-to-device copy", copy_gbs);

    Tensor y = ones({n}, TensorOptions().with_device(gpu));
    bench_bandwidth("add f32 (a + b)", 3.0 * static_cast<double>(n) * 4, copy_gbs, [&] { dst = add(src, y); });
    Tensor hb = src.to(DType::kBF16), yb = y.to(DType::kBF16);
    Tensor ob;
    bench_bandwidth("add bf16 (a + b)", 3.0 * static_cast<double>(n) * 2, copy_gbs, [&] { ob = add(hb, yb); });
    bench_bandwidth("silu bf16", 2.0 * static_cast<double>(n) * 2, copy_gbs, [&] { ob = silu(hb); });

    Tensor x = uniform({rows, hidden}, -1, 1, TensorOptions(DType::kBF16).with_device(gpu));
    Tensor w = ones({hidden}, TensorOptions(DType::kBF16).with_device(gpu));
    Tensor r;
    bench_bandwidth("rms_norm bf16 [8192, 4096]", 2.0 * static_cast<double>(rows * hidden) * 2, copy_gbs,
                    [&] { r = rms_norm(x, w); });
    {
      // LLaMA's rope on llama-1b's q at batch 4 x 2048: x [4, 2048, 32, 64] bf16, f32 tables
      // [2048, 1, 32] (zero stride over heads); the backward is the same kernel, inverse.
      auto [c, sn] = rope_tables(2048, 64, 500000.0, DType::kF32);
      Tensor c3 = c.to(gpu).unsqueeze(1), s3 = sn.to(gpu).unsqueeze(1);
      Tensor q = uniform({4, 2048, 32, 64}, -1, 1, TensorOptions(DType::kBF16).with_device(gpu)), qr;
      bench_bandwidth("rope bf16 [4, 2048, 32, 64]", 2.0 * static_cast<double>(q.numel()) * 2, copy_gbs,
                      [&] { qr = rotary_embedding(q, c3, s3, RopeStyle::kHalf); });
    }
    bench_backward_kernels(copy_gbs);
    Tensor logits = uniform({tokens, vocab}, -4, 4, TensorOptions(DType::kBF16).with_device(gpu));
    Tensor target = randint(0, vocab, {tokens}, TensorOptions(DType::kI64).with_device(gpu));
    Tensor loss;
    // The kernels alone, then the op (which also checks every target on the host: one copy back).
    Tensor rows_loss = empty({tokens}, TensorOptions().with_device(gpu)), lse = empty({tokens}, TensorOptions().with_device(gpu));
    CrossEntropyParams cp{logits.view_info(), target.view_info(), rows_loss.view_info(), lse.view_info(), -100};
    bench_bandwidth("cross_entropy bf16 [4096, 32768]", static_cast<double>(tokens * vocab) * 2, copy_gbs,
                    [&] { MT_KERNEL(DeviceType::kCUDA, cross_entropy, cp); });
    Tensor glogits = empty({tokens, vocab}, TensorOptions(DType::kBF16).with_device(gpu));
    Tensor gloss = ones({tokens}, TensorOptions().with_device(gpu));
    CrossEntropyBwdParams cb{logits.view_info(), target.view_info(), lse.view_info(), gloss.view_info(),
                             glogits.view_info(), -100};
    bench_bandwidth("cross_entropy backward bf16 [4096, 32768]", 2.0 * static_cast<double>(tokens * vocab) * 2,
                    copy_gbs, [&] { MT_KERNEL(DeviceType::kCUDA, cross_entropy_bwd, cb); });
    const double op_ms = time_ms([&] { loss = cross_entropy(logits, target); });
    fmt::print("cross_entropy op (mean loss; targets checked on the host): {:.3f} ms, {:.1f} GB/s\n", op_ms,
               static_cast<double>(tokens * vocab) * 2 / (op_ms * 1e-3) * 1e-9);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_cuda: {}\n", e.what());
    return 1;
  }
  return 0;
}
