// bf16 / f16 attention on tensor cores (kernels/cuda/attention_tc.cu) against an f64 reference
// on the CPU computed from the same (16-bit) inputs: output and the gradients of q, k and v, for
// causal and full attention, GQA, S > T and S < T (rows that see no key), head dims 64 and 128,
// padded head dims (80, 32 -> bucket 64/128) and Dv != D, sizes that are not multiples of the
// tiles. Errors are measured as max |cuda - ref| / max |ref| per tensor. The backward is
// deterministic: two runs give the same bits. Skips (exit 77) without a GPU.
#include <cmath>
#include <string>
#include <vector>

#include "cuda_testing.h"
#include "models/generate.h"
#include "models/llama.h"
#include "testing.h"

using namespace mt;
using mt::testing::rand;

namespace {

Tensor on_cuda(const Tensor& t) { return t.to(Device::cuda()); }

// max |got - ref| / max |ref|, in f64 on the CPU.
double rel_err(const Tensor& got, const Tensor& ref) {
  Tensor g = got.detach().to(Device::cpu()).to(DType::kF64), r = ref.detach().to(DType::kF64);
  const double den = max(abs(r)).item();
  return max(abs(g - r)).item() / (den > 0 ? den : 1.0);
}

struct Case {
  int64_t B, Hq, Hkv, T, S, D, Dv;
  Causal causal;
};

struct Result {
  Tensor out, gq, gk, gv;
};

Result run(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g, Causal causal) {
  Tensor q = q0.detach().clone().requires_grad_(true), k = k0.detach().clone().requires_grad_(true),
         v = v0.detach().clone().requires_grad_(true);
  Tensor out = scaled_dot_product_attention(q, k, v, causal);
  out.backward(g);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

}  // namespace

TEST_CASE("cuda 16-bit tensor-core attention matches an f64 reference", "[cuda]") {
  mt::testing::require_cuda();
  const Case cases[] = {
      {2, 8, 2, 300, 300, 64, 64, Causal::kYes},    // GQA 4, T across tiles
      {1, 4, 4, 257, 257, 128, 128, Causal::kNo},   // full attention, D = 128
      {1, 4, 1, 100, 300, 128, 128, Causal::kYes},  // S > T: diagonal offset
      {1, 2, 2, 200, 50, 64, 64, Causal::kYes},     // S < T: the first 150 rows see no key
      {1, 3, 1, 130, 130, 80, 80, Causal::kYes},    // D padded to 128
      {2, 2, 1, 70, 90, 32, 64, Causal::kNo},       // Dv != D
      {1, 2, 2, 1, 200, 64, 64, Causal::kYes},      // one query
      {1, 2, 1, 1024, 1024, 128, 128, Causal::kYes},
  };
  for (DType dt : {DType::kBF16, DType::kF16}) {
    // Rounding P and dS to the input dtype before their second product bounds the error: a few
    // ulps of the dtype, relative to the tensor's largest magnitude (measured on an H200: bf16
    // 1.7e-3 to 4.6e-3, f16 2.3e-4 to 6.4e-4).
    const double tol = dt == DType::kBF16 ? 1e-2 : 2e-3;
    for (const Case& c : cases) {
      INFO(fmt::format("{} B {} Hq {} Hkv {} T {} S {} D {} Dv {} causal {}", dt, c.B, c.Hq, c.Hkv, c.T, c.S, c.D,
                       c.Dv, c.causal == Causal::kYes));
      // 16-bit inputs; the reference sees the same values in f64.
      Tensor q = rand({c.B, c.Hq, c.T, c.D}, dt, 41, -2, 2), k = rand({c.B, c.Hkv, c.S, c.D}, dt, 42, -2, 2);
      Tensor v = rand({c.B, c.Hkv, c.S, c.Dv}, dt, 43), g = rand({c.B, c.Hq, c.T, c.Dv}, dt, 44);
      const Result ref = run(q.to(DType::kF64), k.to(DType::kF64), v.to(DType::kF64), g.to(DType::kF64), c.causal);
      const Result got = run(on_cuda(q), on_cuda(k), on_cuda(v), on_cuda(g), c.causal);
      REQUIRE(got.out.dtype() == dt);
      REQUIRE(got.gq.dtype() == dt);
      const double eo = rel_err(got.out, ref.out), eq = rel_err(got.gq, ref.gq), ek = rel_err(got.gk, ref.gk),
                   ev = rel_err(got.gv, ref.gv);
      const std::string errs = fmt::format("relative errors: out {:.2e} dq {:.2e} dk {:.2e} dv {:.2e}", eo, eq, ek, ev);
      fmt::print("{} B {} Hq {} Hkv {} T {} S {} D {} Dv {} causal {}: {}\n", dt, c.B, c.Hq, c.Hkv, c.T, c.S, c.D,
                 c.Dv, c.causal == Causal::kYes, errs);
      INFO(errs);
      CHECK(eo < tol);
      CHECK(eq < tol);
      CHECK(ek < tol);
      CHECK(ev < tol);
      if (c.T > c.S && c.causal == Causal::kYes) {  // rows that see no key: exactly zero output
        Tensor head = got.out.to(Device::cpu()).to(DType::kF64).narrow(2, 0, c.T - c.S);
        CHECK(max(abs(head)).item() == 0.0);
      }
    }
  }
}

TEST_CASE("cuda 16-bit attention backward is deterministic", "[cuda]") {
  mt::testing::require_cuda();
  const Tensor q = on_cuda(rand({2, 8, 500, 128}, DType::kBF16, 51, -2, 2));
  const Tensor k = on_cuda(rand({2, 2, 500, 128}, DType::kBF16, 52, -2, 2));
  const Tensor v = on_cuda(rand({2, 2, 500, 128}, DType::kBF16, 53));
  const Tensor g = on_cuda(rand({2, 8, 500, 128}, DType::kBF16, 54));
  const Result a = run(q, k, v, g, Causal::kYes), b = run(q, k, v, g, Causal::kYes);
  for (auto [x, y] : {std::pair{a.out, b.out}, {a.gq, b.gq}, {a.gk, b.gk}, {a.gv, b.gv}})
    CHECK(max(abs(x.to(DType::kF32) - y.to(DType::kF32))).item() == 0.0);
}

TEST_CASE("cuda 16-bit attention with odd head dims takes the f32 path", "[cuda]") {
  mt::testing::require_cuda();
  // D = 7 is not a multiple of 8: the front end computes in f32 and returns bf16.
  Tensor q = rand({1, 2, 20, 7}, DType::kBF16, 61), k = rand({1, 1, 20, 7}, DType::kBF16, 62);
  Tensor v = rand({1, 1, 20, 7}, DType::kBF16, 63), g = rand({1, 2, 20, 7}, DType::kBF16, 64);
  const Result ref = run(q.to(DType::kF64), k.to(DType::kF64), v.to(DType::kF64), g.to(DType::kF64), Causal::kYes);
  const Result got = run(on_cuda(q), on_cuda(k), on_cuda(v), on_cuda(g), Causal::kYes);
  REQUIRE(got.out.dtype() == DType::kBF16);
  CHECK(rel_err(got.out, ref.out) < 1e-2);
  CHECK(rel_err(got.gk, ref.gk) < 1e-2);
}

TEST_CASE("cuda 16-bit attention reads [B, T, H, D] views in place and writes that layout", "[cuda]") {
  mt::testing::require_cuda();
  // Models pass q/k/v as transpose(1, 2) views of [B, T, H, D] projections; the kernel reads them
  // with their strides, writes the output in [B, T, H, D] memory and the gradients in their
  // input's layout. Values against the f64 reference from contiguous copies.
  const int64_t B = 2, T = 150, Hq = 4, Hkv = 2, D = 64;
  const Tensor xq = rand({B, T, Hq, D}, DType::kBF16, 71, -2, 2), xk = rand({B, T, Hkv, D}, DType::kBF16, 72, -2, 2);
  const Tensor xv = rand({B, T, Hkv, D}, DType::kBF16, 73), g = rand({B, Hq, T, D}, DType::kBF16, 74);
  const Result ref = run(xq.transpose(1, 2).to(DType::kF64), xk.transpose(1, 2).to(DType::kF64),
                         xv.transpose(1, 2).to(DType::kF64), g.to(DType::kF64), Causal::kYes);
  Tensor q = on_cuda(xq).requires_grad_(true), k = on_cuda(xk).requires_grad_(true),
         v = on_cuda(xv).requires_grad_(true);
  Tensor out = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), Causal::kYes);
  CHECK(out.transpose(1, 2).is_contiguous());  // [B, T, H, D] memory
  out.backward(on_cuda(g));
  CHECK(rel_err(out, ref.out) < 1e-2);
  CHECK(rel_err(q.grad().transpose(1, 2), ref.gq) < 1e-2);
  CHECK(rel_err(k.grad().transpose(1, 2), ref.gk) < 1e-2);
  CHECK(rel_err(v.grad().transpose(1, 2), ref.gv) < 1e-2);
  // A view whose rows are not 16-byte aligned (D sliced from 72 to 64 at offset 4) is copied first.
  Tensor wide = on_cuda(rand({B, Hq, T, 72}, DType::kBF16, 75, -2, 2));
  Tensor qn = wide.narrow(3, 4, 64);
  const Tensor o1 = scaled_dot_product_attention(qn, k.detach().transpose(1, 2), v.detach().transpose(1, 2));
  const Tensor o2 = scaled_dot_product_attention(qn.contiguous(), k.detach().transpose(1, 2), v.detach().transpose(1, 2));
  CHECK(max(abs(o1.to(DType::kF32) - o2.to(DType::kF32))).item() == 0.0);
}

