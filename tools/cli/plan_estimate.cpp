// `meshtrain plan --estimate | --sweep | --calibrate` (plan_estimate.h, docs/estimate.md).
#include "tools/cli/plan_estimate.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "models/hf_config.h"
#include "models/llama.h"
#include "models/recompute.h"
#include "optim/muon.h"
#include "plan/estimate.h"
#include "plan/roofline.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "tools/cli/calibrate.h"
#include "tools/cli/checks.h"
#include "tools/cli/commands.h"
#include "tools/cli/outputs.h"
#include "tools/cli/trainer.h"

namespace mt::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string seconds_str(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

DType parse_precision(const std::string& p) {
  if (p == "f32") return DType::kF32;
  if (p == "bf16") return DType::kBF16;
  if (p == "f16") return DType::kF16;
  MT_FAIL("meshtrain plan: --precision must be f32, bf16 or f16, got '{}'", p);
}

EstimateOptions options_from(const Args& args) {
  EstimateOptions o;
  o.batch = args.integer("batch", 1, int64_t{1} << 24);
  o.seq = args.integer("seq", 1, int64_t{1} << 24);
  o.accum = args.integer("accum", 1, 1 << 20);
  o.precision = parse_precision(args.str("precision"));
  const std::string acc = args.str("accum-dtype");
  MT_CHECK(acc == "f32" || acc == "bf16" || acc == "f16",
           "meshtrain plan: --accum-dtype must be f32 or the 16-bit --precision, got '{}'", acc);
  MT_CHECK(acc == "f32" || o.precision == DType::kF32 || parse_precision(acc) == o.precision,
           "meshtrain plan: --accum-dtype {} is neither f32 nor --precision {}", acc, args.str("precision"));
  o.accum_dtype = acc == "f32" ? DType::kF32 : o.precision;
  const std::string opt = args.str("optimizer");
  MT_CHECK(opt == "adamw" || opt == "adamw8bit" || opt == "muon",
           "meshtrain plan: --optimizer {} is not supported by the estimate (adamw, adamw8bit or muon, docs/estimate.md)",
           opt);
  o.optimizer = opt;
  o.recompute = recompute_name(parse_recompute(args.str("recompute"), "meshtrain plan --recompute"));
  const double mb = args.real("bucket-mb");
  MT_CHECK(mb > 0, "meshtrain plan: --bucket-mb must be positive, got {}", mb);
  o.bucket_bytes = static_cast<int64_t>(mb * (1 << 20));
  return o;
}

// The model as `meshtrain train` runs it: built on the meta device, with the modules of
// --recompute marked, so the dry run keeps (and recomputes) what the training step does.
EstimateModel model_of(const ModelConfig& cfg, RecomputeMode recompute) {
  EstimateModel em;
  em.build_meta = [cfg, recompute]() -> std::shared_ptr<Module> {
    InitDeviceGuard meta(Device::meta());
    std::shared_ptr<CausalLM> m = build_causal_lm(cfg);
    apply_recompute(*m, recompute);
    return m;
  };
  em.loss = [](Module& m, const Tensor& ids, const Tensor& targets) {
    return static_cast<CausalLM&>(m).loss(ids, targets);
  };
  // Pipeline plans: the stage's span and forward as parallelize_run and the trainer run them.
  em.pipeline_units = [](Module& m) { return static_cast<CausalLM&>(m).pipeline_units(); };
  em.set_span = [](Module& m, int64_t first, int64_t last) { static_cast<CausalLM&>(m).set_pipeline_span(first, last); };
  em.forward = [](Module& m, const Tensor& x) { return m(std::vector<Tensor>{x}); };
  // The MoE router losses of the last stage's own layers: their ops and the whole-batch
  // all-reduces the losses end with are the job's (the trainer's losses take every stage's sums,
  // of the same shapes; the other stages' few per-layer sums and the carried bytes are left out:
  // docs/estimate.md). The cross-entropy alone when the last stage has no MoE layer.
  em.logits_loss = [cfg](const std::vector<Tensor>& outputs, const Tensor& targets) {
    return outputs.size() > 1 ? causal_lm_loss(cfg, outputs, targets) : cross_entropy(outputs.at(0), targets);
  };
  em.hidden = cfg.hidden_size;
  em.tied_embeddings = cfg.tie_word_embeddings;
  // Muon's Newton-Schulz work on this rank: the trainer's Muon (default options) on the shards.
  em.optimizer_matmul_flops = [](Module& m) {
    return Muon::planned_newton_schulz_flops(m.named_parameters(), MuonOptions{}.ns_steps);
  };
  return em;
}

struct PlanRun {
  std::string plan_path;
  Plan plan;
  PlanMesh mesh;
  std::vector<RankEstimate> ranks;
  std::vector<StepTime> times;
  double elapsed_s = 0;
};

PlanRun estimate_plan(const std::string& plan_path, const Plan& plan, const PlanMesh& mesh, const EstimateModel& em,
                      const EstimateOptions& o, const HardwareProfile& hw, int64_t all_up_to) {
  PlanRun run{plan_path, plan, mesh, {}, {}, 0};
  const auto t0 = Clock::now();
  std::vector<std::vector<int64_t>> coords = estimate_coordinates(mesh, all_up_to);
  if (plan.is_pipeline() && mesh.size() > all_up_to) {
    // Every pipeline stage (the other dims at 0) besides the first and the last coordinate.
    int pd = 0;
    while (mesh.names[static_cast<size_t>(pd)] != plan.pipeline_dim()) ++pd;
    std::vector<std::vector<int64_t>> with;
    for (int64_t s = 0; s < mesh.shape[pd]; ++s) {
      std::vector<int64_t> c(static_cast<size_t>(mesh.ndim()), 0);
      c[static_cast<size_t>(pd)] = s;
      with.push_back(c);
    }
    for (const auto& c : coords)
      if (std::find(with.begin(), with.end(), c) == with.end()) with.push_back(c);
    coords = with;
  }
  for (const auto& c : coords) {
    if (!run.ranks.empty() && same_local_shapes(run.ranks.front(), mesh, c)) {
      // The same local shapes as the first coordinate: the same figures (no second dry run).
      RankEstimate copy = run.ranks.front();
      copy.coord = c;
      copy.rank = rank_of(mesh, c);
      run.ranks.push_back(std::move(copy));
    } else {
      run.ranks.push_back(estimate_rank(em, plan, mesh, c, o));
    }
    run.times.push_back(roofline(run.ranks.back(), mesh, hw, o.precision));
  }
  run.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return run;
}

std::string coord_str(const PlanMesh& mesh, const std::vector<int64_t>& c) {
  std::string s;
  for (int d = 0; d < mesh.ndim(); ++d) s += fmt::format("{}{}={}", d ? ", " : "", mesh.names[static_cast<size_t>(d)], c[static_cast<size_t>(d)]);
  return "[" + s + "]";
}

// "1.235B", "0.79M", "12.3K": a parameter count in the unit that shows its digits (a 0.12M model
// read "0.000B" until 2026-12-07).
std::string count_text(int64_t n) {
  const double v = static_cast<double>(n);
  if (v >= 1e9) return fmt::format("{:.3f}B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  return fmt::format("{:.1f}K", v / 1e3);
}

constexpr const char* kShapes = "measured-from-shapes";
constexpr const char* kModel = "modelled";

void print_text(const PlanRun& r, const std::string& config_name, const ModelConfig& cfg, const EstimateOptions& o,
                const HardwareProfile& hw) {
  fmt::print("# estimate: plan {} for {} ({} parameters) on a world of {}: mesh {}\n", r.plan_path, config_name,
             count_text(cfg.num_parameters()), r.mesh.size(), r.mesh.str());
  fmt::print("# step: batch {} x seq {} x accum {}, precision {}, optimizer {}; hardware {} ({})\n", o.batch, o.seq,
             o.accum, dtype_name(o.precision), o.optimizer, hw.name, hw.source);
  if (r.ranks.size() < static_cast<size_t>(r.mesh.size()))
    fmt::print("# ranks shown: the first and the last coordinate (the largest and the smallest shards){}\n",
               r.plan.is_pipeline() ? ", and every pipeline stage's first coordinate" : "");
  fmt::print("# {} : counted from the real local shapes and a meta dry run of the step; {} : a formula or the "
             "hardware profile\n", kShapes, kModel);
  const double tokens = static_cast<double>(o.batch * o.seq * o.accum);
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const RankEstimate& e = r.ranks[i];
    const StepTime& t = r.times[i];
    fmt::print("rank {} {}\n", e.rank, coord_str(r.mesh, e.coord));
    const std::string padding = e.fsdp_padding_bytes > 0
                                    ? fmt::format("; FSDP padding {}", human(static_cast<double>(e.fsdp_padding_bytes)))
                                    : std::string();
    fmt::print("  {:<28} {:>14}  {}  ({} local elements, {}{})\n", "parameters", human(static_cast<double>(e.param_bytes)),
               kShapes, e.local_params, dtype_name(o.precision), padding);
    fmt::print("  {:<28} {:>14}  {}\n", "gradients", human(static_cast<double>(e.grad_bytes)), kShapes);
    fmt::print("  {:<28} {:>14}  {}  ({}: {})\n", "optimizer state", human(static_cast<double>(e.optimizer_bytes)),
               kShapes, o.optimizer,
               o.optimizer == "adamw8bit" ? "2 u8 codes + block absmax, f32 moments under 4096 elements"
               : o.optimizer == "muon"    ? "f32 momentum per hidden matrix, 2 f32 moments for the rest"
                                          : "2 f32 moments");
    fmt::print("  {:<28} {:>14}  {}\n", "master weights", human(static_cast<double>(e.master_bytes)), kShapes);
    fmt::print("  {:<28} {:>14}  {}  (meta dry run: persistent {} + activations, gradients, buckets {})\n",
               "peak memory", human(static_cast<double>(e.peak_bytes)), kShapes,
               human(static_cast<double>(e.persistent_bytes)), human(static_cast<double>(e.activation_bytes)));
    for (const CollectiveTime& c : t.collectives)
      fmt::print("  {:<28} {:>14}  {}  ({} calls over {} ranks) -> {} {} ({} link)\n",
                 fmt::format("{} over {}", c.key.kind, c.key.dims), human(static_cast<double>(c.tally.bytes)), kShapes,
                 c.tally.calls, c.tally.group_size, seconds_str(c.seconds), kModel, c.inter_node ? "inter-node" : "intra-node");
    if (t.collectives.empty()) fmt::print("  {:<28} {:>14}  {}\n", "communication", "none", kShapes);
    const std::string thin = t.matmul_s > t.matmul_full_rate_s * 1.005
                                 ? fmt::format("; x {:.2f} for thin dims, the profile's GEMM efficiency",
                                               t.matmul_s / t.matmul_full_rate_s)
                                 : std::string();
    const std::string ns = e.optimizer_matmul_flops > 0
                               ? fmt::format("; {:.4g} of them Muon's Newton-Schulz", e.optimizer_matmul_flops)
                               : std::string();
    fmt::print("  {:<28} {:>14}  {}  ({} matmul/attention kernels{}{}) -> {} {}\n", "matmul FLOPs",
               fmt::format("{:.4g}", e.cost.matmul_flops), kShapes, e.cost.matmuls, ns, thin,
               seconds_str(t.matmul_s), kModel);
    fmt::print("  {:<28} {:>14}  {}  ({} kernels) -> {} {}\n", "memory-bound bytes", human(e.cost.other_bytes), kShapes,
               e.cost.kernels - e.cost.matmuls, seconds_str(t.memory_s - t.optimizer_s), kModel);
    fmt::print("  {:<28} {:>14}  {}  (its reads and writes per element) -> {} {}\n", "optimizer bytes",
               human(e.cost.optimizer_bytes), kModel, seconds_str(t.optimizer_s), kModel);
    // Host overhead per call kind: the calls are counted in the dry run, the cost per call is the profile's.
    auto overhead = [&](const char* what, int64_t calls, double total) {
      if (total > 0)
        fmt::print("  {:<28} {:>14}  {}  ({} calls {}) -> {} {}\n", what,
                   seconds_str(total / static_cast<double>(std::max<int64_t>(calls, 1))), kModel, calls, kShapes,
                   seconds_str(total), kModel);
    };
    overhead("per-kernel overhead", e.cost.kernels, t.kernel_overhead_s);
    overhead("per-DTensor-op overhead", e.cost.dist_ops, t.dist_overhead_s);
    overhead("per-redistribute overhead", e.cost.redistributes, t.redistribute_overhead_s);
    overhead("per-collective wait", e.cost.blocking_collectives, t.collective_overhead_s);
    if (e.stages > 1)
      fmt::print("  {:<28} {:>14}  {}  (stage {} of {}, {} micro-batches x {} chunk(s): the slowest stage's compute "
                 "x (V m + p - 1) / (V m) = x {:.3f})\n",
                 "pipeline bubble", fmt::format("{:.1f} %", 100 * e.bubble), kModel, e.stage, e.stages, e.micros,
                 e.virtual_stages, t.pipeline_stretch);
    const double compute = t.matmul_s + t.memory_s + t.overhead_s;
    const std::string sharing =
        t.sharing > 1 ? fmt::format(" x {:.2g} (ranks sharing a node's compute, cpu_share)", t.sharing) : std::string();
    // Pipeline plans: the bubble stretches the micro-batches' compute (where ranks share compute
    // slots, the schedule run with that sharing), not the optimizer step.
    const std::string compute_str =
        t.pipeline_stretch > 1
            ? fmt::format("micro-batches {} x {:.3f} (pipeline bubble{}) + optimizer {}{}",
                          seconds_str(compute - t.optimizer_s), t.micro_stretch,
                          t.sharing > 1 ? ", the schedule run with the ranks' sharing" : "", seconds_str(t.optimizer_s),
                          sharing)
            : seconds_str(compute) + sharing;
    fmt::print("  {:<28} {:>14}  {}  (compute {} + communication {}, no overlap; {:.0f} tokens/s for the job: "
               "--batch x --seq x --accum per step)\n",
               "step time", seconds_str(t.total_s), kModel, compute_str, seconds_str(t.comm_s), tokens / t.total_s);
  }
  fmt::print("# estimated {} coordinate(s) in {:.3f} s\n", r.ranks.size(), r.elapsed_s);
}

nlohmann::ordered_json rank_json(const RankEstimate& e, const StepTime& t, const PlanMesh& mesh) {
  nlohmann::ordered_json j;
  j["rank"] = e.rank;
  j["coord"] = e.coord;
  j["mesh"] = mesh.names;
  j["local_params"] = e.local_params;
  j["param_bytes"] = e.param_bytes;
  j["fsdp_padding_bytes"] = e.fsdp_padding_bytes;
  j["grad_bytes"] = e.grad_bytes;
  j["optimizer_bytes"] = e.optimizer_bytes;
  j["master_bytes"] = e.master_bytes;
  j["persistent_bytes"] = e.persistent_bytes;
  j["peak_bytes"] = e.peak_bytes;
  j["activation_bytes"] = e.activation_bytes;
  j["comm"] = nlohmann::ordered_json::array();
  for (const CollectiveTime& c : t.collectives)
    j["comm"].push_back({{"kind", c.key.kind}, {"dims", c.key.dims}, {"calls", c.tally.calls}, {"bytes", c.tally.bytes},
                         {"group_size", c.tally.group_size}, {"link", c.inter_node ? "inter" : "intra"},
                         {"seconds", c.seconds}, {"bytes_source", kShapes}, {"seconds_source", kModel}});
  j["matmul_flops"] = e.cost.matmul_flops;
  j["optimizer_matmul_flops"] = e.optimizer_matmul_flops;
  j["memory_bound_bytes"] = e.cost.other_bytes;
  j["optimizer_bytes_moved"] = e.cost.optimizer_bytes;
  j["kernels"] = e.cost.kernels;
  j["dist_ops"] = e.cost.dist_ops;
  j["redistributes"] = e.cost.redistributes;
  j["blocking_collectives"] = e.cost.blocking_collectives;
  j["step_time"] = {{"matmul_s", t.matmul_s}, {"memory_s", t.memory_s}, {"optimizer_s", t.optimizer_s}, {"overhead_s", t.overhead_s},
                    {"kernel_overhead_s", t.kernel_overhead_s}, {"dist_overhead_s", t.dist_overhead_s},
                    {"redistribute_overhead_s", t.redistribute_overhead_s},
                    {"collective_overhead_s", t.collective_overhead_s},
                    {"sharing", t.sharing},  {"comm_s", t.comm_s},     {"total_s", t.total_s},
                    {"source", kModel}};
  if (e.stages > 1)
    j["pipeline"] = {{"stage", e.stage}, {"stages", e.stages}, {"micros", e.micros},
                     {"virtual_stages", e.virtual_stages}, {"bubble", e.bubble}, {"stretch", t.pipeline_stretch},
                     {"micro_batch_stretch", t.micro_stretch}, {"source", kModel}};
  j["memory_source"] = kShapes;
  return j;
}

// "world=8,64 tp=1,2" -> {"world": [8, 64], "tp": [1, 2]}
std::map<std::string, std::vector<int64_t>> parse_sweep(const std::string& spec) {
  std::map<std::string, std::vector<int64_t>> out;
  std::stringstream ss(spec);
  std::string item;
  while (ss >> item) {
    const auto eq = item.find('=');
    MT_CHECK(eq != std::string::npos && eq > 0, "meshtrain plan: --sweep '{}': expected NAME=V1,V2,... items, got '{}'",
             spec, item);
    const std::string name = item.substr(0, eq);
    MT_CHECK(name == "world" || name == "tp", "meshtrain plan: --sweep '{}': unknown axis '{}' (world, tp)", spec, name);
    std::stringstream vs(item.substr(eq + 1));
    std::string v;
    while (std::getline(vs, v, ',')) {
      int64_t x = 0;
      try {
        size_t used = 0;
        x = std::stoll(v, &used);
        MT_CHECK(used == v.size(), "");
      } catch (const std::exception&) {
        MT_FAIL("meshtrain plan: --sweep '{}': '{}' in {} is not an integer", spec, v, name);
      }
      MT_CHECK(x >= 1 && x <= kMaxPlanWorld, "meshtrain plan: --sweep '{}': {}={} is outside 1..{}", spec, name, x, kMaxPlanWorld);
      out[name].push_back(x);
    }
  }
  MT_CHECK(out.count("world"), "meshtrain plan: --sweep '{}' needs a world=... axis", spec);
  if (!out.count("tp")) out["tp"] = {0};  // 0: as the plan resolves it
  return out;
}

// The plan with tp ranks on its tp dim (0: the plan as it is) and its mesh for `world` ranks, or
// nothing with the reason. A plan without tp takes only tp 1; a plan whose only dim is tp only
// tp = world. Otherwise the plan takes tp on its tp dim (Plan::with_mesh_sizes: its lines stay
// where they are, so errors name the file's lines); a plan with a tp dim and one other dim gets
// the other dim as '*', larger meshes keep their other dims.
std::optional<std::pair<Plan, PlanMesh>> sweep_plan(const Plan& plan, int64_t world, int64_t tp, std::string& why) {
  Plan p = plan;
  const auto& dims = plan.mesh_dims();
  bool has_tp = false;
  for (const auto& d : dims) has_tp = has_tp || d.name == "tp";
  if (tp > 1 && !has_tp) {
    why = "the plan has no tp dim";
    return std::nullopt;
  }
  if (tp > 0 && has_tp && dims.size() == 1 && tp != world) {
    why = "the plan's only dim is tp (tp = world)";
    return std::nullopt;
  }
  if (tp > 0 && has_tp && dims.size() >= 2) {
    std::map<std::string, int64_t> sizes{{"tp", tp}};
    if (dims.size() == 2)
      for (const auto& d : dims)
        if (d.name != "tp") sizes[d.name] = -1;
    try {
      p = plan.with_mesh_sizes(sizes);
    } catch (const Error& e) {
      why = e.what();
      return std::nullopt;
    }
  }
  try {
    PlanMesh m = p.resolve_mesh(world);
    return std::make_pair(std::move(p), std::move(m));
  } catch (const Error& e) {
    why = e.what();
    return std::nullopt;
  }
}

int run_sweep(const Args& args, const std::string& config_name, const ModelConfig& cfg, const EstimateModel& em,
              const EstimateOptions& o, const HardwareProfile& hw) {
  const auto axes = parse_sweep(args.str("sweep"));
  const double budget = args.has("memory-gb") ? args.real("memory-gb") * 1e9 : hw.memory_bytes;
  MT_CHECK(budget > 0, "meshtrain plan: --memory-gb must be positive");
  std::vector<std::string> plans;
  {
    std::stringstream ps(args.required("plan"));
    std::string p;
    while (std::getline(ps, p, ',')) plans.push_back(p);
  }
  struct Row {
    std::string plan, mesh, why;
    int64_t world = 0;
    double peak = 0, step = 0, comm = 0;
    bool fits = false;
  };
  std::vector<Row> rows;
  int not_applicable = 0;  // (plan, world, tp) that make no mesh: no tp dim, tp not dividing, ...
  const auto t0 = Clock::now();
  for (const std::string& pp : plans) {
    Plan plan = load_plan(pp);
    for (int64_t w : axes.at("world"))
      for (int64_t tp : axes.at("tp")) {
        Row row{pp, "", "", w};
        auto pm = sweep_plan(plan, w, tp, row.why);
        if (!pm) {
          ++not_applicable;
          continue;
        }
        {
          const PlanMesh* m = &pm->second;
          row.mesh = m->str();
          try {
            // The first coordinate holds the largest shards (chunk semantics): its peak bounds the
            // others'. Pipeline plans: every stage (the other dims at 0), the largest peak and the
            // slowest stage's step.
            std::vector<std::vector<int64_t>> coords{std::vector<int64_t>(static_cast<size_t>(m->ndim()), 0)};
            if (pm->first.is_pipeline()) {
              int pd = 0;
              while (m->names[static_cast<size_t>(pd)] != pm->first.pipeline_dim()) ++pd;
              for (int64_t s = 1; s < m->shape[pd]; ++s) {
                coords.push_back(coords.front());
                coords.back()[static_cast<size_t>(pd)] = s;
              }
            }
            for (const auto& c : coords) {
              RankEstimate e = estimate_rank(em, pm->first, *m, c, o);
              StepTime t = roofline(e, *m, hw, o.precision);
              row.peak = std::max(row.peak, static_cast<double>(e.peak_bytes));
              if (t.total_s > row.step) {
                row.step = t.total_s;
                row.comm = t.comm_s;
              }
            }
            row.fits = row.peak <= budget;
            if (!row.fits) row.why = fmt::format("peak {} over the budget", human(row.peak));
          } catch (const Error& e) {
            row.why = e.what();
          }
        }
        rows.push_back(row);
      }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.step < b.step : false;
  });
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  const double tokens = static_cast<double>(o.batch * o.seq * o.accum);
  if (args.flag("json")) {
    nlohmann::ordered_json j;
    j["config"] = config_name;
    j["hardware"] = hw.name;
    j["memory_budget_bytes"] = budget;
    j["rows"] = nlohmann::ordered_json::array();
    for (const Row& r : rows)
      j["rows"].push_back({{"plan", r.plan}, {"world", r.world}, {"mesh", r.mesh}, {"fits", r.fits},
                           {"peak_bytes", r.peak}, {"step_s", r.step}, {"comm_s", r.comm}, {"why_not", r.why}});
    j["elapsed_s"] = elapsed;
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("# sweep for {} ({} parameters), batch {} x seq {} x accum {}, {}, hardware {}, memory budget {}\n",
             config_name, count_text(cfg.num_parameters()), o.batch, o.seq, o.accum,
             dtype_name(o.precision), hw.name, human(budget));
  fmt::print("# plans that fit, fastest first (peak and step time of rank 0, pipeline plans: the largest peak and the "
             "slowest stage of all stages; step time modelled, peak measured from shapes)\n");
  fmt::print("{:<28} {:>6} {:<20} {:>12} {:>12} {:>12} {:>14}\n", "plan", "world", "mesh", "peak", "step", "comm",
             "tokens/s");
  int shown = 0;
  for (const Row& r : rows) {
    if (!r.fits) continue;
    ++shown;
    fmt::print("{:<28} {:>6} {:<20} {:>12} {:>12} {:>12} {:>14.0f}\n", r.plan.substr(r.plan.rfind('/') + 1), r.world,
               r.mesh, human(r.peak), seconds_str(r.step), seconds_str(r.comm), tokens / r.step);
  }
  if (shown == 0) fmt::print("(none)\n");
  for (const Row& r : rows)
    if (!r.fits)
      fmt::print("# left out: {} world {} {}: {}\n", r.plan.substr(r.plan.rfind('/') + 1), r.world,
                 r.mesh.empty() ? "" : r.mesh, r.why.substr(0, r.why.find('\n')));
  fmt::print("# {} configurations estimated in {:.3f} s ({} combinations of plan, world and tp make no mesh)\n",
             rows.size(), elapsed, not_applicable);
  return 0;
}

}  // namespace

