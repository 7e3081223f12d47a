// Pipeline plans without communication (docs/pipeline.md): the stage lines parse and print back,
// resolve against llama-tiny's units (even split and regex stages, parameter counts), the bad
// inputs of issue 15 fail naming the plan line, the schedules have the textbook order, the
// pruned model holds only its stage's parameters, and the stock pipeline plans lower and run a
// meta forward per stage.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "models/config.h"
#include "models/llama.h"
#include "plan/check.h"
#include "plan/lower.h"
#include "plan/pipeline.h"
#include "plan/plan.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "testing.h"

using namespace mt;
using mt::testing::error_of;
using mt::testing::plans_dir;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<CausalLM> meta_model(const std::string& config = "llama-tiny") {
  InitDeviceGuard meta(Device::meta());
  return build_causal_lm(builtin_config(config));
}

PipelineLayout layout_of(const std::string& text, int64_t world) {
  Plan p = parse_plan(text, "p.plan");
  auto m = meta_model();
  return resolve_pipeline(p, p.resolve_mesh(world), pipeline_units_of(*m, m->pipeline_units()));
}

const std::vector<std::string> kPipelineStock = {"llama_pp", "llama_pp_dp", "llama_pp_tp", "llama_pp_dp_tp",
                                                 "llama_pp_interleaved"};

}  // namespace

TEST_CASE("pipeline: stage lines parse, print back and build the same plan", "[cpu]") {
  Plan p = parse_plan("mesh pp=2 dp=*\nstage model\\.embed_tokens|model\\.layers\\.[01] pp=0\n"
                      "stage model\\.layers\\.[23]|model\\.norm|lm_head pp=1\nschedule pp=gpipe\n"
                      "place model <in>:0 dp=S(0)\n",
                      "p.plan");
  REQUIRE(p.is_pipeline());
  REQUIRE(p.pipeline_dim() == "pp");
  REQUIRE(p.schedule_kind() == PipelineScheduleKind::kGPipe);
  REQUIRE(p.stage_entries().size() == 2);
  REQUIRE(parse_plan(p.str(), "again.plan").str() == p.str());
  Plan b;
  b.mesh({{"pp", 2}, {"dp", -1}})
      .stage(R"(model\.embed_tokens|model\.layers\.[01])", "pp=0")
      .stage(R"(model\.layers\.[23]|model\.norm|lm_head)", "pp=1")
      .schedule("pp=gpipe")
      .place("model", "<in>:0", "dp=S(0)");
  REQUIRE(b.str() == p.str());
  // The stage plan: no pipeline dim, the entries kept; `mesh pp=*` alone leaves `stage=1`.
  Plan s = p.without_pipeline();
  REQUIRE_FALSE(s.is_pipeline());
  REQUIRE(s.str() == "mesh dp=*\nplace model <in>:0 dp=S(0)\n");
  REQUIRE(parse_plan("mesh pp=*\nstages pp=even\n", "q.plan").without_pipeline().str() == "mesh stage=1\n");
  REQUIRE(parse_plan("mesh pp=*\nstages pp=even\n", "q.plan").schedule_kind() == PipelineScheduleKind::kOneFOneB);
}

TEST_CASE("pipeline: even split and regex stages over llama-tiny", "[cpu]") {
  // llama-tiny: embed 256x128, 4 layers, norm, lm_head 256x128.
  PipelineLayout two = layout_of("mesh pp=*\nstages pp=even\n", 2);
  REQUIRE(two.size() == 2);
  CHECK(two.stages[0].first == 0);
  CHECK(two.stages[0].last == 3);  // embed, layers 0-1
  CHECK(two.stages[1].first == 3);
  CHECK(two.stages[1].last == 7);  // layers 2-3, norm, lm_head
  auto m = meta_model();
  int64_t total = 0;
  for (const auto& [n, t] : m->named_parameters()) total += t.shape().numel();
  CHECK(two.stages[0].params + two.stages[1].params == total);
  CHECK(two.stages[0].params == 256 * 128 + two.units[1].params * 2);
  PipelineLayout four = layout_of("mesh pp=*\nstages pp=even\n", 4);
  for (int64_t s = 0; s < 4; ++s) {
    int layers = 0;
    for (int64_t i = four.stages[s].first; i < four.stages[s].last; ++i) layers += four.units[i].is_layer;
    CHECK(layers == 1);
  }
  // Uneven by regex: three layers on stage 0.
  PipelineLayout r = layout_of("mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[0-2] pp=0\n"
                               "stage model\\.layers\\.3|model\\.norm|lm_head pp=1\n", 2);
  CHECK(r.stages[0].last == 4);
  const std::string printed = r.str(4);
  CHECK_THAT(printed, Contains("stage 0: model.embed_tokens .. model.layers.2 (4 units"));
  CHECK_THAT(printed, Contains("stage 1: model.layers.3 .. lm_head (3 units"));
  CHECK_THAT(printed, Contains("(p-1)/(m+p-1) = 0.200"));
  CHECK_THAT(printed, Contains("stage 0: F0 F1 B0 F2 B1 F3 B2 B3"));  // one warm-up forward
}

