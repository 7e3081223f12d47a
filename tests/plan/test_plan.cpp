// Plans without communication: the parser on every stock plan, builder == file, error messages
// (file:line:column, unmatched regexes with nearby paths, mesh/world mismatch, placements that do
// not fit), and golden IR lines for llama-tiny under llama_tp at world 2.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "models/config.h"
#include "models/llama.h"
#include "plan/lower.h"
#include "plan/plan.h"
#include "runtime/error.h"
#include "testing.h"

using namespace mt;

namespace {

std::string plans_dir() {
  const char* d = std::getenv("MT_PLANS_DIR");
  return d ? d : "plans";
}

std::shared_ptr<CausalLM> meta_model(const std::string& config) {
  InitDeviceGuard meta(Device::meta());
  return build_causal_lm(builtin_config(config));
}

const char* config_for(const std::string& plan) {
  return plan.find("mixtral") != std::string::npos ? "mixtral-tiny" : "llama-tiny";
}

const std::vector<std::string> kStock = {"llama_dp", "llama_tp", "llama_tp_sp", "llama_dp_tp", "llama_zero3",
                                         "mixtral_ep_tp"};

std::string lower_str(const Plan& p, const std::string& config, int64_t world) {
  auto m = meta_model(config);
  return lower(p, *m, p.resolve_mesh(world)).str();
}

// The llama_tp stock plan through the builder.
Plan llama_tp_builder() {
  Plan p;
  p.mesh({{"tp", -1}})
      .place(R"(model\.layers\.\d+\.self_attn\.(q|k|v)_proj)", "weight|bias", "tp=S(0)")
      .place(R"(model\.layers\.\d+\.self_attn\.o_proj)", "weight", {{"tp", Placement::shard(1)}})
      .place(R"(model\.layers\.\d+\.mlp\.(gate|up)_proj)", "weight|bias", "tp=S(0)")
      .place(R"(model\.layers\.\d+\.mlp\.down_proj)", "weight", "tp=S(1)")
      .redistribute(R"(model\.layers\.\d+\.(self_attn|mlp))", "<in>:0", "tp=R", "tp=R", "tp=P(sum)", "tp=R")
      .redistribute(R"(model\.layers\.\d+\.(self_attn\.o_proj|mlp\.down_proj))", "<out>:0", "tp=P(sum)", "tp=R")
      .place("model", "<in>:0", "tp=R")
      .factory("model", "rope", "tp=R");
  return p;
}

}  // namespace

TEST_CASE("plan: every stock plan parses, prints back and lowers at world 2", "[cpu]") {
  for (const auto& name : kStock) {
    INFO(name);
    Plan p = load_plan(plans_dir() + "/" + name + ".plan");
    REQUIRE(p.entries().size() >= 1);
    Plan again = parse_plan(p.str(), "again.plan");
    REQUIRE(again.str() == p.str());
    std::string ir = lower_str(p, config_for(name), 2);
    REQUIRE(ir == lower_str(again, config_for(name), 2));
    REQUIRE(ir.find("param_init:") != std::string::npos);
  }
}

TEST_CASE("plan: builder and file give the same plan and the same IR", "[cpu]") {
  Plan file = load_plan(plans_dir() + "/llama_tp.plan");
  Plan built = llama_tp_builder();
  REQUIRE(built.str() == file.str());
  for (int64_t world : {1, 2, 4}) REQUIRE(lower_str(built, "llama-tiny", world) == lower_str(file, "llama-tiny", world));
  // The typed builder and the text builder agree too.
  Plan a, b;
  a.mesh({{"dp", 2}, {"tp", -1}}).init(".*", ".*", "dp=S(0)").run(".*", ".*", "dp=R");
  b.mesh({{"dp", 2}, {"tp", -1}})
      .init(".*", ".*", {{"dp", Placement::shard(0)}})
      .run(".*", ".*", {{"dp", Placement::replicate()}});
  REQUIRE(a.str() == b.str());
}

