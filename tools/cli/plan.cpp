// `meshtrain plan --config C --plan P --world N`: lowers a plan for a model and a world size and
// prints the hook IR and the local shape of every parameter per mesh coordinate, without running
// anything (the model is built on the meta device; no MPI needed). --estimate, --sweep and
// --calibrate are plan_estimate.h.
#include <fmt/format.h>

#include <algorithm>

#include "mesh/shard_layout.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "plan/lower.h"
#include "plan/pipeline.h"
#include "plan/plan.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"
#include "tools/cli/parallel.h"
#include "tools/cli/plan_estimate.h"
#include "tools/cli/trainer.h"

namespace mt::cli {
namespace {

std::vector<FlagSpec> plan_flags() {
  std::vector<FlagSpec> f = {
      {"config", "built-in model name, config.json, or a directory holding one", "llama-tiny", false},
      {"plan", "plan file (see docs/plans.md; stock plans in plans/)", "", false},
      {"world", "number of ranks to plan for", "1", false},
      {"fsdp-layout", "print each FSDP unit's planned buffer layout: shard size, padding, every tensor's offset and "
                      "blocks per rank (docs/fsdp.md)", "", true},
  };
  for (FlagSpec& e : estimate_flags()) f.push_back(std::move(e));
  for (FlagSpec& e : moe_loss_flags()) f.push_back(std::move(e));  // the run's loss and routing
  return f;
}

// "[64, 128] on (0), (1); [0, 128] on (2)" or "[256, 128] on all 4 ranks".
std::string local_shapes(const Shape& global, const Placements& ps, const PlanMesh& mesh) {
  std::vector<std::pair<Shape, std::vector<std::string>>> groups;
  Shape coord(std::vector<int64_t>(mesh.shape.size(), 0));
  while (true) {
    Shape local = local_layout(global, ps, mesh.shape, coord).local_shape;
    std::string c = "(";
    for (int i = 0; i < coord.size(); ++i) c += fmt::format("{}{}", i ? "," : "", coord[i]);
    c += ")";
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == local; });
    if (it == groups.end()) groups.push_back({local, {c}});
    else it->second.push_back(c);
    size_t k = coord.size();
    while (k > 0 && ++coord[k - 1] == mesh.shape[k - 1]) coord[--k] = 0;
    if (k == 0) break;
  }
  if (groups.size() == 1) return fmt::format("{} on all {} ranks", groups[0].first, mesh.size());
  std::string s;
  for (auto& [shape, coords] : groups) {
    if (!s.empty()) s += "; ";
    s += fmt::format("{} on {}", shape, fmt::join(coords, ", "));
  }
  return s;
}

}  // namespace

