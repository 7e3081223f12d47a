// Ops on DTensors (docs/sharding.md): for each op family and placement list, the full tensor of
// the result equals the single-device result, and so do the gradients of every input; the output
// placements are the documented ones; rejected placements give errors naming the op, the
// placements and the fix; the propagation cache hits. Run as a world of one and under mpirun -np 2
// and 4 (meshes [N] and [2, 2]).
#include <functional>
#include <string>
#include <vector>

#include "mesh/dispatch.h"
#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "mesh_testing.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;
using testing::mesh_1d;
using testing::mesh_2d;

namespace {

struct In {
  Tensor global;
  Placements ps;
  bool grad = true;
};
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Placements P(const char* text) { return parse_placements(text); }

// Runs `fn` on one device and on DTensors; compares values and input gradients (through a fixed
// random weighting of the output) within `tol`; checks the output placements when given.
void check_op(const DeviceMesh& mesh, const std::vector<In>& ins, const Fn& fn, const char* want = nullptr,
              double tol = 1e-10) {
  std::vector<Tensor> ref_in, d_in;
  for (const In& in : ins) {
    Tensor g = in.global.detach().clone();
    const bool grad = in.grad && is_floating(g.dtype());
    if (grad) g.requires_grad_();
    ref_in.push_back(g);
    Tensor d = distribute_tensor(in.global, mesh, in.ps);
    if (grad) d.requires_grad_();
    d_in.push_back(d);
  }
  Tensor ref = fn(ref_in);
  Tensor out = fn(d_in);
  INFO("mesh " << mesh.str() << ", output " << out.desc());
  REQUIRE(out.is_distributed());
  if (want) REQUIRE(placements_str(dtensor_spec(out, "test").placements()) == placements_str(P(want)));
  Tensor full = full_tensor(out);
  REQUIRE(full.shape() == ref.shape());
  if (!is_floating(ref.dtype())) {
    REQUIRE(full.to_vector<int64_t>() == ref.to_vector<int64_t>());
    return;
  }
  REQUIRE_CLOSE(full, ref, tol, tol);
  if (!ref.requires_grad()) return;
  Tensor w = testing::rand(ref.shape(), ref.dtype(), 77);
  sum(mul(ref, w)).backward();
  sum(mul(full, w)).backward();
  for (size_t i = 0; i < ins.size(); ++i) {
    if (!ref_in[i].requires_grad()) continue;
    INFO("gradient of input " << i);
    Tensor g = d_in[i].grad();
    REQUIRE(g.defined());
    REQUIRE(g.is_distributed());
    REQUIRE_CLOSE(full_tensor(g), ref_in[i].grad(), tol, tol);
  }
}

void check_error(const DeviceMesh& mesh, const std::vector<In>& ins, const Fn& fn, const std::string& text) {
  std::vector<Tensor> d_in;
  for (const In& in : ins) d_in.push_back(distribute_tensor(in.global, mesh, in.ps));
  REQUIRE_THROWS_WITH(fn(d_in), Contains(text));
}

Tensor r(const Shape& s, uint64_t seed) { return testing::rand(s, DType::kF64, seed); }

}  // namespace

