// Token all-to-all expert parallelism (plan/expert_dispatch.h, mesh/exchange.h, docs/moe.md):
// exchange_rows moves rows to the right ranks and their gradients back; one Mixtral MoE block
// under `dispatch ... all_to_all` gives the single-device output and gradients (f64, 1e-12) with
// skewed routing (one expert gets every token, one none), uneven token shards (a rank with no
// tokens at all at np 4) and a capacity factor that drops rows; plan errors name the line. Run as a
// world of one and under mpirun -np 2 and 4.
#include <cmath>
#include <string>
#include <vector>

#include "mesh/dtensor.h"
#include "mesh/exchange.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/moe.h"
#include "plan/expert_dispatch.h"
#include "plan/grad_reducer.h"
#include "plan/grad_sync.h"
#include "plan/parallelize.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  REQUIRE(va.size() == vb.size());
  double d = 0;
  for (size_t i = 0; i < va.size(); ++i) d = std::max(d, std::abs(va[i] - vb[i]));
  return d;
}

// A MoE block of mixtral-tiny's shape in f64 with 4 experts, top-2, as a model root "moe".
struct Holder : Module {
  std::shared_ptr<MixtralSparseMoeBlock> moe;
  explicit Holder(const ModelConfig& c) { moe = register_module("moe", std::make_shared<MixtralSparseMoeBlock>(c, DType::kF64)); }
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return (*moe)(in); }
};

ModelConfig moe_config() {
  ModelConfig c = builtin_config("mixtral-tiny");
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  return c;
}

std::shared_ptr<Holder> build(bool meta) {
  manual_seed(77);
  if (!meta) return std::make_shared<Holder>(moe_config());
  InitDeviceGuard g(Device::meta());
  return std::make_shared<Holder>(moe_config());
}

// Tokens whose router logits favour expert 0 strongly and never pick expert 3: the router weight
// is set so, on both models alike.
void skew_router(Module& m) {
  Tensor w = m.get_parameter("moe.gate.weight");
  Tensor g = w.is_distributed() ? to_local(w) : w;
  NoGradGuard ng;
  std::vector<double> v = g.to_vector<double>();
  const int64_t H = g.size(1);
  for (int64_t h = 0; h < H; ++h) {
    v[static_cast<size_t>(0 * H + h)] += 0.5;   // expert 0: favoured
    v[static_cast<size_t>(3 * H + h)] -= 50.0;  // expert 3: never in the top 2 for positive inputs
  }
  g.copy_(from_vector<double>(v, g.shape()));
}

}  // namespace

TEST_CASE("exchange_rows: rows reach their ranks and gradients come back", "[mpi]") {
  const int64_t P = world().size(), r = world().rank();
  DeviceMesh mesh({P}, {"ep"});
  // Rank r sends (j + 1) rows to rank j, each row [r, j, i] (i = row index within the message).
  std::vector<int64_t> send(static_cast<size_t>(P)), recv(static_cast<size_t>(P));
  std::vector<double> rows;
  for (int64_t j = 0; j < P; ++j) {
    send[static_cast<size_t>(j)] = j + 1;
    recv[static_cast<size_t>(j)] = r + 1;
    for (int64_t i = 0; i <= j; ++i) rows.insert(rows.end(), {double(r), double(j), double(i)});
  }
  Tensor in = from_vector<double>(rows, Shape{static_cast<int64_t>(rows.size() / 3), 3}).requires_grad_();
  Tensor out = exchange_rows(mesh.comm(0), in, send, recv);
  REQUIRE(out.shape() == Shape{P * (r + 1), 3});
  std::vector<double> o = out.to_vector<double>();
  for (int64_t j = 0, row = 0; j < P; ++j)
    for (int64_t i = 0; i <= r; ++i, ++row) {
      REQUIRE(o[static_cast<size_t>(row * 3)] == double(j));      // from rank j
      REQUIRE(o[static_cast<size_t>(row * 3 + 1)] == double(r));  // addressed to this rank
      REQUIRE(o[static_cast<size_t>(row * 3 + 2)] == double(i));
    }
  // d/d in of sum(out * c) with c = the receiving rank + 1: each sent row's gradient is its
  // destination + 1.
  sum(mul(out, static_cast<double>(r + 1))).backward();
  std::vector<double> g = in.grad().to_vector<double>();
  for (int64_t j = 0, row = 0; j < P; ++j)
    for (int64_t i = 0; i <= j; ++i, ++row) REQUIRE(g[static_cast<size_t>(row * 3)] == double(j + 1));
}