std::vector<FlagSpec> estimate_flags() {
  return {
      {"estimate", "print per-rank memory, communication and step time instead of the IR (docs/estimate.md)", "", true},
      {"batch", "--estimate: global batch per micro-batch", "8", false},
      {"seq", "tokens per sequence (--estimate; without it, checked against context-parallel splits)", "128", false},
      {"accum", "micro-batches per optimizer step (--estimate; without it, the pipeline schedule printed)", "1", false},
      {"precision", "--estimate: f32, bf16 or f16 (16-bit adds f32 master weights)", "bf16", false},
      {"accum-dtype", "--estimate: with --accum > 1 and 16-bit --precision, the dtype gradients are summed in: f32 "
                      "(as `meshtrain train`) or the precision", "f32", false},
      {"optimizer", "--estimate: adamw, adamw8bit or muon (its optimizer state, traffic and Newton-Schulz GEMMs; docs/estimate.md)", "adamw", false},
      {"recompute", "--estimate: none, full (every decoder layer recomputes in backward) or selective (each "
                    "layer's feed-forward block), as `meshtrain train --recompute`", "none", false},
      {"bucket-mb", "--estimate: gradient reducer bucket size in MiB", "25", false},
      {"hardware", "--estimate: h100-nvlink, h100-ib, h200, a100, or a profile JSON file", "h100-nvlink", false},
      {"json", "--estimate/--sweep: print JSON", "", true},
      {"sweep", "table of plans over 'world=8,64 tp=1,2' (--plan may list several, comma separated)", "", false},
      {"memory-gb", "--sweep: memory budget per rank in GB (default: the hardware profile's)", "", false},
      {"calibrate", "time a GEMM, a copy and the collectives here and write a hardware profile to --out", "", true},
      {"out", "--calibrate: the profile file to write", "", false},
  };
}