TEST_CASE("dtensor ops: pointwise with broadcasting and Partial linearity", "[mpi]") {
  const DeviceMesh& m = mesh_1d();
  Tensor a = r({6, 5}, 1), b = r({6, 5}, 2), bias = r({5}, 3), col = r({6, 1}, 4);
  auto add2 = [](const auto& x) { return add(x[0], x[1]); };
  auto mul2 = [](const auto& x) { return mul(x[0], x[1]); };
  check_op(m, {{a, P("S(0)")}, {b, P("S(0)")}}, add2, "S(0)");
  check_op(m, {{a, P("S(1)")}, {bias, P("S(0)")}}, add2, "S(1)");
  check_op(m, {{a, P("S(0)")}, {bias, P("R")}}, add2, "S(0)");
  check_op(m, {{a, P("S(1)")}, {col, P("R")}}, mul2, "S(1)");
  check_op(m, {{a, P("P")}, {b, P("P")}}, add2, "P(sum)");
  check_op(m, {{a, P("P")}, {b, P("R")}}, add2, "P(sum)");  // R added once
  check_op(m, {{a, P("R")}, {b, P("P")}}, [](const auto& x) { return sub(x[0], x[1]); }, "P(sum)");
  check_op(m, {{a, P("P")}, {b, P("R")}}, mul2, "P(sum)");
  check_op(m, {{a, P("P")}, {b, P("R")}}, [](const auto& x) { return div(x[0], add(x[1], 3.0)); }, "P(sum)");
  check_op(m, {{a, P("P")}}, [](const auto& x) { return sub(mul(x[0], 2.0), 1.5); }, "P(sum)");
  check_op(m, {{a, P("P")}}, [](const auto& x) { return rsub(1.0, neg(x[0])); }, "P(sum)");
  check_op(m, {{a, P("S(0)")}}, [](const auto& x) { return gelu(exp(x[0])); }, "S(0)");
  check_op(m, {{a, P("S(1)")}, {b, P("S(1)")}}, [](const auto& x) { return where(gt(x[0], x[1]), x[0], x[1]); },
           "S(1)");
  check_op(m, {{a, P("S(0)")}, {b, P("S(0)")}}, [](const auto& x) { return lt(x[0], x[1]); }, "S(0)");
  check_op(m, {{a, P("R")}}, [](const auto& x) { return silu(x[0]).to(DType::kF32).to(DType::kF64); }, "R", 1e-6);
  check_error(m, {{a, P("P")}}, [](const auto& x) { return exp(x[0]); }, "exp: no sharding without communication");
  check_error(m, {{a, P("P")}}, [](const auto& x) { return exp(x[0]); }, "redistribute it to R");
  check_error(m, {{a, P("P")}, {b, P("P")}}, mul2, "both Partial");
  if (world().size() > 1)
    check_error(m, {{a, P("S(0)")}, {b, P("R")}}, add2, "redistribute it to S(0) too");
}

TEST_CASE("dtensor ops: reductions", "[mpi]") {
  const DeviceMesh& m = mesh_1d();
  Tensor a = r({7, 4, 3}, 5);
  check_op(m, {{a, P("S(0)")}}, [](const auto& x) { return sum(x[0], {0}); }, "P(sum)");
  check_op(m, {{a, P("S(0)")}}, [](const auto& x) { return sum(x[0], {2}, KeepDim::kYes); }, "S(0)");
  check_op(m, {{a, P("S(1)")}}, [](const auto& x) { return sum(x[0], {0}); }, "S(0)");
  check_op(m, {{a, P("S(1)")}}, [](const auto& x) { return mean(x[0], {1, 2}); }, "P(sum)");
  check_op(m, {{a, P("S(2)")}}, [](const auto& x) { return sum(x[0]); }, "P(sum)");
  check_op(m, {{a, P("P")}}, [](const auto& x) { return sum(x[0], {1}); }, "P(sum)");
  check_op(m, {{a, P("S(0)")}}, [](const auto& x) { return max(x[0], 0); });  // with grad: P(sum) composite
  check_op(m, {{a, P("S(1)")}}, [](const auto& x) { return min(x[0]); });
  check_op(m, {{a, P("S(0)"), false}}, [](const auto& x) { return max(x[0], 0); }, "P(max)");
  check_op(m, {{a, P("S(0)")}}, [](const auto& x) { return argmax(x[0], 1); }, "S(0)");
  // Rows fewer than the ranks leave some shards empty (3 rows over 4 ranks): their term of max/min
  // is the identity (one rank threw while the others waited in the collective until 2026-11-28).
  Tensor few = r({3, 2}, 6);
  check_op(m, {{few, P("S(0)")}}, [](const auto& x) { return max(x[0], 0); });
  check_op(m, {{few, P("S(0)"), false}}, [](const auto& x) { return min(x[0], 0); }, "P(min)");
  check_op(m, {{few, P("S(0)"), false}}, [](const auto& x) { return max(x[0]); }, "P(max)");
  // Integers: the dtype's lowest / highest value.
  for (DType dt : {DType::kI64, DType::kI32, DType::kU8}) {
    Tensor ints = add(mul(few, 50.0), 100.0).to(dt);  // (in [50, 150): fits u8)
    check_op(m, {{ints, P("S(0)"), false}}, [](const auto& x) { return max(x[0], 0); }, "P(max)");
    check_op(m, {{ints, P("S(0)"), false}}, [](const auto& x) { return min(x[0]); }, "P(min)");
  }
  if (world().size() > 1)
    check_error(m, {{a, P("S(0)")}}, [](const auto& x) { return var(x[0], {0}); }, "var' over dim 0, which is split");
}

