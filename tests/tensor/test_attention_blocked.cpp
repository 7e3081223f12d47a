// The blocked CPU attention kernels (kernels/cpu/attention.cpp) called directly, against the
// scalar double kernels they replaced (kernels/cpu/attention_reference.h): f32 and bf16 (f32 lse),
// causal and not, grouped kv heads, T != S (rows with no visible key), D != Dv, sizes that are no
// multiple of the 64-row blocks or 256-row chunks, operands read through [B, T, H, D] strides; and bitwise the same
// results with 1 and 2 OpenMP threads.
#include <cmath>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/attention_reference.h"
#include "kernels/registry.h"
#include "testing.h"

using namespace mt;
using mt::testing::rand;

namespace {

struct Case {
  int64_t B, Hq, Hkv, T, S, D, Dv;
  bool causal;
};

const Case kCases[] = {
    {1, 4, 2, 67, 131, 24, 40, true},   // GQA, S > T, odd sizes (tails in both block dims)
    {1, 4, 2, 67, 131, 24, 40, false},  // the same, full
    {2, 3, 1, 130, 70, 16, 8, true},    // multi-query, S < T: the first 60 rows see no key
    {1, 2, 2, 64, 64, 32, 32, true},    // whole blocks
    {2, 2, 1, 1, 5, 7, 3, false},       // one query row
    {1, 4, 2, 300, 300, 16, 16, true},  // past the 256-row chunks: a chunk tail in both passes
    {1, 2, 1, 290, 530, 8, 12, true},   // S > T by more than a chunk: the forward's key chunks cut
                                        // at the causal end, the backward's query chunks shifted
    {1, 2, 1, 530, 270, 8, 8, true},    // S < T: 260 rows see no key, key blocks start late
};

// [B, H, L, X] with [B, L, H, X] memory, as a model's projections produce it.
Tensor bthd(const Tensor& t) { return t.transpose(1, 2).contiguous().transpose(1, 2); }

struct Result {
  Tensor out, lse, gq, gk, gv;
};

// The kernels' parameters: q, k, v into r.out and r.lse (scale 1/sqrt(D)); then gout into r's
// gradients, with the forward's operands.
AttentionParams forward_params(const Tensor& q, const Tensor& k, const Tensor& v, const Result& r, bool causal) {
  AttentionParams p;
  p.q = q.view_info();
  p.k = k.view_info();
  p.v = v.view_info();
  p.out = r.out.view_info();
  p.lse = r.lse.view_info();
  p.scale = 1 / std::sqrt(static_cast<double>(q.shape()[3]));
  p.causal = causal;
  return p;
}

AttentionBwdParams backward_params(const AttentionParams& p, const Tensor& gout, const Result& r) {
  AttentionBwdParams b;
  b.q = p.q;
  b.k = p.k;
  b.v = p.v;
  b.out = p.out;
  b.lse = p.lse;
  b.gout = gout.view_info();
  b.gq = r.gq.view_info();
  b.gk = r.gk.view_info();
  b.gv = r.gv.view_info();
  b.scale = p.scale;
  b.causal = p.causal;
  return b;
}

// Forward and backward of the registered CPU kernels on q, k, v, gout in their own dtype and
// layout; lse is f32 (f64 for f64). Outputs and gradients are written in [B, T, H, D] memory.
Result run_kernels(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& gout, bool causal) {
  const DType ldt = q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const Shape &qs = q.shape(), &vs = v.shape();
  Result r;
  r.out = bthd(zeros(Shape{qs[0], qs[1], qs[2], vs[3]}, q.dtype()));
  r.lse = zeros(Shape{qs[0], qs[1], qs[2]}, ldt);
  r.gq = bthd(zeros(q.shape(), q.dtype()));
  r.gk = bthd(zeros(k.shape(), q.dtype()));
  r.gv = bthd(zeros(v.shape(), q.dtype()));
  const AttentionParams p = forward_params(q, k, v, r, causal);
  kernels(DeviceType::kCPU).attention(p);
  const AttentionBwdParams b = backward_params(p, gout, r);
  kernels(DeviceType::kCPU).attention_bwd(b);
  return r;
}

// The reference kernels on contiguous f64 copies.
Result run_reference(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& gout0, bool causal) {
  Tensor q = q0.to(DType::kF64).contiguous(), k = k0.to(DType::kF64).contiguous();
  Tensor v = v0.to(DType::kF64).contiguous(), gout = gout0.to(DType::kF64).contiguous();
  const Shape &qs = q.shape(), &vs = v.shape();
  Result r;
  r.out = zeros(Shape{qs[0], qs[1], qs[2], vs[3]}, DType::kF64);
  r.lse = zeros(Shape{qs[0], qs[1], qs[2]}, DType::kF64);
  r.gq = zeros(q.shape(), DType::kF64);
  r.gk = zeros(k.shape(), DType::kF64);
  r.gv = zeros(v.shape(), DType::kF64);
  const AttentionParams p = forward_params(q, k, v, r, causal);
  cpu::attention_reference(p);
  const AttentionBwdParams b = backward_params(p, gout, r);
  cpu::attention_bwd_reference(b);
  return r;
}

struct Inputs {
  Tensor q, k, v, gout;
};

// Random inputs in dtype dt, q, k, v seen through [B, T, H, D] strides.
Inputs make_inputs(const Case& c, DType dt, uint64_t seed) {
  Inputs in;
  in.q = bthd(rand({c.B, c.Hq, c.T, c.D}, dt, seed, -2, 2));
  in.k = bthd(rand({c.B, c.Hkv, c.S, c.D}, dt, seed + 1, -2, 2));
  in.v = bthd(rand({c.B, c.Hkv, c.S, c.Dv}, dt, seed + 2));
  in.gout = rand({c.B, c.Hq, c.T, c.Dv}, dt, seed + 3);
  return in;
}

}  // namespace