TEST_CASE("all_to_all dispatch: one MoE block gives the single-device output and gradients", "[mpi]") {
  const int64_t P = world().size();
  DeviceMesh mesh({P}, {"ep"});
  Plan plan;
  plan.mesh({{"ep", -1}}).dispatch("moe", "ep=all_to_all").place("()", "<in>:0", "ep=S(0)");
  for (auto [B, cf] : {std::pair<int64_t, double>{2 * P, 0.0}, {2 * P + 1, 0.0}, {2 * P + 1, 1.0}}) {
    // Even and uneven token shards; dropless, then a capacity of N * k / E rows per expert, which
    // the skewed router overflows (expert 0 gets every token).
    INFO("B " << B << " on " << P << " ranks, capacity factor " << cf);
    Generator gen(5);
    Tensor x = abs(normal({B, 3, 16}, 0, 1, DType::kF64, &gen));
    auto ref = build(false);
    ref->moe->set_capacity_factor(cf);
    skew_router(*ref);
    Tensor xr = x.clone().requires_grad_();
    Tensor want = (*ref)(std::vector<Tensor>{xr})[0];
    Tensor cot = normal(want.shape(), 0, 1, DType::kF64, &gen);
    sum(mul(want, cot)).backward();

    auto model = build(true);
    Parallelized par = parallelize(*model, plan, mesh);
    GradReducer reducer(*model, mesh);
    model->moe->set_capacity_factor(cf);
    skew_router(*model);
    Tensor xd = distribute_tensor(x, mesh, {Placement::shard(0)}).requires_grad_();
    Tensor got = (*model)(std::vector<Tensor>{xd})[0];
    auto* moe = model->moe.get();
    REQUIRE(moe->dispatcher() != nullptr);
    REQUIRE(moe->tokens_per_expert() == ref->moe->tokens_per_expert());  // whole-group counts
    REQUIRE(moe->tokens_per_expert()[3] == 0);
    REQUIRE(moe->dropped_rows() == ref->moe->dropped_rows());
    REQUIRE((cf > 0) == (moe->dropped_rows() > 0));
    REQUIRE(max_abs_diff(full_tensor(got), want) <= 1e-12);
    sum(mul(got, distribute_tensor(cot, mesh, {Placement::shard(0)}))).backward();
    reducer.finish();
    REQUIRE(max_abs_diff(full_tensor(xd.grad()), xr.grad()) <= 1e-12);
    auto gp = model->named_parameters(), wp = ref->named_parameters();
    for (size_t i = 0; i < gp.size(); ++i) {
      INFO(gp[i].first);
      if (gp[i].first.find("experts.3.") != std::string::npos) {  // no token: no gradient anywhere
        REQUIRE_FALSE(wp[i].second.grad().defined());
        REQUIRE_FALSE(gp[i].second.grad().defined());
        continue;
      }
      // The router: Partial over ep (every rank's tokens), all-reduced by the reducer; a rank
      // without tokens contributed zeros. An expert: complete on its owner, empty elsewhere.
      Tensor g = gp[i].second.grad();
      REQUIRE(g.defined());
      if (to_local(gp[i].second).numel() > 0) REQUIRE(max_abs_diff(to_local(g), wp[i].second.grad()) <= 1e-12);
    }
  }
}