TEST_CASE("dtensor ops: matmul, bmm and linear (einsum rule)", "[mpi]") {
  const DeviceMesh& m = mesh_1d();
  Tensor x = r({6, 8}, 6), w = r({8, 5}, 7), lw = r({5, 8}, 8), lb = r({5}, 9), x3 = r({4, 6, 8}, 10);
  auto mm = [](const auto& t) { return matmul(t[0], t[1]); };
  check_op(m, {{x, P("S(0)")}, {w, P("R")}}, mm, "S(0)");
  check_op(m, {{x, P("R")}, {w, P("S(1)")}}, mm, "S(1)");
  check_op(m, {{x, P("S(1)")}, {w, P("S(0)")}}, mm, "P(sum)");
  check_op(m, {{x, P("P")}, {w, P("R")}}, mm, "P(sum)");
  check_op(m, {{x3, P("S(0)")}, {w, P("R")}}, mm, "S(0)");
  check_op(m, {{x3, P("S(0)")}, {r({4, 8, 3}, 11), P("S(0)")}}, [](const auto& t) { return bmm(t[0], t[1]); },
           "S(0)");
  // Megatron column- and row-parallel linear layers.
  check_op(m, {{x3, P("R")}, {lw, P("S(0)")}, {lb, P("S(0)")}}, [](const auto& t) { return linear(t[0], t[1], t[2]); },
           "S(2)");
  check_op(m, {{x3, P("S(2)")}, {lw, P("S(1)")}, {lb, P("R")}}, [](const auto& t) { return linear(t[0], t[1], t[2]); },
           "P(sum)");
  check_op(m, {{x3, P("S(1)")}, {lw, P("R")}}, [](const auto& t) { return linear(t[0], t[1]); }, "S(1)");
  if (world().size() > 1) {
    check_error(m, {{x, P("S(1)")}, {w, P("R")}}, mm, "contraction dim is split in a");
    check_error(m, {{x3, P("S(2)")}, {lw, P("S(1)")}, {lb, P("S(0)")}},
                [](const auto& t) { return linear(t[0], t[1], t[2]); }, "bias must be Replicate");
  }
}

TEST_CASE("dtensor ops: views, flatten of split dims, slices", "[mpi]") {
  const DeviceMesh& m = mesh_1d();
  const int64_t k = world().size();
  Tensor q = r({2, 3, 4 * k * 2}, 12);  // [B, T, H*D] with H = 2k heads of D = 4
  check_op(m, {{q, P("S(2)")}}, [](const auto& t) { return t[0].view({2, 3, -1, 4}); }, "S(2)");
  check_op(m, {{q, P("S(2)")}}, [](const auto& t) { return t[0].view({2, 3, -1, 4}).transpose(1, 2); }, "S(1)");
  check_op(m, {{q, P("S(2)")}},
           [](const auto& t) { return t[0].view({2, 3, -1, 4}).transpose(1, 2).transpose(1, 2).reshape({2, 3, -1}); },
           "S(2)");
  Tensor s = r({3, 2 * k, 5}, 13);
  check_op(m, {{s, P("S(1)")}}, [](const auto& t) { return t[0].reshape({-1, 5}); }, fmt::format("IS(0,3)").c_str());
  check_op(m, {{s, P("S(1)")}}, [](const auto& t) { return t[0].reshape({-1, 5}).view({3, -1, 5}); }, "S(1)");
  check_op(m, {{s, P("S(0)")}}, [](const auto& t) { return t[0].flatten(1); }, "S(0)");
  check_op(m, {{s, P("S(1)")}}, [](const auto& t) { return t[0].unsqueeze(0).squeeze(0).permute({2, 0, 1}); }, "S(2)");
  check_op(m, {{s, P("S(1)")}}, [](const auto& t) { return t[0].narrow(2, 1, 3).select(0, 2); }, "S(0)");
  check_op(m, {{r({3, 1}, 14), P("S(0)")}}, [](const auto& t) { return t[0].expand({2, 3, 4}); }, "S(1)");
  check_op(m, {{s, P("P")}}, [](const auto& t) { return t[0].slice(1, 1, 3).contiguous(); }, "P(sum)");
  check_op(m, {{s, P("S(2)")}}, [](const auto& t) { return cat(split(t[0], 1, 0), 0); }, "S(2)");
  if (k > 1) check_error(m, {{s, P("S(1)")}}, [](const auto& t) { return t[0].narrow(1, 0, 1); }, "redistribute it to R");
}

