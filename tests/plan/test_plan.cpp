// Plans without communication: the parser on every stock plan, builder == file, error messages
// (file:line:column, unmatched regexes with nearby paths, mesh/world mismatch, placements that do
// not fit), and golden IR lines for llama-tiny under llama_tp at world 2. Hostile input: regexes
// (RE2: linear time, bounded length), binary and oversized files, inputs split on dims they do not
// have, and head splits the model's views cannot take (check_plan_forward on a simulated mesh).
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "models/config.h"
#include "models/llama.h"
#include "plan/check.h"
#include "plan/lower.h"
#include "plan/parallelize.h"
#include "plan/path_regex.h"
#include "plan/plan.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "testing.h"

using namespace mt;
using mt::testing::error_of;
using mt::testing::plans_dir;

namespace {

std::shared_ptr<CausalLM> meta_model(const std::string& config) {
  InitDeviceGuard meta(Device::meta());
  return build_causal_lm(builtin_config(config));
}

const char* config_for(const std::string& plan) {
  return plan.find("mixtral") != std::string::npos ? "mixtral-tiny" : "llama-tiny";
}

const std::vector<std::string> kStock = {"llama_dp",   "llama_tp",      "llama_tp_sp", "llama_dp_tp",
                                         "llama_zero3", "llama_fsdp",   "llama_fsdp_tp", "mixtral_ep",
                                         "mixtral_ep_tp", "mixtral_fsdp_ep", "llama_hsdp",  "llama_cp",
                                         "llama_dp_cp_tp"};

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
    const int64_t world = name == "llama_dp_cp_tp" ? 4 : 2;  // cp=2 x tp=2
    std::string ir = lower_str(p, config_for(name), world);
    REQUIRE(ir == lower_str(again, config_for(name), world));
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

namespace {

// A meta batch of token ids [1, 8] for llama-tiny.
std::vector<Tensor> meta_ids() {
  return {zeros(Shape{1, 8}, TensorOptions(DType::kI64).with_device(Device::meta()))};
}

}  // namespace

TEST_CASE("plan: regexes are RE2 (linear time, full match, bounded) with file:line:column errors", "[cpu]") {
  using Catch::Contains;
  // A 100 kB regex is an error at its token, not a stack overflow in the regex engine.
  const std::string huge(100000, 'a');
  REQUIRE_THAT(error_of([&] { parse_plan("mesh tp=*\nplace " + huge + " weight tp=R\n", "t.plan"); }),
               Contains("t.plan:2:7") && Contains("100000 bytes long") && Contains("at most 4096 bytes"));
  REQUIRE_THAT(error_of([&] { parse_plan("mesh tp=*\nplace model " + huge + " tp=R\n", "t.plan"); }),
               Contains("t.plan:2:13") && Contains("at most 4096 bytes"));
  std::string nested = std::string(2000, '(') + "a" + std::string(2000, ')');
  const std::string parens(100000, '(');
  REQUIRE_THAT(error_of([&] { parse_plan("mesh tp=*\nplace " + parens + " weight tp=R\n", "t.plan"); }),
               Contains("t.plan:2:7") && Contains("at most 4096 bytes"));
  Plan deep;
  deep.mesh({{"tp", -1}});
  REQUIRE_NOTHROW(deep.place(nested, "weight", "tp=R"));  // deep nesting within the bound is fine
  Plan b;
  b.mesh({{"tp", -1}});
  REQUIRE_THROWS_WITH(b.place(huge, "weight", "tp=R"), Contains("<builder>:2") && Contains("at most 4096 bytes"));

  // Catastrophic backtracking patterns match in linear time (a backtracking engine takes minutes).
  PathRegex bad("((.*)*)*Q", PlanLoc{"t.plan", 1, 1}, "a regex");
  const std::string path(200000, 'a');
  REQUIRE_FALSE(bad.full_match(path));
  REQUIRE(bad.full_match(path + "Q"));
  PathRegex alt("(a|aa)*(a|aa)*(a|aa)*b", PlanLoc{"t.plan", 1, 1}, "a regex");
  REQUIRE_FALSE(alt.full_match(path));
  // ... and in a plan: the entry matches the paths it should, quickly.
  auto m = meta_model("llama-tiny");
  Plan cat = parse_plan("mesh tp=*\nplace ((.*)*)*head weight tp=S(0)\n", "t.plan");
  REQUIRE_THAT(lower(cat, *m, cat.resolve_mesh(2)).str(), Contains("lm_head.param_init:weight:init(S(0)@tp)"));
  REQUIRE_THAT(error_of([&] {
                 Plan q = parse_plan("mesh tp=*\nplace ((.*)*)*Q weight tp=R\n", "t.plan");
                 lower(q, *m, q.resolve_mesh(2));
               }),
               Contains("t.plan:2:7") && Contains("matches no module path"));

  // Full match, not search: "self_attn" is not "model.layers.0.self_attn".
  PathRegex part("self_attn", PlanLoc{"t.plan", 1, 1}, "a regex");
  REQUIRE_FALSE(part.full_match("model.layers.0.self_attn"));
  REQUIRE(PathRegex(R"(model\.layers\.\d+\.self_attn)", PlanLoc{"t.plan", 1, 1}, "").full_match("model.layers.12.self_attn"));
  REQUIRE(PathRegex(R"(a\#b)", PlanLoc{"t.plan", 1, 1}, "").full_match("a#b"));  // "\#" in plan files

  // Invalid regexes: RE2's message, at the column of the part it names.
  auto err = [](const std::string& text) { return error_of([&] { parse_plan(text, "t.plan"); }); };
  REQUIRE_THAT(err("mesh tp=*\nplace model\\.(layers weight tp=R\n"),
               Contains("t.plan:2:7") && Contains("not a valid regular expression") && Contains("missing )"));
  REQUIRE_THAT(err("mesh tp=*\nplace model(?=x) weight tp=R\n"),
               Contains("t.plan:2:12") && Contains("invalid perl operator: (?=") && Contains("no backreferences or lookaround"));
  REQUIRE_THAT(err("mesh tp=*\nplace (model)\\1 weight tp=R\n"),
               Contains("t.plan:2:14") && Contains("invalid escape sequence: \\1"));
  REQUIRE_THAT(err("mesh tp=*\nplace model weight[ tp=R\n"),
               Contains("t.plan:2:19") && Contains("missing ]"));
  REQUIRE_THAT(err("mesh tp=*\nplace model a{2000} tp=R\n"), Contains("t.plan:2:14") && Contains("invalid repetition size"));
}

TEST_CASE("plan: binary and oversized plan files are clean errors", "[cpu]") {
  using Catch::Contains;
  REQUIRE_THAT(error_of([] { parse_plan(std::string("mesh tp=*\nplace mo\x01" "del weight tp=R\n"), "t.plan"); }),
               Contains("t.plan:2:9") && Contains("byte 0x01 is a control character"));
  REQUIRE_THAT(error_of([] { parse_plan(std::string("mesh\0tp=*\n", 10), "t.plan"); }),
               Contains("t.plan:1:5") && Contains("byte 0x00"));
  REQUIRE_THAT(error_of([] { parse_plan(std::string((1 << 20) + 1, '#'), "t.plan"); }),
               Contains("t.plan") && Contains("expected a text file of at most 1048576 bytes"));
  REQUIRE_THAT(error_of([] { parse_plan("", "t.plan"); }), Contains("t.plan:1") && Contains("declares no mesh"));
  // Non-ASCII bytes are shown escaped, not echoed. A UTF-8 byte-order mark before the first line
  // is skipped (editors write one; it was an unknown keyword until 2026-12-07).
  REQUIRE_THAT(error_of([] { parse_plan("\xc3\xa9mesh tp=*\n", "t.plan"); }),
               Contains("t.plan:1:1: unknown keyword '\\xc3\\xa9mesh'"));
  REQUIRE(parse_plan("\xef\xbb\xbfmesh tp=*\nplace model\\.norm weight tp=R\n", "t.plan").entries().size() == 1);
  // A mesh size no world reaches says so.
  REQUIRE_THAT(error_of([] { parse_plan("mesh tp=99999999999999999999\n", "t.plan"); }),
               Contains("t.plan:1:6: mesh dim 'tp' has size 99999999999999999999: too large for any world"));
  // A long line that is only a comment is fine; a long placement list is an error at its token.
  REQUIRE_NOTHROW(parse_plan("mesh tp=*\n#" + std::string(500000, 'x') + "\n", "t.plan"));
}

TEST_CASE("plan: inputs and outputs are checked against a meta forward", "[cpu]") {
  using Catch::Contains;
  auto m = meta_model("llama-tiny");
  auto io_err = [&](const std::string& text, int64_t world) {
    Plan p = parse_plan(text, "t.plan");
    HookIR ir = lower(p, *m, p.resolve_mesh(world));
    return error_of([&] { check_io_shapes(p, ir, *m, meta_ids()); });
  };
  // Token ids are [B, T]: S(2) names a dim they do not have; the error points at "tp=S(2)".
  REQUIRE_THAT(io_err("mesh tp=*\nplace model <in>:0 tp=S(2)\n", 2),
               Contains("t.plan:2:20") && Contains("S(2)@tp for <in>:0 of module model splits tensor dim 2") &&
                   Contains("[1, 8] (2-D)"));
  REQUIRE_THAT(io_err("mesh dp=2 tp=*\nredistribute model\\.norm <out>:0 dp=R tp=S(1) -> dp=R tp=S(3)\n", 4),
               Contains("t.plan:2:55") && Contains("S(3)@tp for <out>:0 of module model.norm") && Contains("(3-D)"));
  REQUIRE_THAT(io_err("mesh tp=*\nplace model <in>:2 tp=R\n", 2),
               Contains("t.plan:2:1") && Contains("<in>:2 of module model: its forward has 1 inputs"));
  // The stock plans pass.
  for (const auto& name : {"llama_dp", "llama_tp", "llama_tp_sp", "llama_zero3"}) {
    Plan p = load_plan(plans_dir() + "/" + name + ".plan");
    HookIR ir = lower(p, *m, p.resolve_mesh(2));
    REQUIRE_NOTHROW(check_io_shapes(p, ir, *m, meta_ids()));
  }
}

TEST_CASE("plan: the forward check finds uneven head splits, naming the module and the plan line", "[cpu]") {
  using Catch::Contains;
  auto build = [] { return std::static_pointer_cast<Module>(meta_model("llama-tiny")); };
  const std::string tp = plans_dir() + "/llama_tp.plan";
  Plan p = load_plan(tp);
  // llama-tiny has 2 KV heads: 4 tensor-parallel ranks split them unevenly; parallelize's
  // shard-unit check (a rank holds whole heads) refuses it. Found without a job, for any world size.
  REQUIRE_THAT(error_of([&] { check_plan_forward(p, p.resolve_mesh(4), build, meta_ids()); }),
               Contains(tp + ": a forward under the plan on mesh [tp=4] at coordinate [0] fails") &&
                   Contains("parameter model.layers.0.self_attn.k_proj.weight [64, 128] is split S(0)") &&
                   Contains("'tp' must divide 2") && Contains("(plan " + tp + ":8:1)"));
  // The failed forward left no factory scope behind (its rope scope went with the handle).
  REQUIRE(current_factory("rope") == nullptr);
  // An input split on a dim it has not, placed by the plan's root entry, fails in the hook.
  Plan in = parse_plan("mesh tp=*\nplace model <in>:0 tp=S(2)\n", "t.plan");
  REQUIRE_THAT(error_of([&] { check_plan_forward(in, in.resolve_mesh(2), build, meta_ids()); }),
               Contains("in plan hook model.forward_pre:<in>:0:to(S(2)@tp) (plan t.plan:2:1)"));
  // Every stock plan passes where it fits (llama-tiny: 4 heads, 2 KV heads).
  for (const auto& name : kStock) {
    INFO(name);
    Plan s = load_plan(plans_dir() + "/" + name + ".plan");
    const std::string cfg = config_for(name);
    auto b = [cfg] { return std::static_pointer_cast<Module>(meta_model(cfg)); };
    for (int64_t world : {1, 2, 4}) {
      // 4-way tensor parallelism splits llama-tiny's 2 KV heads; dp_tp and ep_tp need 2 ranks.
      if ((name == "llama_tp" || name == "llama_tp_sp") && world == 4) continue;
      if (name == "llama_dp_cp_tp" && world != 4) continue;  // cp=2 x tp=2
      if ((name == "llama_dp_tp" || name == "mixtral_ep_tp" || name == "llama_fsdp_tp" || name == "llama_hsdp") &&
          world == 1)
        continue;
      REQUIRE_NOTHROW(check_plan_forward(s, s.resolve_mesh(world), b, meta_ids()));
    }
  }
}

TEST_CASE("plan: fsdp units lower to the layout planner's RaggedShards", "[cpu][fsdp]") {
  // llama-tiny: hidden 128, MLP 344, 4 layers. Layers are units with 8-row blocks for the MLP
  // projections that have 344 rows (gate, up) and whole norms; the root unit keeps the rest.
  Plan p = parse_plan("mesh dp=*\n"
                      "fsdp () .* dp=rows\n"
                      "fsdp model\\.layers\\.\\d+ .* dp=rows\n"
                      "fsdp model\\.layers\\.\\d+ mlp\\.(gate|up)_proj\\.weight dp=rows(8)\n"
                      "fsdp model\\.layers\\.\\d+ .*layernorm\\.weight dp=whole\n",
                      "f.plan");
  REQUIRE(parse_plan(p.str(), "again.plan").str() == p.str());
  auto m = meta_model("llama-tiny");
  for (int64_t world : {2, 3, 4}) {
    INFO("world " << world);
    HookIR ir = lower(p, *m, p.resolve_mesh(world));
    REQUIRE(ir.fsdp_units.size() == 5);
    CHECK(ir.fsdp_units[0].module == "");
    CHECK(ir.fsdp_units[1].module == "model.layers.0");
    CHECK(ir.fsdp_units[4].module == "model.layers.3");
    CHECK(ir.fsdp_units[0].params == std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight",
                                                              "lm_head.weight"});
    for (const FsdpUnit& u : ir.fsdp_units) {
      LayoutOptions opt;
      opt.group = world;
      opt.order = TensorOrder::kGiven;
      REQUIRE_NOTHROW(check_fsdp_layout(u.tensors, opt, u.layout));
      int64_t on_rank_total = 0;
      for (const PlacedTensor& t : u.layout.tensors) {
        const LayoutTensor& lt = u.tensors[static_cast<size_t>(t.index)];
        // The parameter's storage is the RaggedShard of its blocks per rank.
        REQUIRE(ir.init_placements(lt.name)[0] == Placement::ragged_shard(0, t.ragged_units(world), lt.block_rows));
        if (lt.name.find("gate_proj") != std::string::npos) CHECK(lt.block_rows == 8);
        if (lt.name.find("layernorm") != std::string::npos) {
          CHECK(lt.block_rows == lt.rows);  // whole: on one rank
          CHECK(std::count_if(t.blocks.begin(), t.blocks.end(), [](int64_t b) { return b > 0; }) == 1);
        }
        on_rank_total += lt.numel();
      }
      CHECK(on_rank_total == u.layout.payload);
      CHECK(u.layout.shard_size * world >= u.layout.payload);
      CHECK(u.str(ir.mesh).find("shard ") != std::string::npos);
    }
    // Gathered for compute: a forward_pre redistribute to Replicate and a release per parameter.
    CHECK(ir.str().find("model.layers.0.mlp.gate_proj.forward_pre:weight:redist(RS(0,") != std::string::npos);
    CHECK(ir.str().find("model.layers.0.mlp.gate_proj.forward:weight:release") != std::string::npos);
  }
  // Under tensor parallelism first (tp before dp in the mesh), the layout divides the local shards.
  Plan tp = load_plan(plans_dir() + "/llama_fsdp_tp.plan");
  HookIR ir = lower(tp, *m, tp.resolve_mesh(4));
  const FsdpUnit& layer = ir.fsdp_units[1];
  CHECK(layer.tensors[0].name == "model.layers.0.self_attn.q_proj.weight");
  CHECK(layer.tensors[0].rows == 64);  // 128 output rows split over tp=2
  CHECK(layer.tensors[3].name == "model.layers.0.self_attn.o_proj.weight");
  CHECK(layer.tensors[3].cols == 64);  // its input dim split over tp
}