TEST_CASE("blocked attention kernels match the double reference", "[cpu]") {
  struct Tol {
    DType dt;
    double out, grad;  // rtol = atol
  };
  // f32: f32 accumulation over up to 131 keys. bf16: 16-bit output and gradients (8 bits of
  // mantissa), against a reference on the same bf16-rounded inputs.
  const Tol tols[] = {{DType::kF32, 2e-5, 1e-4}, {DType::kBF16, 1e-2, 2e-2}, {DType::kF64, 1e-12, 1e-11}};
  uint64_t seed = 100;
  for (const Case& c : kCases)
    for (const Tol& tol : tols) {
      INFO("B " << c.B << " Hq " << c.Hq << " Hkv " << c.Hkv << " T " << c.T << " S " << c.S << " D " << c.D << " Dv "
                << c.Dv << " causal " << c.causal << " dtype " << dtype_name(tol.dt));
      const Inputs in = make_inputs(c, tol.dt, seed);
      seed += 4;
      const Result got = run_kernels(in.q, in.k, in.v, in.gout, c.causal);
      const Result ref = run_reference(in.q, in.k, in.v, in.gout, c.causal);
      REQUIRE_CLOSE(got.out, ref.out, tol.out, tol.out);
      REQUIRE_CLOSE(got.lse, ref.lse, tol.out, tol.out);  // -inf rows must match exactly
      REQUIRE_CLOSE(got.gq, ref.gq, tol.grad, tol.grad);
      REQUIRE_CLOSE(got.gk, ref.gk, tol.grad, tol.grad);
      REQUIRE_CLOSE(got.gv, ref.gv, tol.grad, tol.grad);
    }
}

TEST_CASE("blocked attention kernels give the same bits with 1 and 2 threads", "[cpu]") {
#ifdef _OPENMP
  const int prev = omp_get_max_threads();
  for (const Case& c : {kCases[0], kCases[2]})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      INFO("T " << c.T << " S " << c.S << " dtype " << dtype_name(dt));
      const Inputs in = make_inputs(c, dt, 7);
      std::vector<std::vector<std::vector<double>>> runs;
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        const Result r = run_kernels(in.q, in.k, in.v, in.gout, c.causal);
        runs.push_back({r.out.to_vector<double>(), r.lse.to_vector<double>(), r.gq.to_vector<double>(),
                        r.gk.to_vector<double>(), r.gv.to_vector<double>()});
      }
      omp_set_num_threads(prev);
      for (size_t i = 0; i < runs[0].size(); ++i) {
        INFO("output " << i << " (out, lse, gq, gk, gv)");
        REQUIRE(runs[0][i] == runs[1][i]);
      }
    }
  omp_set_num_threads(prev);
#endif
}