TEST_CASE("dtensor ops: norms, softmax, rope, attention", "[mpi]") {
  const DeviceMesh& m = mesh_1d();
  const int64_t k = world().size();
  Tensor x = r({2, 3 * k, 8}, 15), w = r({8}, 16), b = r({8}, 17);
  check_op(m, {{x, P("S(1)")}, {w, P("R")}}, [](const auto& t) { return rms_norm(t[0], t[1]); }, "S(1)");
  check_op(m, {{x, P("S(0)")}, {w, P("R")}, {b, P("R")}}, [](const auto& t) { return layer_norm(t[0], t[1], t[2]); },
           "S(0)");
  check_op(m, {{x, P("S(1)")}}, [](const auto& t) { return log_softmax(t[0], -1); }, "S(1)");
  check_op(m, {{x, P("S(2)")}}, [](const auto& t) { return softmax(t[0], 1); }, "S(2)");
  Tensor h = r({2, 5, 2 * k, 8}, 18);  // [B, T, H, D]
  auto [c0, s0] = rope_tables(5, 8, 10000.0, DType::kF64);
  Tensor c = c0.unsqueeze(1), sn = s0.unsqueeze(1);  // [T, 1, D/2] against [B, T, H, D]
  check_op(m, {{h, P("S(2)")}, {c, P("R"), false}, {sn, P("R"), false}},
           [](const auto& t) { return rotary_embedding(t[0], t[1], t[2]); }, "S(2)");
  check_op(m, {{h, P("S(1)")}, {c, P("S(0)"), false}, {sn, P("S(0)"), false}},
           [](const auto& t) { return rotary_embedding(t[0], t[1], t[2]); }, "S(1)");
  Tensor q = r({2, 4 * k, 5, 8}, 19), kk = r({2, 2 * k, 5, 8}, 20), v = r({2, 2 * k, 5, 8}, 21);
  auto attn = [](const auto& t) { return scaled_dot_product_attention(t[0], t[1], t[2]); };
  check_op(m, {{q, P("S(1)")}, {kk, P("S(1)")}, {v, P("S(1)")}}, attn, "S(1)");
  check_op(m, {{q, P("S(0)")}, {kk, P("S(0)")}, {v, P("S(0)")}}, attn, "S(0)");
  if (k > 1) {
    check_error(m, {{x, P("S(2)")}, {w, P("R")}}, [](const auto& t) { return rms_norm(t[0], t[1]); },
                "normalizes the last dim, which is split");
    check_error(m, {{x, P("S(2)")}}, [](const auto& t) { return softmax(t[0], -1); }, "softmax' works along dim 2");
  }
}