TEST_CASE("all_to_all dispatch: a rank without tokens gives the router a zero gradient", "[mpi]") {
  // `meshtrain grad` reduces gradients without a GradReducer (sync_gradients): every rank must hold
  // the router's Partial gradient, the rank without tokens too (B = 2P + 1 over P ranks: the last
  // holds none at np 4), or the reduction pairs different collectives across ranks.
  const int64_t P = world().size();
  DeviceMesh mesh({P}, {"ep"});
  Plan plan;
  plan.mesh({{"ep", -1}}).dispatch("moe", "ep=all_to_all").place("()", "<in>:0", "ep=S(0)");
  const int64_t B = 2 * P + 1;
  Generator gen(6);
  Tensor x = abs(normal({B, 3, 16}, 0, 1, DType::kF64, &gen));
  auto ref = build(false);
  Tensor xr = x.clone().requires_grad_();
  sum((*ref)(std::vector<Tensor>{xr})[0]).backward();
  auto model = build(true);
  Parallelized par = parallelize(*model, plan, mesh);
  Tensor xd = distribute_tensor(x, mesh, {Placement::shard(0)}).requires_grad_();
  sum((*model)(std::vector<Tensor>{xd})[0]).backward();
  Tensor router = model->moe->named_parameters()[0].second;
  INFO(model->moe->named_parameters()[0].first << " on rank " << world().rank() << " of " << P);
  REQUIRE(router.grad().defined());
  sync_gradients(*model);  // collective: every rank the same reductions
  REQUIRE(max_abs_diff(to_local(router.grad()), ref->moe->named_parameters()[0].second.grad()) <= 1e-12);
}

TEST_CASE("all_to_all dispatch: plan errors name the line", "[mpi]") {
  const int64_t P = world().size();
  DeviceMesh mesh({P}, {"ep"});
  auto model = build(true);
  SECTION("not a MoE layer") {
    Plan p = parse_plan("mesh ep=*\ndispatch moe\\.gate experts ep=all_to_all\n", "x.plan");
    REQUIRE_THROWS_WITH(lower(p, *model, mesh), Contains("x.plan:2:10") && Contains("not one"));
  }
  SECTION("a bad value and a bad tensor") {
    REQUIRE_THROWS_WITH(parse_plan("mesh ep=*\ndispatch moe experts ep=S(0)\n", "x.plan"),
                        Contains("x.plan:2:1") && Contains("DIM=all_to_all"));
    REQUIRE_THROWS_WITH(parse_plan("mesh ep=*\ndispatch moe weight ep=all_to_all\n", "x.plan"),
                        Contains("x.plan:2:14") && Contains("expected 'experts'"));
    REQUIRE_THROWS_WITH(parse_plan("mesh ep=*\nplace moe weight ep=all_to_all\n", "x.plan"),
                        Contains("x.plan:2:18") && Contains("belongs to dispatch entries"));
  }
  if (P >= 2) {
    SECTION("an expert split over the ranks") {
      Plan p = parse_plan("mesh ep=*\ndispatch moe experts ep=all_to_all\nplace moe\\.experts\\.0\\.w1 weight ep=S(0)\n"
                          "place () <in>:0 ep=S(0)\n", "x.plan");
      REQUIRE_THROWS_WITH(parallelize(*model, p, mesh),
                          Contains("x.plan:2:1") && Contains("moe.experts.0.w1.weight") && Contains("split"));
    }
    SECTION("replicated tokens") {
      Plan p = parse_plan("mesh ep=*\ndispatch moe experts ep=all_to_all\n", "x.plan");
      Parallelized par = parallelize(*model, p, mesh);
      Tensor x = distribute_tensor(zeros({2 * P, 3, 16}, DType::kF64), mesh, {Placement::replicate()});
      REQUIRE_THROWS_WITH((*model)(std::vector<Tensor>{x}), Contains("needs the tokens split there") && Contains("'moe'"));
    }
  }
}