TEST_CASE("pipeline: bad stage lines name the plan line", "[cpu]") {
  auto m = meta_model();
  auto resolve = [&](const std::string& text, int64_t world) {
    Plan p = parse_plan(text, "bad.plan");
    (void)resolve_pipeline(p, p.resolve_mesh(world), pipeline_units_of(*m, m->pipeline_units()));
  };
  // A unit no line assigns.
  CHECK_THAT(error_of([&] { resolve("mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[01] pp=0\n"
                                    "stage model\\.layers\\.[23]|model\\.norm pp=1\n", 2); }),
             Contains("pipeline unit lm_head is on no stage") && Contains("bad.plan:2:1"));
  // A unit two lines assign.
  CHECK_THAT(error_of([&] { resolve("mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[0-2] pp=0\n"
                                    "stage model\\.layers\\.[23]|model\\.norm|lm_head pp=1\n", 2); }),
             Contains("bad.plan:3:7") && Contains("assigns model.layers.2 to stage 1, but bad.plan:2:1 assigned it"));
  // A regex that matches no unit.
  CHECK_THAT(error_of([&] { resolve("mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[0-3] pp=0\n"
                                    "stage model\\.norm|lm_head|decoder pp=1\nstage nothing pp=1\n", 2); }),
             Contains("bad.plan:4:7") && Contains("matches no pipeline unit"));
  // Units out of forward order.
  CHECK_THAT(error_of([&] { resolve("mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[02] pp=0\n"
                                    "stage model\\.layers\\.[13]|model\\.norm|lm_head pp=1\n", 2); }),
             Contains("bad.plan:2:1") && Contains("model.layers.2 is on stage 0 but the unit before it"));
  // A pp size that does not divide the layer count.
  CHECK_THAT(error_of([&] { resolve("mesh pp=*\nstages pp=even\n", 3); }),
             Contains("bad.plan:2:1") && Contains("4 layers of the model to split evenly over pp=3"));
  // A stage with no unit.
  CHECK_THAT(error_of([&] { resolve("mesh pp=3\nstage model\\.embed_tokens|model\\.layers\\.[01] pp=0\n"
                                    "stage model\\.layers\\.[23]|model\\.norm|lm_head pp=1\n", 3); }),
             Contains("stage 2 of pp=3 gets no unit"));
  // Stages in the wrong order.
  CHECK_THAT(error_of([&] { resolve("mesh pp=3\nstage model\\.embed_tokens|model\\.layers\\.\\d+ pp=0\n"
                                    "stage model\\.norm|lm_head pp=2\n", 3); }),
             Contains("bad.plan:3:1: model.norm is on stage 2 but the unit before it, model.layers.3, on stage 0"));
  // Parse-time errors: the pipeline dim not in the mesh, a stage out of range, an entry naming pp,
  // mixed forms, a bad schedule, missing words.
  CHECK_THAT(error_of([&] { parse_plan("mesh dp=*\nstages pp=even\n", "bad.plan"); }),
             Contains("bad.plan:2:8") && Contains("'pp' names no mesh dim"));
  CHECK_THAT(error_of([&] { parse_plan("mesh pp=2 dp=*\nstage lm_head pp=2\n", "bad.plan"); }),
             Contains("bad.plan:2:15") && Contains("stage 2 is outside mesh dim pp of size 2"));
  CHECK_THAT(error_of([&] { parse_plan("mesh pp=2 dp=*\nstages pp=even\nplace model <in>:0 pp=S(0)\n", "bad.plan"); }),
             Contains("bad.plan:3:20") && Contains("names the pipeline dim 'pp'"));
  CHECK_THAT(error_of([&] { parse_plan("mesh pp=2 dp=*\nplace model <in>:0 pp=S(0)\nstages pp=even\n", "bad.plan"); }),
             Contains("bad.plan:2:20") && Contains("names the pipeline dim 'pp'"));
  // fsdp entries go with stages (each stage's units over a dp dim of the stage mesh), in either
  // order, but not over the pipeline dim itself.
  for (const char* text : {"mesh pp=2 dp=*\nstages pp=even\nfsdp model\\.layers\\.\\d+ .* dp=rows\n",
                           "mesh pp=2 dp=*\nfsdp model\\.layers\\.\\d+ .* dp=rows\nstages pp=even\n"}) {
    const Plan p = parse_plan(text, "ok.plan");
    CHECK(p.is_pipeline());
    const Plan stage = p.without_pipeline();
    REQUIRE(stage.entries().size() == 1);
    CHECK(stage.entries()[0].kind == PlanEntryKind::kFsdp);
  }
  CHECK_THAT(error_of([&] { parse_plan("mesh pp=2 dp=*\nstages pp=even\nfsdp model\\.layers\\.\\d+ .* pp=rows\n", "bad.plan"); }),
             Contains("bad.plan:3:") && Contains("names the pipeline dim 'pp'"));
  CHECK_THAT(error_of([&] { parse_plan("mesh pp=2\nstages pp=even\nstage lm_head pp=1\n", "bad.plan"); }),
             Contains("bad.plan:3:1") && Contains("mixes with 'stages pp=even'"));
  CHECK_THAT(error_of([&] { parse_plan("mesh pp=2\nstages pp=even\nschedule pp=zigzag\n", "bad.plan"); }),
             Contains("bad.plan:3:10") && Contains("unknown schedule 'zigzag'; expected 1f1b, gpipe or interleaved(V)"));
  CHECK_THAT(error_of([&] { parse_plan("mesh pp=2\nstage lm_head\n", "bad.plan"); }),
             Contains("bad.plan:2:1") && Contains("'stage' takes 2 words"));
  CHECK_THAT(error_of([&] { parse_plan("mesh pp=2\nstages pp=odd\n", "bad.plan"); }),
             Contains("bad.plan:2:8") && Contains("expected pp=even"));
}