TEST_CASE("dtensor ops: embedding and cross-entropy, vocabulary-parallel", "[mpi]") {
  const DeviceMesh& m = mesh_1d();
  const int64_t k = world().size();
  const int64_t V = 5 * k + 1;  // uneven vocabulary shards
  Tensor table = r({V, 6}, 22);
  Tensor ids = randint(0, V, {2, 3 * k}, DType::kI64);
  check_op(m, {{table, P("S(0)")}, {ids, P("R")}}, [](const auto& t) { return embedding(t[0], t[1]); }, "P(sum)");
  check_op(m, {{table, P("R")}, {ids, P("S(1)")}}, [](const auto& t) { return embedding(t[0], t[1]); }, "S(1)");
  check_op(m, {{table, P("S(1)")}, {ids, P("R")}}, [](const auto& t) { return embedding(t[0], t[1]); }, "S(2)");
  // A vocabulary smaller than the split leaves the last rank no rows; the Partial output is then
  // reduce-scattered (sequence parallelism after the embedding), and that rank must still run the
  // backward's all-gather (it dropped out of the graph and corrupted the other ranks' collectives
  // until 2026-12-07).
  const int64_t small = std::max<int64_t>(1, k - 1);
  check_op(m, {{r({small, 6}, 38), P("S(0)")}, {randint(0, small, {2, 3 * k}, DType::kI64), P("R")}},
           [](const auto& t) {
             Tensor e = embedding(t[0], t[1]);
             return e.is_distributed() ? redistribute(e, P("S(1)")) : e;
           },
           "S(1)");
  Tensor logits = r({4 * k, V}, 23);
  Tensor target = randint(0, V, {4 * k}, DType::kI64);
  target = where(eq(target, 0.0), full({4 * k}, -100.0, DType::kI64), target);  // some ignored
  auto ce = [](Reduction red) {
    return [red](const std::vector<Tensor>& t) { return cross_entropy(t[0], t[1], -100, red); };
  };
  check_op(m, {{logits, P("S(0)")}, {target, P("S(0)")}}, ce(Reduction::kNone), "S(0)");
  check_op(m, {{logits, P("S(0)")}, {target, P("S(0)")}}, ce(Reduction::kMean), "R");
  check_op(m, {{logits, P("S(1)")}, {target, P("R")}}, ce(Reduction::kMean), "R");
  check_op(m, {{logits, P("S(1)")}, {target, P("R")}}, ce(Reduction::kSum), "R");
  check_op(m, {{logits, P("S(1)")}, {target, P("R")}}, ce(Reduction::kNone), "R");
  // Logits of a vocabulary smaller than the split (an empty shard on the last rank).
  check_op(m, {{r({4 * k, small}, 39), P("S(1)")}, {randint(0, small, {4 * k}, DType::kI64), P("R")}},
           ce(Reduction::kMean), "R");
}