TEST_CASE("plan: IR of llama-tiny under llama_tp at world 2 (golden lines)", "[cpu]") {
  Plan p = load_plan(plans_dir() + "/llama_tp.plan");
  auto m = meta_model("llama-tiny");
  HookIR ir = lower(p, *m, p.resolve_mesh(2));
  std::vector<std::string> lines;
  for (const auto& r : ir.records) lines.push_back(r.str(ir.mesh));
  // 39 parameters, rope + ids at the model, and per layer f (backward) on attention and MLP inputs
  // and g (forward) on the o/down outputs.
  REQUIRE(lines.size() == 39 + 2 + 4 * 4);
  const std::vector<std::string> head = {
      "model.embed_tokens.param_init:weight:init(R)",
      "model.layers.0.self_attn.q_proj.param_init:weight:init(S(0)@tp)",
      "model.layers.0.self_attn.k_proj.param_init:weight:init(S(0)@tp)",
      "model.layers.0.self_attn.v_proj.param_init:weight:init(S(0)@tp)",
      "model.layers.0.self_attn.o_proj.param_init:weight:init(S(1)@tp)",
      "model.layers.0.mlp.gate_proj.param_init:weight:init(S(0)@tp)",
      "model.layers.0.mlp.up_proj.param_init:weight:init(S(0)@tp)",
      "model.layers.0.mlp.down_proj.param_init:weight:init(S(1)@tp)",
      "model.layers.0.input_layernorm.param_init:weight:init(R)",
      "model.layers.0.post_attention_layernorm.param_init:weight:init(R)",
  };
  for (size_t i = 0; i < head.size(); ++i) REQUIRE(lines[i] == head[i]);
  REQUIRE(lines[37] == "model.norm.param_init:weight:init(R)");
  REQUIRE(lines[38] == "lm_head.param_init:weight:init(R)");
  const std::vector<std::string> run = {
      "model.forward_pre:rope:factory(R)",
      "model.forward_pre:<in>:0:to(R)",
      "model.layers.0.self_attn.backward:<in>:0:grad(P(sum)->R@tp)",
      "model.layers.0.self_attn.o_proj.forward:<out>:0:redist(P(sum)->R@tp)",
      "model.layers.0.mlp.backward:<in>:0:grad(P(sum)->R@tp)",
      "model.layers.0.mlp.down_proj.forward:<out>:0:redist(P(sum)->R@tp)",
      "model.layers.1.self_attn.backward:<in>:0:grad(P(sum)->R@tp)",
  };
  for (size_t i = 0; i < run.size(); ++i) REQUIRE(lines[39 + i] == run[i]);
  REQUIRE(lines.back() == "model.layers.3.mlp.down_proj.forward:<out>:0:redist(P(sum)->R@tp)");
}

TEST_CASE("plan: fusion, duplicates, phases and order", "[cpu]") {
  auto m = meta_model("llama-tiny");
  Plan p;
  p.mesh({{"dp", -1}, {"tp", 2}})
      .place(R"(model\.layers\.0\.self_attn\.q_proj)", "weight", "tp=S(0)")
      .place(R"(model\.layers\.0\.self_attn\.q_proj)", "weight", "tp=S(0)")  // duplicate
      .init(".*", ".*", "dp=S(0)")
      .run(".*", ".*", "dp=R")
      .place(R"(model\.layers\.0\.self_attn\.o_proj)", "<out>:0", "dp=S(0)")
      .place(R"(model\.layers\.0\.self_attn\.o_proj)", "<out>:0", "tp=S(1)")  // fused per mesh dim
      .annotate(R"(model\.layers\.1\.self_attn\.o_proj)", "<out>:0", "dp=S(0) tp=P(sum)")
      .place(R"(model\.layers\.1\.self_attn\.o_proj)", "<out>:0", "dp=S(0) tp=R");
  HookIR ir = lower(p, *m, p.resolve_mesh(4));
  std::string s = ir.str();
  INFO(s);
  REQUIRE(s.find("model.layers.0.self_attn.q_proj.param_init:weight:init(S(0)@dp,S(0)@tp)\n") != std::string::npos);
  REQUIRE(s.find("model.layers.0.self_attn.q_proj.forward_pre:weight:redist(S(0)->R@dp)\n") != std::string::npos);
  REQUIRE(s.find("model.layers.0.self_attn.q_proj.forward:weight:release\n") != std::string::npos);
  REQUIRE(s.find("model.layers.0.self_attn.o_proj.forward:<out>:0:to(S(0)@dp,S(1)@tp)\n") != std::string::npos);
  REQUIRE(s.find("model.layers.1.self_attn.o_proj.forward:<out>:0:annotate(S(0)@dp,P(sum)@tp),redist(P(sum)->R@tp)\n") !=
          std::string::npos);
  REQUIRE(ir.init_placements("model.norm.weight") == Placements{Placement::shard(0), Placement::replicate()});
  // Every param_init comes first; forward_pre before forward within a module.
  size_t last_init = 0, first_run = ir.records.size();
  for (size_t i = 0; i < ir.records.size(); ++i) {
    if (ir.records[i].hook == HookPoint::kParamInit) last_init = i;
    else first_run = std::min(first_run, i);
  }
  REQUIRE(last_init < first_run);
  REQUIRE(s.find("q_proj.forward_pre:weight") < s.find("q_proj.forward:weight"));
}