TEST_CASE("cuda incremental decoding (KV cache) gives the CPU's logits", "[cuda]") {
  mt::testing::require_cuda();
  // Generation's cached path on the GPU: each step's query row attends over a strided view of
  // the cache's [B, kv heads, capacity, D] buffers (S > T, causal offset). The CPU chooses the
  // tokens (greedy, f32), and the GPU is fed the same ones, so near-ties cannot make the two
  // sequences part; f32 logits within 1e-4 of the largest, bf16 within 3e-2.
  for (DType dt : {DType::kF32, DType::kBF16}) {
    ModelConfig c = builtin_config("llama-tiny");
    manual_seed(3);
    auto cpu = build_causal_lm(c, dt);
    manual_seed(3);
    auto gpu = build_causal_lm(c, dt);
    gpu->to(Device::cuda());
    const Tensor prompt = from_vector<int64_t>({84, 104, 101, 32, 114, 105, 118, 101, 114, 32}, Shape{2, 5});
    GenerateOptions o;
    o.max_new_tokens = 12;
    o.sampling.temperature = 0;
    std::vector<Tensor> ref;
    const auto tokens = generate(*cpu, prompt, o, [&](int64_t, const Tensor& l) { ref.push_back(l.clone()); });
    gpu->eval();
    NoGradGuard no_grad;
    KvCache cache(5 + 12);
    gpu->set_kv_cache(&cache);
    Tensor feed = prompt.to(Device::cuda());
    for (size_t s = 0; s < ref.size(); ++s) {
      const Tensor l = gpu->last_logits(feed);
      INFO(dtype_name(dt) << " step " << s);
      CHECK(rel_err(l, ref[s]) < (dt == DType::kF32 ? 1e-4 : 3e-2));
      feed = from_vector<int64_t>({tokens[0][s], tokens[1][s]}, Shape{2, 1}).to(Device::cuda());
    }
    gpu->set_kv_cache(nullptr);
  }
}