TEST_CASE("dtensor ops: on a 2-D mesh", "[mpi]") {
  if (world().size() != 4) return;
  const DeviceMesh& m = mesh_2d();
  Tensor x = r({4, 6, 8}, 24), w = r({10, 8}, 25), bias = r({10}, 26);
  check_op(m, {{x, P("S(0), R")}, {w, P("R, S(0)")}, {bias, P("R, S(0)")}},
           [](const auto& t) { return gelu(linear(t[0], t[1], t[2])); }, "S(0), S(2)");
  check_op(m, {{x, P("S(0), S(2)")}, {r({10, 8}, 27), P("R, S(1)")}},
           [](const auto& t) { return sum(linear(t[0], t[1]), {0}); }, "P(sum), P(sum)");
  // A vocabulary-split table beside ids split over the other mesh dim (dp x tp): the table's
  // gradient is a sum over the dp ranks' ids (labelled Replicate there, so never summed, until
  // 2026-12-07: a reviewer's parity run, 0.72 relative error on the embedding's gradient).
  auto emb = [](const auto& t) { return embedding(t[0], t[1]); };
  check_op(m, {{r({9, 6}, 41), P("R, S(0)")}, {randint(0, 9, {4, 5}, DType::kI64), P("S(0), R")}}, emb, "S(0), P(sum)");
  check_op(m, {{r({9, 6}, 42), P("R, S(0)")}, {randint(0, 9, {4, 5}, DType::kI64), P("S(1), R")}}, emb, "S(1), P(sum)");
  Tensor y = r({4, 8, 6}, 29);
  check_op(m, {{y, P("S(1), S(1)")}}, [](const auto& t) { return mul(t[0], 3.0).reshape({4, -1}); }, "S(1), S(1)");
  check_error(m, {{x, P("S(1), S(1)")}}, [](const auto& t) { return t[0].reshape({4, -1}); },
              "S(1) of size 6 over 4 ranks is not a Shard of the view");
  // Flattening the batch with the sequence under [S(0), S(1)] (dp x cp): cp sees B / dp runs of T
  // (the global B gave IS(0, B) and permuted values with no error until 2026-11-28).
  check_op(m, {{r({2, 4, 3}, 30), P("S(0), S(1)")}}, [](const auto& t) { return t[0].view({8, 3}); }, "S(0), S(0)");
  check_op(m, {{r({4, 4, 3}, 31), P("S(0), S(1)")}}, [](const auto& t) { return t[0].view({16, 3}); },
           "S(0), IS(0,2)");
  check_op(m, {{r({4, 6}, 32), P("S(0), S(1)")}}, [](const auto& t) { return t[0].flatten(); }, "S(0), IS(0,2)");
  check_op(m, {{r({4, 6}, 33), P("S(1), S(0)")}}, [](const auto& t) { return t[0].flatten(); }, "IS(0,4), S(0)");
  check_error(m, {{r({3, 4}, 34), P("S(0), S(1)")}}, [](const auto& t) { return t[0].flatten(); },
              "mesh dim 'a' splits dim 0 of the merged dims");
  // A spec that fits some ranks' shards only is refused on every rank (the ranks that accepted it
  // waited in the next collective until its timeout): [7, 5] split [S(1), IS(1,2)] leaves 3 and 2.
  REQUIRE_THROWS_WITH(distribute_tensor(r({7, 5}, 37), m, P("S(1), IS(1,2)")), Contains("not divisible by 2 groups"));
  // A replicated input of an op whose output is Partial(avg): each rank's gradient term is the whole
  // gradient, so the terms average (they were summed: twice the gradient on this mesh).
  check_op(m, {{r({3}, 35), P("P(avg), R")}, {r({3}, 36), P("R, R")}},
           [](const auto& t) { return mul(t[0], t[1]); }, "P(avg), R");
  Tensor logits = r({8, 9}, 28);
  Tensor target = randint(0, 9, {8}, DType::kI64);
  check_op(m, {{logits, P("S(0), S(1)")}, {target, P("S(0), R")}},
           [](const auto& t) { return cross_entropy(t[0], t[1]); }, "R, R");
}

TEST_CASE("dtensor ops: random numbers equal the single-device tensor", "[mpi]") {
  const DeviceMesh& m = mesh_1d();
  for (const char* ps : {"R", "S(0)", "S(1)", "IS(1,3)"}) {
    Generator g1(5), g2(5);
    Tensor ref = empty({5, 6}, DType::kF32);
    uniform_(ref, -1, 1, &g1);
    Tensor d = distribute_tensor(zeros({5, 6}, DType::kF32), m, P(ps));
    uniform_(d, -1, 1, &g2);
    REQUIRE(g1.offset() == g2.offset());
    REQUIRE(full_tensor(d).to_vector<float>() == ref.to_vector<float>());
    // dropout masks too
    Tensor x = testing::rand({5, 6}, DType::kF32, 3);
    Tensor a = dropout(x, 0.3, &g1);
    Tensor b = dropout(distribute_tensor(x, m, P(ps)), 0.3, &g2);
    REQUIRE(full_tensor(b).to_vector<float>() == a.to_vector<float>());
  }
  if (world().size() == 4) {  // 2-D mesh, uneven and interleaved
    for (const char* ps : {"S(0), S(1)", "S(1), S(1)", "R, IS(1,3)", "S(0), R", "IS(1,2), S(0)"}) {
      INFO(ps);
      Generator g1(6), g2(6);
      Tensor ref = empty({5, 6}, DType::kF32);
      normal_(ref, 0, 1, &g1);
      Tensor d = distribute_tensor(zeros({5, 6}, DType::kF32), mesh_2d(), P(ps));
      normal_(d, 0, 1, &g2);
      REQUIRE(g1.offset() == g2.offset());
      REQUIRE(full_tensor(d).to_vector<float>() == ref.to_vector<float>());
    }
  }
  Tensor p = distribute_tensor(zeros({4}), m, P("P"));
  REQUIRE_THROWS_WITH(uniform_(p, 0, 1), Contains("Partial"));
}