bool wants_estimate(const Args& args) {
  return args.flag("estimate") || args.has("sweep") || args.flag("calibrate");
}

int run_plan_estimate(const Args& args) {
  MT_CHECK(!args.flag("fsdp-layout"),
           "meshtrain plan: --fsdp-layout prints the plan's FSDP buffer layouts, not an estimate: give it without "
           "--estimate, --sweep and --calibrate");
  MT_CHECK(!args.has("memory-gb") || args.has("sweep"), "meshtrain plan: --memory-gb is the budget of --sweep, which is not given");
  if (args.flag("calibrate")) {
    check_output_file(args.required("out"), "--out");  // before the measurements, not after them
    return run_calibrate(args.required("out"));
  }
  const std::string config_name = args.str("config");
  ModelConfig cfg = resolve_config(config_name);
  apply_moe_loss_flags(args, cfg, "plan");
  const EstimateOptions o = options_from(args);
  const EstimateModel em = model_of(cfg, parse_recompute(o.recompute, "meshtrain plan --recompute"));
  const HardwareProfile hw = load_hardware_profile(args.str("hardware"));
  if (args.has("sweep")) return run_sweep(args, config_name, cfg, em, o, hw);
  const std::string plan_path = args.required("plan");
  const int64_t world = args.integer("world", 1, kMaxPlanWorld);
  Plan plan = load_plan(plan_path);
  PlanMesh mesh = plan.resolve_mesh(world);
  PlanRun r = estimate_plan(plan_path, plan, mesh, em, o, hw, 8);
  if (args.flag("json")) {
    nlohmann::ordered_json j;
    j["plan"] = plan_path;
    j["config"] = config_name;
    j["parameters"] = cfg.num_parameters();
    j["world"] = world;
    j["mesh"] = mesh.str();
    j["options"] = {{"batch", o.batch}, {"seq", o.seq}, {"accum", o.accum}, {"precision", dtype_name(o.precision)},
                    {"accum_dtype", dtype_name(o.accum_dtype)}, {"optimizer", o.optimizer}, {"recompute", o.recompute}, {"bucket_bytes", o.bucket_bytes}};
    j["hardware"] = nlohmann::ordered_json::parse(hardware_profile_json(hw));
    j["ranks"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < r.ranks.size(); ++i) j["ranks"].push_back(rank_json(r.ranks[i], r.times[i], mesh));
    j["elapsed_s"] = r.elapsed_s;
    fmt::print("{}\n", j.dump(2));
  } else {
    print_text(r, config_name, cfg, o, hw);
  }
  flush_stdout("plan");
  return 0;
}

}  // namespace mt::cli
