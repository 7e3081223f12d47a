// Context-parallel (ring) attention under `mpirun -np N` (N = 2, 4; and 1): scaled_dot_product_attention
// on q, k, v DTensors whose sequence dim is split over the world, S(2) and the load-balanced ZS(2),
// causal and not, GQA (4 query heads on 2 kv heads), in ring and all-gather mode, against the plain
// single-device attention of the full tensors: the output and the gradients of q, k and v, in f64
// (tolerance 1e-12 relative to the largest magnitude) and f32 (2e-6). Also a 2x2 mesh at np 4 with
// heads split on one dim and the sequence on the other, a split that leaves a rank no rows, and the ZS
// placement's geometry.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/placement.h"
#include "mesh/ring_attention.h"
#include "mesh/shard_layout.h"
#include "mesh/world.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "mesh_testing.h"
#include "testing.h"

using namespace mt;

namespace {

int P() { return testing::world_size(); }

double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.to(DType::kF64).to_vector<double>()) m = std::max(m, std::abs(x));
  return m;
}

// Relative to the reference's largest magnitude, or to `floor` when that is larger (a gradient
// that is zero in exact arithmetic, such as q's and k's when each query sees one key).
double rel_err(const Tensor& a, const Tensor& ref, double floor = 1e-30) {
  REQUIRE(a.shape() == ref.shape());
  std::vector<double> x = a.to(DType::kF64).to_vector<double>(), y = ref.to(DType::kF64).to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m / std::max(max_abs(ref), floor);
}

struct Case {
  DeviceMesh* mesh;
  Placements pl;  // of q, k, v [B, H, T, D]
  bool causal;
  CpAttentionMode mode;
  DType dtype;
  int64_t T = 0;  // sequence length; 0: 8 rows per rank
};

void run_case(const Case& c) {
  const int64_t B = 2, Hq = 4, Hkv = 2, T = c.T > 0 ? c.T : 8 * P(), D = 8;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Generator gen(1234);
  TensorOptions o = c.dtype;
  Tensor q = normal(Shape{B, Hq, T, D}, 0, 1, o, &gen), k = normal(Shape{B, Hkv, T, D}, 0, 1, o, &gen),
         v = normal(Shape{B, Hkv, T, D}, 0, 1, o, &gen), w = normal(Shape{B, Hq, T, D}, 0, 1, o, &gen);
  const Causal causal = c.causal ? Causal::kYes : Causal::kNo;
  // Reference: one device.
  Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
  Tensor ro = scaled_dot_product_attention(rq, rk, rv, causal, scale);
  backward({sum(mul(ro, w))}, {});
  // Context parallel.
  set_cp_attention_mode(c.mode);
  cp_attention_stats() = {};
  Tensor dq = distribute_tensor(q, *c.mesh, c.pl).requires_grad_();
  Tensor dk = distribute_tensor(k, *c.mesh, c.pl).requires_grad_();
  Tensor dv = distribute_tensor(v, *c.mesh, c.pl).requires_grad_();
  Tensor out = scaled_dot_product_attention(dq, dk, dv, causal, scale);
  REQUIRE(out.is_distributed());
  Tensor dw = distribute_tensor(w, *c.mesh, c.pl);
  backward({full_tensor(sum(mul(out, dw)))}, {});
  set_cp_attention_mode(CpAttentionMode::kRing);
  const double tol = c.dtype == DType::kF64 ? 1e-12 : 2e-6;
  INFO("placements " << placements_str(c.pl) << " causal " << c.causal << " mode " << static_cast<int>(c.mode)
                     << " dtype " << static_cast<int>(c.dtype));
  CHECK(rel_err(full_tensor(out), ro.detach()) < tol);
  // Short sequences (c.T set) may leave q's and k's gradients exactly zero: measured against v's.
  const double floor = c.T > 0 ? max_abs(rv.grad()) : 1e-30;
  CHECK(rel_err(full_tensor(dq.grad()), rq.grad(), floor) < tol);
  CHECK(rel_err(full_tensor(dk.grad()), rk.grad(), floor) < tol);
  CHECK(rel_err(full_tensor(dv.grad()), rv.grad()) < tol);
  if (P() > 1 && c.T == 0) CHECK(cp_attention_stats().bytes_sent > 0);
}

}  // namespace