TEST_CASE("dtensor ops: rules refuse on every rank what only some ranks' shards could not do", "[mpi]") {
  // Each of these was accepted by its rule, then failed on the ranks holding an empty shard only,
  // and the others waited in the next collective until the timeout (a reviewer, 2026-12-07).
  const DeviceMesh& m = mesh_1d();
  if (world().size() > 1) {
    // A split size-1 dim broadcast by expand.
    check_error(m, {{r({1, 3}, 50), P("S(0)")}}, [](const auto& t) { return t[0].expand({4, 3}); },
                "splits dim 0 of size 1, which broadcasts to 4");
    // bmm does not broadcast its batch: a split batch of 1 against a Replicate operand.
    check_error(m, {{r({1, 2, 3}, 51), P("S(0)")}, {r({1, 3, 2}, 52), P("R")}},
                [](const auto& t) { return bmm(t[0], t[1]); }, "split both alike");
    // matmul does broadcast it, and stays right.
    check_op(m, {{r({1, 2, 3}, 51), P("S(0)")}, {r({1, 3, 2}, 52), P("R")}},
             [](const auto& t) { return matmul(t[0], t[1]); }, "S(0)");
  }
  // An uneven column split leaves a rank N = 0: the batched product's backward (one GEMM over the
  // rows) viewed them as [-1, 0] and threw on that rank only.
  const int64_t k = world().size();
  check_op(m, {{r({4, 3, 4}, 53), P("R")}, {r({4, k - 1 > 0 ? k - 1 : 1}, 54), P("S(1)")}},
           [](const auto& t) { return matmul(t[0], t[1]); }, "S(2)");
  // Errors of the API calls name the call.
  REQUIRE_THROWS_WITH(distribute_tensor(r({4, 3}, 55), m, P("S(2)")),
                      Contains("distribute_tensor(global shape [4, 3], [S(2)])"));
  REQUIRE_THROWS_WITH(redistribute(distribute_tensor(r({4, 3}, 55), m, P("R")), P("S(2)")),
                      Contains("redistribute([R] -> [S(2)], global shape [4, 3])"));
  if (world().size() == 2) {
    // Over a mesh dim of size 1: a split size-1 dim in a reshape that drops it (it gave S(1) of a
    // 1-D tensor), and implicit mode replicating the outer split of a nested RaggedShard (it left
    // [R, RS] that does not fit the whole dim).
    DeviceMesh m21({2, 1}, {"a", "b"});
    check_op(m21, {{r({2, 4, 1}, 56), P("S(0), S(2)")}}, [](const auto& t) { return t[0].reshape({8}); }, "S(0), R");
    set_implicit_redistribute(true);
    check_op(m21, {{r({6, 3}, 57), Placements{Placement::shard(0), Placement::ragged_shard(0, {1}, 3)}}},
             [](const auto& t) { return softmax(t[0], 0); }, "R, R");
    set_implicit_redistribute(false);
  }
}

TEST_CASE("dtensor ops: a run whose shapes vary keeps the cache and the specs bounded", "[mpi]") {
  // 5000 distinct shapes, with autograd: every step makes new specs and cache entries. Until
  // 2026-12-07 the cache and the intern table kept them all (about 25 KB a shape in a trainer).
  const DeviceMesh& m = mesh_1d();
  clear_dispatch_cache();
  const size_t live_before = live_spec_count();
  const int64_t flushes_before = dispatch_stats().flushes;
  for (int64_t n = 1; n <= 5000; ++n) {
    Tensor g = r({n, 2}, 40);
    Tensor a = distribute_tensor(g, m, P("S(0)")).requires_grad_();
    Tensor y = sum(mul(a, a));
    y.backward();
    if (n % 997 == 0) {  // freed specs' addresses are reused: the values still the right ones
      INFO("rows " << n);
      REQUIRE_CLOSE(full_tensor(a.grad()), mul(g, 2.0), 1e-12, 1e-12);
      REQUIRE_CLOSE(full_tensor(y), sum(mul(g, g)), 1e-12, 1e-12);
    }
    REQUIRE(dispatch_stats().entries <= 4096);
  }
  REQUIRE(dispatch_stats().flushes > flushes_before);
  REQUIRE(live_spec_count() <= live_before + 3 * 4096);
  clear_dispatch_cache();
  REQUIRE(live_spec_count() == live_before);  // nothing else holds them
}