TEST_CASE("plan: parse errors name file:line:column and what is expected", "[cpu]") {
  auto err = [](const std::string& text) {
    try {
      parse_plan(text, "t.plan");
    } catch (const mt::Error& e) {
      return std::string(e.what());
    }
    FAIL("no error for: " << text);
    return std::string();
  };
  using Catch::Contains;
  REQUIRE_THAT(err("mesh tp=*\nplace model weight tp=S(0\n"), Contains("t.plan:2:20") && Contains("expected DIM=PLACEMENT"));
  REQUIRE_THAT(err("mesh tp=*\nplase model weight tp=S(0)\n"),
               Contains("t.plan:2:1") && Contains("unknown keyword 'plase'") && Contains("expected one of"));
  REQUIRE_THAT(err("mesh tp=*\n# comment\n\nplace model weight  dp=S(0)\n"),
               Contains("t.plan:4:21") && Contains("'dp=S(0)' names no mesh dim") && Contains("tp"));
  REQUIRE_THAT(err("mesh tp=* dp=*\n"), Contains("t.plan:1:11") && Contains("second '*'"));
  REQUIRE_THAT(err("mesh tp=x\n"), Contains("t.plan:1:6") && Contains("expected NAME=SIZE"));
  REQUIRE_THAT(err("place model weight tp=S(0)\n"), Contains("t.plan:1:1") && Contains("before the mesh"));
  REQUIRE_THAT(err("mesh tp=*\nplace model\\.(layers weight tp=S(0)\n"),
               Contains("t.plan:2:7") && Contains("not a valid regular expression"));
  REQUIRE_THAT(err("mesh tp=*\ninit model <in>:0 tp=S(0)\n"), Contains("t.plan:2:1") && Contains("init applies to parameters"));
  REQUIRE_THAT(err("mesh tp=*\nplace model <inp>:0 tp=S(0)\n"), Contains("t.plan:2:13") && Contains("expected <in>:K or <out>:K"));
  REQUIRE_THAT(err("mesh tp=*\nredistribute model <out>:0 tp=P(sum) tp=R\n"), Contains("t.plan:2:1") && Contains("'->'"));
  REQUIRE_THAT(err("mesh tp=*\nannotate model weight tp=R\n"), Contains("t.plan:2:16") && Contains("inputs and outputs"));
  REQUIRE_THAT(err("mesh tp=*\nplace model weight\n"), Contains("t.plan:2:1") && Contains("needs a module regex"));
  REQUIRE_THAT(err("# nothing\n"), Contains("t.plan:1") && Contains("declares no mesh"));
  // Builder errors name the call.
  Plan p;
  p.mesh({{"tp", -1}});
  REQUIRE_THROWS_WITH(p.place("model", "weight", "xp=S(0)"), Contains("<builder>:2") && Contains("names no mesh dim"));
}

TEST_CASE("plan: lowering errors (unmatched regexes, mesh/world, placements that do not fit)", "[cpu]") {
  using Catch::Contains;
  auto m = meta_model("llama-tiny");
  auto lower_err = [&](const std::string& text, int64_t world) {
    Plan p = parse_plan(text, "t.plan");
    try {
      lower(p, *m, p.resolve_mesh(world));
    } catch (const mt::Error& e) {
      return std::string(e.what());
    }
    FAIL("no error for: " << text);
    return std::string();
  };
  // A module regex that matches nothing lists the nearest module paths.
  REQUIRE_THAT(lower_err("mesh tp=*\nplace  model\\.layers\\.0\\.self_atn weight tp=S(0)\n", 2),
               Contains("t.plan:2:8") && Contains("matches no module path") &&
                   Contains("nearest module paths: model.layers.0.self_attn"));
  // A parameter regex that matches nothing lists the matched modules' parameters.
  REQUIRE_THAT(lower_err("mesh tp=*\nplace model\\.norm weights tp=S(0)\n", 2),
               Contains("t.plan:2:19") && Contains("'weights' matches no parameter") && Contains("weight"));
  // The world does not fit the mesh.
  REQUIRE_THAT(lower_err("mesh dp=2 tp=*\nplace model\\.norm weight tp=R\n", 3),
               Contains("t.plan:1:1") && Contains("does not fit a world of 3"));
  REQUIRE_THAT(lower_err("mesh dp=2 tp=2\nplace model\\.norm weight tp=R\n", 2),
               Contains("t.plan:1:1") && Contains("has 4 ranks but the world has 2"));
  // Placements that do not fit a parameter.
  REQUIRE_THAT(lower_err("mesh tp=*\nplace model\\.norm weight tp=S(1)\n", 2),
               Contains("t.plan:2:26") && Contains("model.norm.weight of shape [128]") &&
                   Contains("tensor dim 1 is out of range"));
  REQUIRE_THAT(lower_err("mesh tp=*\nplace model\\.norm weight tp=IS(0,3)\n", 2),
               Contains("t.plan:2:26") && Contains("do not fit parameter model.norm.weight"));
  REQUIRE_THAT(lower_err("mesh tp=*\ninit model\\.norm weight tp=P(sum)\n", 2),
               Contains("t.plan:2:25") && Contains("cannot be Partial"));
  REQUIRE_THAT(lower_err("mesh ep=*\nplace model\\.norm weight ep=owner(2)\n", 2),
               Contains("t.plan:2:26") && Contains("owner(K) with K < 2"));
  // A DeviceMesh that differs from the plan's.
  Plan p = parse_plan("mesh tp=*\n", "t.plan");
  DeviceMesh one({1}, {"dp"});
  REQUIRE_THROWS_WITH(lower(p, *m, one), Contains("declares mesh [tp=1]") && Contains("DeviceMesh([1]"));
}