int run_plan(int argc, char** argv) {
  Args args("plan", plan_flags(), argc, argv, 2);
  if (wants_estimate(args)) return run_plan_estimate(args);
  MT_CHECK(!args.has("memory-gb"), "meshtrain plan: --memory-gb is the budget of --sweep, which is not given");
  const std::string plan_path = args.required("plan");
  const int64_t world = args.integer("world", 1, kMaxPlanWorld);  // every mesh coordinate is listed
  ModelConfig config = resolve_config(args.str("config"));
  apply_moe_loss_flags(args, config, "plan");
  Plan plan = load_plan(plan_path);
  std::shared_ptr<CausalLM> model;
  {
    InitDeviceGuard meta(Device::meta());  // shapes only: nothing is allocated
    model = build_causal_lm(config);
  }
  PlanMesh mesh = plan.resolve_mesh(world);
  HookIR ir = lower(plan, *model, mesh);
  // Inputs and outputs have no static shape: one forward on a meta batch of token ids shows them,
  // then the ops themselves under the plan (heads split evenly, views of shards, the loss). Its
  // batch is the world size, so that a batch split over any mesh dims (nested, dp x ep) is even
  // there, as a real run's batch has to be for such plans.
  check_forward_on_meta(plan, mesh, ir, *model, config, world,
                        std::min<int64_t>(8, std::max<int64_t>(config.max_position_embeddings, 1)));
  fmt::print("# plan {} for {} on a world of {}: mesh {}\n", plan_path, args.str("config"), world, mesh.str());
  if (plan.is_pipeline()) {
    // Stages, their parameter counts and the schedule for --accum micro-batches (docs/pipeline.md).
    const PipelineLayout layout = resolve_pipeline(plan, mesh, pipeline_units_of(*model, model->pipeline_units()));
    const int64_t accum = args.integer("accum", 1, 1 << 20);
    fmt::print("# {}", layout.str(accum));
    if (config.tie_word_embeddings && layout.size() > 1)
      fmt::print("# tied word embeddings: model.embed_tokens.weight on stages 0 and {}, its gradient summed over the "
                 "two\n", layout.size() - 1);
    if (layout.schedule == PipelineScheduleKind::kOneFOneB && accum < layout.size())
      fmt::print("# note: 1F1B needs --accum >= {} (the stage count); train and parity refuse --accum {}\n",
                 layout.size(), accum);
    if (layout.schedule == PipelineScheduleKind::kInterleaved && accum % layout.size() != 0)
      fmt::print("# note: interleaved 1F1B needs --accum a multiple of {} (the stage count); train and parity refuse "
                 "--accum {}\n", layout.size(), accum);
    if (!ir.fsdp_units.empty()) {
      // FSDP units per stage: each stage lays out the units of its own modules on its stage mesh
      // (the root unit holds other parameters on each stage; docs/pipeline.md).
      const Plan stage_plan = plan.without_pipeline();
      const PlanMesh stage_mesh = stage_plan.resolve_mesh(world / layout.size());
      for (int64_t s = 0; s < layout.size(); ++s) {
        std::shared_ptr<CausalLM> stage_model;
        {
          InitDeviceGuard meta(Device::meta());
          stage_model = build_causal_lm(config);
        }
        std::vector<std::string> keep;
        if (config.tie_word_embeddings && s + 1 == layout.size() && s > 0) keep.push_back("model.embed_tokens");
        prune_to_stage(*stage_model, layout, s, keep);
        const HookIR sir = lower(stage_plan, *stage_model, stage_mesh);
        fmt::print("# stage {}: {} FSDP unit{} on mesh {}\n", s, sir.fsdp_units.size(),
                   sir.fsdp_units.size() == 1 ? "" : "s", stage_mesh.str());
        for (const FsdpUnit& u : sir.fsdp_units) {
          const std::string text = u.str(stage_mesh);
          if (args.flag("fsdp-layout")) {
            fmt::print("{}", text);
          } else {
            fmt::print("#   {}\n", text.substr(0, text.find('\n')));
          }
        }
      }
      if (args.flag("fsdp-layout")) return 0;
    }
  }
  // Context parallelism: the sequence split of the model's input and each rank's positions for --seq.
  for (const HookRecord& r : ir.records) {
    if (r.hook != HookPoint::kForwardPre || !r.io_input || r.module != "model" || r.io_index != 0 || !r.dst) continue;
    for (size_t d = 0; d < r.dst->size(); ++d) {
      const Placement& p = (*r.dst)[d];
      if (!p.splits() || p.dim() != 1) continue;
      const int64_t k = mesh.shape[static_cast<int>(d)], seq = args.integer("seq", 1, int64_t{1} << 24);
      fmt::print("# context parallel over {} ({} ranks): the sequence is {}{} ({}); ring attention\n", mesh.names[d], k,
                 p.str(), p.mirrored() ? ", load-balanced: 2 x cp chunks, rank r holds chunks r and 2cp-1-r" : "",
                 r.from.empty() ? plan_path : r.from.back().str());
      if (p.mirrored() && seq % (2 * k) != 0) {
        fmt::print("# note: --seq {} is not divisible by 2 x {} = {}; train and parity refuse it\n", seq, k, 2 * k);
        continue;
      }
      Shape coord(std::vector<int64_t>(static_cast<size_t>(mesh.shape.size()), 0));
      Placements one(mesh.shape.size(), Placement::replicate());
      one[d] = p;
      for (int64_t c = 0; c < k && c < 16; ++c) {
        coord[static_cast<int>(d)] = c;
        std::string pos;
        const LocalLayout lay = local_layout(Shape{1, seq}, one, mesh.shape, coord);
        for (const DimSegment& s : lay.segments[1])
          pos += fmt::format("{}[{}, {})", pos.empty() ? "" : " + ", s.global_start, s.global_start + s.length);
        fmt::print("#   {}={}: positions {} of --seq {}\n", mesh.names[d], c, pos.empty() ? "none" : pos, seq);
      }
    }
  }
  if (args.flag("fsdp-layout")) {
    MT_CHECK(!ir.fsdp_units.empty(), "meshtrain plan --fsdp-layout: plan {} has no fsdp entries", plan_path);
    fmt::print("# FSDP layouts: {} units\n", ir.fsdp_units.size());
    for (const FsdpUnit& u : ir.fsdp_units) fmt::print("{}", u.str(mesh));
    return 0;
  }
  fmt::print("# hook IR: {} records\n{}", ir.records.size(), ir.str());
  std::string dims = fmt::format("{}", fmt::join(mesh.names, ","));
  fmt::print("# local parameter shapes per mesh coordinate ({})\n", dims);
  for (const HookRecord& r : ir.records) {
    if (r.action != HookAction::kInit && r.action != HookAction::kGather) continue;
    std::string path = r.module.empty() ? r.tensor : r.module + "." + r.tensor;
    const char* phase = r.action == HookAction::kInit ? "init" : "run";
    fmt::print("{} {} {} {}: {}\n", path, r.global_shape, phase, placements_on(*r.dst, mesh),
               local_shapes(r.global_shape, *r.dst, mesh));
  }
  return 0;
}

}  // namespace mt::cli