TEST_CASE("dtensor ops: propagation cache, implicit mode, in-place updates", "[mpi]") {
  const DeviceMesh& m = mesh_1d();
  clear_dispatch_cache();
  Tensor a = distribute_tensor(r({6, 4}, 30), m, P("S(0)"));
  Tensor b = distribute_tensor(r({6, 4}, 31), m, P("S(0)"));
  (void)add(a, b);
  auto s0 = dispatch_stats();
  for (int i = 0; i < 10; ++i) (void)add(a, b);
  auto s1 = dispatch_stats();
  REQUIRE(s1.misses == s0.misses);
  REQUIRE(s1.hits == s0.hits + 10);
  // The cache keys on every integer the outputs' shapes depend on: slices of one DTensor with
  // other bounds, topk with another k, one_hot with another class count (they reused the first
  // call's global shape before 2026-11-28).
  {
    Tensor g = r({6, 8}, 34);
    Tensor x = distribute_tensor(g, m, P("S(0)"));
    for (int64_t end : {2, 5, 8}) {
      INFO("slice end " << end);
      REQUIRE_CLOSE(full_tensor(x.slice(1, 0, end)), g.slice(1, 0, end), 0, 0);
      REQUIRE_CLOSE(full_tensor(x.slice(1, 1, end, 2)), g.slice(1, 1, end, 2), 0, 0);
      REQUIRE_CLOSE(full_tensor(x.narrow(1, 8 - end, end)), g.narrow(1, 8 - end, end), 0, 0);
    }
    for (const Tensor& piece : split(x, 3, 1)) REQUIRE(full_tensor(piece).shape()[1] == (piece.shape()[1]));
    REQUIRE(full_tensor(split(x, 3, 1).back()).shape() == Shape{6, 2});
    for (int64_t k : {1, 3}) REQUIRE_CLOSE(full_tensor(topk(x, k, 1).first), topk(g, k, 1).first, 0, 0);
    Tensor ids = distribute_tensor(from_vector<int64_t>({0, 1, 2, 1, 0, 2}, Shape{6}, DType::kI64), m, P("S(0)"));
    for (int64_t n : {3, 5}) REQUIRE(full_tensor(one_hot(ids, n)).shape() == Shape{6, n});
  }
  // Implicit mode replicates what the rule rejects.
  if (world().size() > 1) {
    Tensor g = r({6, 4}, 32);
    Tensor x = distribute_tensor(g, m, P("S(1)"));
    REQUIRE_THROWS_WITH(softmax(x, -1), Contains("softmax"));
    set_implicit_redistribute(true);
    Tensor y = softmax(x, -1);
    set_implicit_redistribute(false);
    REQUIRE_CLOSE(full_tensor(y), softmax(g, -1), 1e-12, 1e-12);
  }
  // In place: same spec only.
  Tensor c = a.clone();
  {
    NoGradGuard ng;
    c.add_(b, 2.0);
  }
  REQUIRE_CLOSE(full_tensor(c), add(full_tensor(a), mul(full_tensor(b), 2.0)), 1e-12, 1e-12);
  Tensor rr = distribute_tensor(r({6, 4}, 33), m, P("R"));
  if (world().size() > 1) REQUIRE_THROWS_WITH(c.add_(rr), Contains("same placements"));
  // Reading values: only replicated DTensors.
  REQUIRE(rr.to_vector<double>().size() == 24);
  if (world().size() > 1) REQUIRE_THROWS_WITH(a.to_vector<double>(), Contains("mt::full_tensor(t)"));
}