TEST_CASE("ZS placement: rank r holds chunks r and 2k-1-r") {
  const Placement z = Placement::zigzag_shard(1);
  CHECK(z.str() == "ZS(1)");
  CHECK(Placement::parse("ZS(1)") == z);
  CHECK(z != Placement::interleaved_shard(1, 2));
  const int64_t k = 3, n = 12;  // 6 chunks of 2
  for (int64_t r = 0; r < k; ++r) {
    LocalLayout L = local_layout(Shape{1, n}, {z}, Shape{k}, Shape{r});
    std::vector<int64_t> rows;  // segments contiguous in both spaces are merged (rank k-1: one)
    for (const DimSegment& s : L.segments[1])
      for (int64_t i = 0; i < s.length; ++i) rows.push_back(s.global_start + i);
    CHECK(rows == std::vector<int64_t>{2 * r, 2 * r + 1, 2 * (2 * k - 1 - r), 2 * (2 * k - 1 - r) + 1});
    std::vector<double> g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = static_cast<double>(i);
    Tensor ls = local_shard(from_vector<double>(g, Shape{1, n}, DType::kF64), {z}, Shape{k}, Shape{r});
    CHECK(ls.to_vector<double>() == std::vector<double>{double(2 * r), double(2 * r + 1), double(2 * (2 * k - 1 - r)),
                                                        double(2 * (2 * k - 1 - r) + 1)});
  }
}

TEST_CASE("ZS placement: redistribute round trip") {
  DeviceMesh& m = testing::mesh_1d();
  std::vector<double> g(4 * 2 * static_cast<size_t>(P()) * 3);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<double>(i);
  Tensor t = from_vector<double>(g, Shape{4, 2 * P(), 3}, DType::kF64);
  Tensor z = distribute_tensor(t, m, {Placement::zigzag_shard(1)});
  CHECK(full_tensor(z).to_vector<double>() == g);
  Tensor s = redistribute(z, {Placement::shard(1)});
  CHECK(full_tensor(s).to_vector<double>() == g);
  CHECK(to_local(redistribute(s, {Placement::zigzag_shard(1)})).to_vector<double>() == to_local(z).to_vector<double>());
}

TEST_CASE("ring attention equals one-device attention (1-D mesh)") {
  for (DType dt : {DType::kF64, DType::kF32})
    for (const Placement& p : {Placement::zigzag_shard(2), Placement::shard(2)})
      for (bool causal : {true, false})
        for (CpAttentionMode mode : {CpAttentionMode::kRing, CpAttentionMode::kGather})
          run_case({&testing::mesh_1d(), {p}, causal, mode, dt});
}

TEST_CASE("ring attention with heads split on another mesh dim (2x2)") {
  if (P() != 4) return;
  for (CpAttentionMode mode : {CpAttentionMode::kRing, CpAttentionMode::kGather}) {
    run_case({&testing::mesh_2d(), {Placement::shard(1), Placement::zigzag_shard(2)}, true, mode, DType::kF64});
    run_case({&testing::mesh_2d(), {Placement::zigzag_shard(2), Placement::shard(0)}, true, mode, DType::kF64});
  }
}

TEST_CASE("ring attention: the causal load balance") {
  if (P() < 2) return;
  // Balanced: every rank computes as many visible scores; contiguous: rank 0 the fewest.
  for (const Placement& p : {Placement::zigzag_shard(2), Placement::shard(2)}) {
    cp_attention_stats() = {};
    Tensor q = zeros(Shape{1, 2, 4 * P(), 4}, DType::kF64);
    Tensor d = distribute_tensor(q, testing::mesh_1d(), {p});
    Tensor out = scaled_dot_product_attention(d, d, d, Causal::kYes, 0.5);
    std::vector<double> mine{static_cast<double>(cp_attention_stats().scores_computed)};
    Tensor all = from_vector<double>(mine, Shape{1}, DType::kF64);
    testing::mesh_1d().comm(0).all_reduce(all, CommReduceOp::kMax);
    Tensor lo = from_vector<double>(mine, Shape{1}, DType::kF64);
    testing::mesh_1d().comm(0).all_reduce(lo, CommReduceOp::kMin);
    if (p.mirrored()) {
      CHECK(all.to_vector<double>() == lo.to_vector<double>());
    } else {
      CHECK(all.to_vector<double>()[0] > lo.to_vector<double>()[0]);
    }
  }
}

TEST_CASE("ring attention with a rank that holds no sequence rows") {
  // S(2) of P - 1 rows over P ranks: the last rank's shard is empty. It must still take part in
  // the backward's exchanges (it used to return before joining them, and the job hung).
  if (P() < 2) return;
  for (CpAttentionMode mode : {CpAttentionMode::kRing, CpAttentionMode::kGather})
    for (bool causal : {true, false})
      run_case({&testing::mesh_1d(), {Placement::shard(2)}, causal, mode, DType::kF64, P() - 1});
}