TEST_CASE("pipeline: GPipe and 1F1B schedules", "[cpu]") {
  auto str = [](PipelineScheduleKind k, int64_t p, int64_t s, int64_t m) {
    std::string out;
    for (const auto& a : pipeline_schedule(k, p, s, m)) out += fmt::format("{}{} ", a.forward ? 'F' : 'B', a.micro);
    return out;
  };
  using K = PipelineScheduleKind;
  CHECK(str(K::kGPipe, 4, 0, 3) == "F0 F1 F2 B0 B1 B2 ");
  CHECK(str(K::kOneFOneB, 4, 0, 6) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  CHECK(str(K::kOneFOneB, 4, 2, 6) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5 ");
  CHECK(str(K::kOneFOneB, 4, 3, 4) == "F0 B0 F1 B1 F2 B2 F3 B3 ");
  // At most p - s micro-batches in flight on stage s under 1F1B (the memory bound).
  for (int64_t s = 0; s < 4; ++s) {
    int64_t live = 0, most = 0;
    for (const auto& a : pipeline_schedule(K::kOneFOneB, 4, s, 8)) most = std::max(most, live += a.forward ? 1 : -1);
    CHECK(most == 4 - s);
  }
  CHECK(std::abs(bubble_fraction_theory(4, 8) - 3.0 / 11.0) < 1e-15);
  CHECK(std::abs(bubble_fraction_theory(4, 8, 2) - 3.0 / 19.0) < 1e-15);
  // The schedule run with ranks sharing compute (the estimate's CPU roofline): without sharing it
  // is the ideal stretch (m + p - 1) / m for GPipe and 1F1B; with sharing c it lies between
  // max(c, ideal) (work conservation, dependencies) and c x ideal (no slot given away).
  for (K k : {K::kGPipe, K::kOneFOneB})
    for (int64_t p : {2, 4})
      for (int64_t m : {4, 8}) {
        INFO("p " << p << " m " << m);
        const double ideal = 1.0 / (1.0 - bubble_fraction_theory(p, m));
        CHECK(std::abs(pipeline_shared_stretch(k, p, m, 1, 1.0) - ideal) < 1e-9);
        for (double c : {1.5, 2.0, 4.0}) {
          const double x = pipeline_shared_stretch(k, p, m, 1, c);
          CHECK(x >= std::max(c, ideal) - 1e-9);
          CHECK(x <= c * ideal + 1e-9);
        }
      }
  // 2 stages on one slot (c = 2): whenever one computes alone it has the whole slot, so the slot
  // never idles: exactly the work, 2 x m.
  CHECK(std::abs(pipeline_shared_stretch(K::kOneFOneB, 2, 4, 1, 2.0) - 2.0) < 1e-9);
  // 4 stages on 2 slots: between 2 and 2 x 7/4, strictly (the warm-up and cool-down leave slots idle).
  const double x44 = pipeline_shared_stretch(K::kOneFOneB, 4, 4, 1, 2.0);
  CHECK(x44 > 2.0 + 1e-3);
  CHECK(x44 < 3.5 - 1e-3);
  // Interleaved (V = 2) runs to the end and beats plain 1F1B's bubble.
  const double xi = pipeline_shared_stretch(K::kInterleaved, 4, 8, 2, 1.0);
  CHECK(xi >= 1.0);
  CHECK(xi < 1.0 / (1.0 - bubble_fraction_theory(4, 8)));
  // Interleaved (Megatron's order): 2 stages x 2 chunks, 4 micro-batches.
  auto istr = [](int64_t p, int64_t s, int64_t m, int64_t v) {
    std::string out;
    for (const auto& a : pipeline_schedule(PipelineScheduleKind::kInterleaved, p, s, m, v))
      out += fmt::format("{}{}.{} ", a.forward ? 'F' : 'B', a.micro, a.chunk);
    return out;
  };
  // GPipe over V chunks per stage (how eval and grad run an interleaved plan): forwards chunk by
  // chunk, backwards in the reverse chunk order, micro-batches in order within a chunk.
  auto gstr = [](int64_t m, int64_t v) {
    std::string out;
    for (const auto& a : pipeline_schedule(PipelineScheduleKind::kGPipe, 2, 1, m, v))
      out += fmt::format("{}{}.{} ", a.forward ? 'F' : 'B', a.micro, a.chunk);
    return out;
  };
  CHECK(gstr(1, 2) == "F0.0 F0.1 B0.1 B0.0 ");
  CHECK(gstr(2, 2) == "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0 ");
  CHECK(gstr(2, 1) == "F0.0 F1.0 B0.0 B1.0 ");
  CHECK(istr(2, 0, 4, 2) == "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0 ");
  CHECK(istr(2, 1, 4, 2) == "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0 ");
  // Every (micro-batch, chunk) once forward and once backward, backwards per chunk in micro order.
  for (int64_t s = 0; s < 4; ++s) {
    auto acts = pipeline_schedule(PipelineScheduleKind::kInterleaved, 4, s, 8, 3);
    REQUIRE(acts.size() == 2 * 8 * 3);
    std::vector<int64_t> next_b(3, 0), fwd(3, 0);
    for (const auto& a : acts) {
      if (a.forward) {
        CHECK(a.micro == fwd[a.chunk]++);
      } else {
        CHECK(a.micro == next_b[a.chunk]++);
        CHECK(a.micro < fwd[a.chunk]);
      }
    }
  }
}

TEST_CASE("pipeline: interleaved chunks", "[cpu]") {
  PipelineLayout l = layout_of("mesh pp=2\nstages pp=even\nschedule pp=interleaved(2)\n", 2);
  REQUIRE(l.virtual_stages == 2);
  REQUIRE(l.chunks.size() == 4);
  CHECK(l.chunk(0, 0).first == 0);  // embed, layer 0
  CHECK(l.chunk(0, 0).last == 2);
  CHECK(l.chunk(1, 0).first == 2);  // layer 1
  CHECK(l.chunk(0, 1).first == 3);  // layer 2
  CHECK(l.chunk(1, 1).last == 7);   // layer 3, norm, lm_head
  CHECK(l.stages[0].params == l.chunk(0, 0).params + l.chunk(0, 1).params);
  CHECK_THAT(l.str(4), Contains("stage 0: model.embed_tokens .. model.layers.0 + model.layers.2"));
  CHECK_THAT(l.str(4), Contains("stage 1: F0.0 F1.0 F0.1 B0.1"));
  auto m = meta_model();
  prune_to_stage(*m, l, 1);
  std::vector<std::string> names;
  for (const auto& [name, t] : m->named_parameters()) names.push_back(name);
  CHECK(names.front() == "model.layers.1.self_attn.q_proj.weight");
  CHECK(std::find(names.begin(), names.end(), "model.layers.3.mlp.up_proj.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "model.layers.2.mlp.up_proj.weight") == names.end());
  // 4 layers do not make 2 x 4 chunks; stage lines do not go with interleaved; V >= 2.
  CHECK_THAT(error_of([&] { (void)layout_of("mesh pp=2\nstages pp=even\nschedule pp=interleaved(4)\n", 2); }),
             Contains("p.plan:3:1: interleaved(4) needs the 4 layers to split evenly into pp=2 x 4 chunks"));
  CHECK_THAT(error_of([&] { (void)layout_of("mesh pp=2\nstage model\\.embed_tokens|model\\.layers\\.[01] pp=0\n"
                                            "stage model\\.layers\\.[23]|model\\.norm|lm_head pp=1\n"
                                            "schedule pp=interleaved(2)\n", 2); }),
             Contains("p.plan:4:1: interleaved(2) splits the layers into 2 x 2 chunks itself"));
  CHECK_THAT(error_of([&] { parse_plan("mesh pp=2\nstages pp=even\nschedule pp=interleaved(1)\n", "p.plan"); }),
             Contains("p.plan:3:10: interleaved(1) needs V >= 2"));
  REQUIRE(parse_plan("mesh pp=2\nstages pp=even\nschedule pp=interleaved(2)\n", "p.plan").str() ==
          "mesh pp=2\nstages pp=even\nschedule pp=interleaved(2)\n");
}

TEST_CASE("pipeline: a pruned stage holds only its units' parameters", "[cpu]") {
  auto m = meta_model();
  PipelineLayout l = layout_of("mesh pp=*\nstages pp=even\n", 2);
  prune_to_stage(*m, l, 1);
  std::vector<std::string> names;
  int64_t n = 0;
  for (const auto& [name, t] : m->named_parameters()) {
    names.push_back(name);
    n += t.shape().numel();
  }
  CHECK(n == l.stages[1].params);
  CHECK(names.front() == "model.layers.2.self_attn.q_proj.weight");
  CHECK(names.back() == "lm_head.weight");
  CHECK_THAT(error_of([&] { (void)(*m->get_module("model.layers.0"))(std::vector<Tensor>{}); }),
             Contains("module 'model.layers.0' lives on pipeline stage 0"));
}

TEST_CASE("pipeline: stock pipeline plans parse, print back, lower and run a meta forward per stage", "[cpu]") {
  for (const auto& name : kPipelineStock) {
    INFO(name);
    Plan p = load_plan(plans_dir() + "/" + name + ".plan");
    REQUIRE(p.is_pipeline());
    REQUIRE(parse_plan(p.str(), "again.plan").str() == p.str());
    const int64_t world = name == "llama_pp_dp_tp" ? 8 : name == "llama_pp_interleaved" ? 2 : 4;
    const PlanMesh mesh = p.resolve_mesh(world);
    auto m = meta_model();
    PipelineLayout l = resolve_pipeline(p, mesh, pipeline_units_of(*m, m->pipeline_units()));
    CHECK(l.size() == (name == "llama_pp" ? 4 : 2));
    REQUIRE_NOTHROW(lower(p, *m, mesh));
    // Each stage's plan on its own pruned model, over the stage mesh.
    Plan sp = p.without_pipeline();
    for (int64_t s = 0; s < l.size(); ++s) {
      INFO("stage " << s);
      auto build = [&]() -> std::shared_ptr<Module> {
        auto sm = meta_model();
        prune_to_stage(*sm, l, s);
        sm->set_pipeline_span(l.stages[s].first, l.stages[s].last);
        return sm;
      };
      std::vector<Tensor> in = {s == 0 ? zeros(Shape{2, 8}, TensorOptions(DType::kI64).with_device(Device::meta()))
                                       : zeros(Shape{2, 8, 128}, TensorOptions(DType::kF32).with_device(Device::meta()))};
      REQUIRE_NOTHROW(check_plan_forward(sp, sp.resolve_mesh(world / l.size()), build, in));
    }
  }
}