TEST_CASE("plan: fsdp units take reshard= and prefetch= from their entries", "[cpu][fsdp]") {
  using Catch::Matchers::Contains;
  auto m = meta_model("llama-tiny");
  Plan p = parse_plan("mesh dp=*\n"
                      "fsdp () .* dp=rows prefetch=no\n"
                      "fsdp model\\.layers\\.\\d+ .* dp=rows reshard=no\n"
                      "fsdp model\\.layers\\.\\d+ mlp\\..* dp=rows(8) reshard=no prefetch=yes\n",
                      "f.plan");
  CHECK(p.entries()[0].fsdp_prefetch == 0);
  CHECK(p.entries()[0].fsdp_reshard == -1);
  CHECK(p.entries()[1].str() == "fsdp model\\.layers\\.\\d+ .* dp=rows reshard=no");
  REQUIRE(parse_plan(p.str(), "again.plan").str() == p.str());
  HookIR ir = lower(p, *m, p.resolve_mesh(2));
  REQUIRE(ir.fsdp_units.size() == 5);
  CHECK(ir.fsdp_units[0].prefetch == false);
  CHECK(ir.fsdp_units[0].reshard_after_forward == true);
  CHECK(ir.fsdp_units[1].reshard_after_forward == false);
  CHECK(ir.fsdp_units[1].prefetch == true);
  CHECK_THAT(ir.fsdp_units[1].str(ir.mesh), Contains("reshard=no"));
  CHECK_THAT(ir.fsdp_units[0].str(ir.mesh), Contains("prefetch=no"));
  // An entry whose parameters a later entry takes all (here to change the granularity) still gives
  // its units its options (they were dropped without a word until 2026-12-07).
  Plan over = parse_plan("mesh dp=*\nfsdp model\\.layers\\.\\d+ .* dp=rows reshard=no prefetch=no\n"
                         "fsdp model\\.layers\\.\\d+ .* dp=rows(2)\n",
                         "o.plan");
  HookIR oir = lower(over, *m, over.resolve_mesh(2));
  REQUIRE(oir.fsdp_units.size() == 4);  // llama-tiny's layers
  for (const FsdpUnit& u : oir.fsdp_units) {
    CHECK(u.reshard_after_forward == false);
    CHECK(u.prefetch == false);
  }
  // The builder takes the same words.
  Plan b;
  b.mesh({{"dp", -1}});
  b.fsdp("model\\.layers\\.\\d+", ".*", "dp=rows prefetch=no");
  CHECK(b.entries()[0].fsdp_prefetch == 0);
  // Bad input: a value other than yes / no, an option twice, and two entries that disagree on a
  // unit, each naming the plan line.
  REQUIRE_THAT(error_of([&] { parse_plan("mesh dp=*\nfsdp model .* dp=rows reshard=maybe\n", "f.plan"); }),
               Contains("f.plan:2:23") && Contains("expected reshard=yes or reshard=no"));
  REQUIRE_THAT(error_of([&] { parse_plan("mesh dp=*\nfsdp model .* dp=rows prefetch=no prefetch=no\n", "f.plan"); }),
               Contains("f.plan:2:35") && Contains("'prefetch' is given twice"));
  REQUIRE_THAT(error_of([&] { parse_plan("mesh dp=*\nfsdp model .* reshard=no\n", "f.plan"); }),
               Contains("f.plan:2:1") && Contains("DIM=rows, DIM=rows(N) or DIM=whole"));
  REQUIRE_THAT(error_of([&] {
                 Plan q = parse_plan("mesh dp=*\nfsdp model\\.layers\\.\\d+ .* dp=rows reshard=no\n"
                                     "fsdp model\\.layers\\.\\d+ mlp\\..* dp=rows reshard=yes\n",
                                     "f.plan");
                 (void)lower(q, *m, q.resolve_mesh(2));
               }),
               Contains("f.plan:3:1") && Contains("model.layers.0 gets reshard=yes here but reshard=no at f.plan:2:1"));
}

TEST_CASE("plan: fsdp bad input names the plan line", "[cpu][fsdp]") {
  using Catch::Matchers::Contains;
  auto m = meta_model("llama-tiny");
  auto lowered = [&](const std::string& text, int64_t world) {
    Plan p = parse_plan(text, "f.plan");
    return lower(p, *m, p.resolve_mesh(world));
  };
  // A granularity that does not divide a parameter's rows (344 MLP rows, blocks of 3).
  REQUIRE_THAT(error_of([&] { lowered("mesh dp=*\nfsdp model\\.layers\\.\\d+ mlp\\..* dp=rows(3)\n", 2); }),
               Contains("f.plan:2:") && Contains("granularity dp=rows(3)") && Contains("gate_proj.weight") &&
                   Contains("344 rows"));
  // A unit regex that matches no module; a parameter regex that matches nothing in the units.
  REQUIRE_THAT(error_of([&] { lowered("mesh dp=*\nfsdp model\\.blocks\\.\\d+ .* dp=rows\n", 2); }),
               Contains("f.plan:2:6") && Contains("matches no module path"));
  REQUIRE_THAT(error_of([&] { lowered("mesh dp=*\nfsdp model\\.layers\\.\\d+ attn\\..* dp=rows\n", 2); }),
               Contains("f.plan:2:") && Contains("matches no parameter path inside the units"));
  // An FSDP dim the mesh does not have; a granularity outside an fsdp entry; fsdp without one.
  REQUIRE_THAT(error_of([&] { parse_plan("mesh dp=*\nfsdp model .* fsdp=rows\n", "f.plan"); }),
               Contains("f.plan:2:15") && Contains("names no mesh dim"));
  REQUIRE_THAT(error_of([&] { parse_plan("mesh dp=*\nplace model weight dp=rows\n", "f.plan"); }),
               Contains("f.plan:2:") && Contains("FSDP granularity"));
  REQUIRE_THAT(error_of([&] { parse_plan("mesh dp=*\nfsdp model .* dp=S(0)\n", "f.plan"); }),
               Contains("f.plan:2:1") && Contains("DIM=rows, DIM=rows(N) or DIM=whole"));
  REQUIRE_THAT(error_of([&] { parse_plan("mesh dp=*\nfsdp model .* dp=rows(0)\n", "f.plan"); }),
               Contains("rows(N) needs a positive number"));
  // A parameter placed on the FSDP dim by another entry.
  REQUIRE_THAT(error_of([&] {
                 lowered("mesh dp=*\nplace model\\.norm weight dp=S(0)\nfsdp () .* dp=rows\n", 2);
               }),
               Contains("f.plan:3:") && Contains("model.norm.weight") && Contains("f.plan:2:"));
  // Another dim's split after the FSDP dim in the mesh.
  REQUIRE_THAT(error_of([&] {
                 lowered("mesh dp=* tp=2\nplace model\\.layers\\.\\d+\\.mlp\\.up_proj weight tp=S(0)\n"
                         "fsdp model\\.layers\\.\\d+ .* dp=rows\n",
                         4);
               }),
               Contains("f.plan:3:") && Contains("comes after the FSDP dim 'dp'"));
}
