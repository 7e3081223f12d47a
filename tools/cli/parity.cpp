// `meshtrain parity`: model-parity testing of a plan against the single-device reference
// (docs/cli.md, "parity"). Under mpirun -np N, every rank runs K training steps of the model
// parallelized by --plan, exactly as `meshtrain train --plan` runs them (trainer.h), and the same
// K steps of its own un-parallelized copy of the model (same init, data and random numbers: each
// side keeps its own position in the default generator's stream, so neither shifts the other's
// dropout). Each rank then compares its shards with the same slices of its reference, so the
// report names the rank and placement that held the worst element. Or the reference comes from
// files: --reference DIR (a `train --checkpoint-dir`: its latest weights) or --reference FILE (a
// `grad --out` file: the gradients of one step).
// Exit codes: 0 every difference within --tol, 1 a parity failure, 2 no verdict (a usage error:
// flags, plan, reference; or any other error before the verdict).
#include <filesystem>
#include <map>
#include <fstream>

#include "mesh/communicator.h"
#include "mesh/world.h"
#include "models/hf_config.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "tensor/random.h"
#include "tools/cli/args.h"
#include "tools/cli/checks.h"
#include "tools/cli/commands.h"
#include "tools/cli/device.h"
#include "tools/cli/outputs.h"
#include "tools/cli/parallel.h"
#include "tools/cli/parity_modules.h"
#include "tools/cli/parity_report.h"
#include "tools/cli/train_state.h"
#include "tools/cli/trainer.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxParitySteps = 100000;

std::vector<FlagSpec> parity_flags() {
  std::vector<FlagSpec> flags = {
      {"plan", "the plan file to check, over the mpirun world (required)", "", false},
      {"config", "built-in model name, config.json, or a directory holding one", "llama-tiny", false},
      {"hf", "start from the weights of this Hugging Face checkpoint directory (instead of --config)", "", false},
      {"tokens", "text file, one sequence of T+1 comma-separated ids per line: the batch of every step", "", false},
      {"data", "llm.c token shard (.bin) or a quoted glob pattern of shards (as train's); default: the embedded corpus "
               "(with --batch, --seq)", "", false},
      {"steps", "training steps to compare", "3", false},
      {"precision", "f32, or bf16 (bf16 compute, f32 master weights, on both sides; loosen --tol)", "f32", false},
      {"device", "cpu, cuda (GPU local rank % GPUs) or cuda:N: both sides run there", "cpu", false},
      {"tol", "largest relative difference that passes for the loss of every step and the grad norm and gradients "
              "of step 1", "1e-5", false},
      {"drift-tol", "largest relative difference that passes for what follows an optimizer step: grad norms of "
                    "steps 2.., weights and gradients after the last step (AdamW magnifies rounding: docs/cli.md, "
                    "parity)", "5e-2", false},
      {"json", "also write the whole report as JSON to this file", "", false},
      {"reference", "compare with files instead of an in-process reference: a train --checkpoint-dir (its latest "
                    "weights) or a grad --out file (the gradients of step 1)", "", false},
      {"per-module", "also run one forward/backward from the reference's weights with hooks on every module and "
                     "name the first module whose output or input gradient differs", "", true},
  };
  for (auto& f : step_flags("4", "32")) flags.push_back(std::move(f));
  return flags;
}

// The reference the parallel run is compared with.
struct Reference {
  enum class Kind { kInProcess, kCheckpoint, kGradients } kind = Kind::kInProcess;
  std::string path;
  NamedTensors weights;  // kCheckpoint: after the last step
  NamedTensors grads;    // kGradients: of step 1
};

void check_same_model(const ModelConfig& ref, const ModelConfig& run, const std::string& path,
                      const std::string& run_source) {
  auto same = [&](const char* field, int64_t a, int64_t b) {
    MT_CHECK(a == b, "meshtrain parity: --reference {} is of another model: {} is {} there but {} in {}", path, field,
             a, b, run_source);
  };
  MT_CHECK(ref.model_type == run.model_type, "meshtrain parity: --reference {} is of another model: a {} model, not {} ({})",
           path, ref.model_type, run.model_type, run_source);
  same("vocab_size", ref.vocab_size, run.vocab_size);
  same("hidden_size", ref.hidden_size, run.hidden_size);
  same("num_hidden_layers", ref.num_hidden_layers, run.num_hidden_layers);
  same("num_attention_heads", ref.num_attention_heads, run.num_attention_heads);
  same("num_key_value_heads", ref.num_key_value_heads, run.num_key_value_heads);
  same("intermediate_size", ref.intermediate_size, run.intermediate_size);
}

// Every parameter of the model has a tensor of its shape in the reference (checked at start-up, on a
// model built on meta, so that the error is agreed on by all ranks).
void check_reference_tensors(const NamedTensors& tensors, const ModelConfig& cfg, const std::string& path) {
  std::shared_ptr<CausalLM> model;
  {
    InitDeviceGuard meta(Device::meta());
    model = build_causal_lm(cfg);
  }
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : tensors) shapes[name] = t.shape();
  for (const auto& [name, p] : model->named_parameters()) {
    auto it = shapes.find(name);
    MT_CHECK(it != shapes.end(), "meshtrain parity: --reference {} has no tensor '{}' (is it of another model?)", path,
             name);
    MT_CHECK(it->second == p.shape(), "meshtrain parity: --reference {}: tensor '{}' has shape {}, the model's has shape {}",
             path, name, it->second, p.shape());
  }
}

Reference load_reference(const Args& args, const ModelConfig& cfg, const std::string& cfg_source, int64_t steps) {
  Reference r;
  r.path = args.str("reference");
  if (r.path.empty()) return r;
  MT_CHECK(fs::exists(r.path), "meshtrain parity: --reference {} does not exist", r.path);
  MT_CHECK(!args.flag("per-module"), "meshtrain parity: --per-module needs the in-process reference (drop --reference {})",
           r.path);
  if (fs::is_directory(r.path)) {
    // A `train --checkpoint-dir`: the weights after its latest step, which must be step --steps
    // of the same run (batch, sequence, accumulation, precision, seed).
    r.kind = Reference::Kind::kCheckpoint;
    LoadedCheckpoint ck = load_latest_checkpoint(r.path);
    check_same_model(ck.config, cfg, r.path, cfg_source);
    MT_CHECK(ck.state.step == steps,
             "meshtrain parity: mismatched step counts: --reference {} holds the weights after step {} but --steps is {}",
             ck.path, ck.state.step, steps);
    auto same = [&](const char* flag, int64_t saved) {
      MT_CHECK(args.integer(flag) == saved,
               "meshtrain parity: --{} is {} but --reference {} was trained with --{} {}", flag, args.integer(flag),
               ck.path, flag, saved);
    };
    same("batch", ck.state.batch);
    same("seq", ck.state.seq);
    same("accum", ck.state.accum);
    same("seed", static_cast<int64_t>(ck.state.seed));
    MT_CHECK(args.str("precision") == ck.state.precision,
             "meshtrain parity: --precision is {} but --reference {} was trained with {}", args.str("precision"),
             ck.path, ck.state.precision);
    MT_CHECK(args.str("tokens").empty(),
             "meshtrain parity: --tokens does not go with --reference {} (train reads --data or the embedded corpus)",
             r.path);
    r.weights = std::move(ck.model);
    r.path = ck.path;
    check_reference_tensors(r.weights, cfg, r.path);
  } else {
    // A `grad --out` file: the gradients of one forward/backward of --hf on --tokens, without
    // dropout (grad runs the model in eval mode).
    r.kind = Reference::Kind::kGradients;
    MT_CHECK(steps == 1,
             "meshtrain parity: mismatched step counts: --reference {} holds the gradients of one step (meshtrain "
             "grad) but --steps is {}", r.path, steps);
    MT_CHECK(!args.str("hf").empty() && !args.str("tokens").empty(),
             "meshtrain parity: a gradient reference ({}) needs the --hf checkpoint and --tokens file it was made with",
             r.path);
    MT_CHECK(args.real("dropout") == 0,
             "meshtrain parity: --dropout {} with a gradient reference ({}): meshtrain grad runs without dropout",
             args.str("dropout"), r.path);
    MT_CHECK(args.integer("accum") == 1, "meshtrain parity: --accum {} with a gradient reference ({}): grad runs one "
             "forward/backward", args.integer("accum"), r.path);
    r.grads = read_safetensors(r.path).tensors;
    check_reference_tensors(r.grads, cfg, r.path);
  }
  return r;
}

// Everything read and checked before a model is built: any error here is a usage error, which
// the ranks agree on (start_up) so that each ends with exit code 2 and no rank is left waiting.
struct Setup {
  std::unique_ptr<Args> args;
  int64_t steps = 0;
  double tol = 0, drift_tol = 0;
  DType compute = DType::kF32;
  Device device = Device::cpu();
  std::unique_ptr<PlanContext> plan;
  HfCheckpoint start;  // --hf
  ModelConfig cfg;
  std::string cfg_source;
  Reference ref;
  TokenBatch fixed;             // --tokens
  TokenStream tokens;           // else
};

Setup prepare(int argc, char** argv) {
  Setup s;
  s.args = std::make_unique<Args>("parity", parity_flags(), argc, argv, 2);
  const Args& args = *s.args;
  validate_step_flags(args, "parity");
  s.steps = args.integer("steps", 1, kMaxParitySteps);
  s.tol = args.real("tol");
  MT_CHECK(s.tol >= 0, "meshtrain parity: --tol {} must be >= 0", args.str("tol"));
  s.drift_tol = args.real("drift-tol");
  MT_CHECK(s.drift_tol >= 0, "meshtrain parity: --drift-tol {} must be >= 0", args.str("drift-tol"));
  s.device = resolve_device("parity", args.str("device"));
  s.compute = parse_precision(args.str("precision"), "parity");
  const std::string plan_path = args.required("plan");
  MT_CHECK(!(args.has("config") && args.has("hf")), "meshtrain parity: give --config or --hf, not both");
  MT_CHECK(!(args.has("tokens") && args.has("data")), "meshtrain parity: give --tokens or --data, not both");
  for (const char* flag : {"batch", "seq"})
    MT_CHECK(!(args.has("tokens") && args.has(flag)),
             "meshtrain parity: --{} does not go with --tokens {}: the token file's lines are the batch (one sequence "
             "of T+1 ids per line)", flag, args.str("tokens"));
  MT_CHECK(!args.has("data") || !args.str("data").empty(),
           "meshtrain parity: --data is empty; give a token shard (or a pattern of shards), or leave --data out to "
           "train on the embedded corpus");
  check_output_file(args.str("json"), "--json");
  std::vector<std::pair<std::string, std::string>> inputs = {
      {"--hf", args.str("hf")}, {"--tokens", args.str("tokens")}, {"--reference", args.str("reference")},
      {"--config", args.str("config")}};
  for (const std::string& f : data_files(args.str("data"), "--data")) inputs.emplace_back("--data", f);
  check_not_input(args.str("json"), "--json", inputs);
  s.plan = std::make_unique<PlanContext>(load_plan_context(plan_path));
  const std::string hf = args.str("hf");
  if (!hf.empty()) {
    s.start = read_model_checkpoint(hf);
    s.cfg = s.start.config;
  } else {
    s.cfg = resolve_config(args.str("config"));
  }
  s.cfg.attention_dropout = s.cfg.residual_dropout = args.real("dropout");
  apply_moe_loss_flags(args, s.cfg, "parity");
  s.cfg.validate();
  s.cfg_source = hf.empty() ? args.str("config") : hf;
  validate_train_flags(args, s.cfg, s.cfg_source, "parity");
  check_model_fits_memory(s.cfg, ModelUse::kTraining, "parity", s.cfg_source);
  s.ref = load_reference(args, s.cfg, s.cfg_source, s.steps);
  if (s.ref.kind == Reference::Kind::kGradients && s.cfg.is_moe()) {
    // `grad` computes the cross-entropy alone, dropless, whatever the config says: so does the
    // parallel side against its file. Flags asking otherwise are refused (as --dropout is); the
    // config's own settings are switched off with a note (a checkpoint exported from a run with
    // router losses reported a false FAIL until 2026-12-08).
    for (const char* flag : {"moe-aux-loss", "moe-z-loss", "moe-capacity-factor"})
      MT_CHECK(!args.has(flag) || args.real(flag) == 0,
               "meshtrain parity: --{} {} with a gradient reference ({}): meshtrain grad runs without router losses "
               "and capacity", flag, args.str(flag), s.ref.path);
    const bool on = uses_balance_loss(s.cfg) || uses_z_loss(s.cfg) || s.cfg.moe_capacity_factor > 0;
    if (on && s.plan->is_root())
      fmt::print(stderr, "parity: note: {}'s router losses and capacity factor are off against the gradient reference "
                 "{} (meshtrain grad runs without them)\n", s.cfg_source, s.ref.path);
    s.cfg.router_aux_loss_coef = s.cfg.router_z_loss_coef = s.cfg.moe_capacity_factor = 0;
    s.cfg.output_router_logits = false;
  }
  const bool fixed = !args.str("tokens").empty();
  if (fixed)
    s.fixed = read_token_batch(args.str("tokens"), s.cfg, s.cfg_source);
  else
    s.tokens = run_tokens(args.str("data"), s.cfg);
  // The plan against the model (on meta): what it refuses is a usage error too, agreed on below.
  if (fixed)
    check_plan_on_meta(*s.plan, s.cfg, s.fixed.inputs.size(0), s.fixed.inputs.size(1), "parity", args.str("tokens"),
                       args.integer("accum"));
  else
    check_plan_on_meta(*s.plan, s.cfg, args.integer("batch"), args.integer("seq"), "parity", "", args.integer("accum"));
  return s;
}

// prepare() on every rank; an error on any rank ends every rank with exit code 2.
Setup start_up(int argc, char** argv) {
  Setup s;
  agree_on_start("parity", 2, [&] { s = prepare(argc, argv); });
  return s;
}

int parity_main(int argc, char** argv) {
  Setup s = start_up(argc, argv);
  const Args& args = *s.args;
  const PlanContext& plan = *s.plan;
  quiet_non_root(plan);
  const int64_t steps = s.steps;
  const std::string hf = args.str("hf");
  const ModelConfig& cfg = s.cfg;
  HfCheckpoint& start = s.start;
  const Reference& ref = s.ref;
  const bool in_process = ref.kind == Reference::Kind::kInProcess;

  // Data: a fixed batch (--tokens), or the train loader over --data / the embedded corpus (one per side).
  std::function<TokenBatch()> par_next, ref_next;
  std::unique_ptr<DataLoader> par_loader, ref_loader;
  if (!args.str("tokens").empty()) {
    par_next = ref_next = [&s] { return s.fixed; };
  } else {
    const int64_t b = args.integer("batch"), t = args.integer("seq"), accum = args.integer("accum");
    par_loader = std::make_unique<DataLoader>(s.tokens, b, t, 0, 1, accum);
    ref_loader = std::make_unique<DataLoader>(s.tokens, b, t, 0, 1, accum);
    par_next = [&] { return par_loader->next(); };
    ref_next = [&] { return ref_loader->next(); };
  }
  if (!s.device.is_cpu()) {  // batches move to the device, as in train
    auto on_device = [&s](std::function<TokenBatch()> next) {
      return std::function<TokenBatch()>([&s, next] {
        TokenBatch b = next();
        return TokenBatch{b.inputs.to(s.device), b.targets.to(s.device)};
      });
    };
    par_next = on_device(par_next);
    ref_next = on_device(ref_next);
  }

  // The two models, each seeded as `train` seeds its model; each side's generator offset kept.
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed"));
  std::shared_ptr<CausalLM> ref_model;
  uint64_t ref_offset = 0;
  if (in_process) {
    manual_seed(seed);
    HfCheckpoint copy;
    for (const auto& [name, t] : start.tensors) copy.tensors.emplace_back(name, t.clone());
    ref_model = build_run_model(cfg, hf.empty() ? nullptr : &copy, false);
    ref_offset = default_generator().offset();
  }
  manual_seed(seed);
  std::shared_ptr<CausalLM> model = build_run_model(cfg, hf.empty() ? nullptr : &start, true);
  Parallelized par = parallelize_run(*model, *s.plan);
  if (!s.device.is_cpu()) {  // built and sharded on the host as in train, then moved (the same bytes)
    model->to(s.device);
    if (ref_model) ref_model->to(s.device);
  }
  Trainer trainer(*model, args, "parity", steps, s.compute, &plan, &par);
  std::unique_ptr<Trainer> ref_trainer;
  if (in_process) ref_trainer = std::make_unique<Trainer>(*ref_model, args, "parity", steps, s.compute, nullptr, nullptr);
  trainer.master().master_to_model();
  if (ref_trainer) ref_trainer->master().master_to_model();
  uint64_t par_offset = default_generator().offset();

  // Pipeline plans: every stage's tensors, gathered on every rank, are compared.
  auto mine = [&plan](const NamedTensors& t) { return plan.is_pipeline() ? gather_stages(plan, t) : t; };
  ParityReport report;
  report.plan = plan.path;
  report.world = plan.world;
  report.tol = s.tol;
  report.drift_tol = s.drift_tol;
  report.reference = in_process ? "in-process, on every rank" : ref.path;
  for (int64_t step = 0; step < steps; ++step) {
    const bool last = step + 1 == steps;
    StepRow row;
    row.step = step + 1;
    default_generator().set_offset(par_offset);
    StepResult r = trainer.gradients(step, par_next);
    par_offset = default_generator().offset();
    row.loss = r.loss;
    if (in_process) {
      default_generator().set_offset(ref_offset);
      StepResult rr = ref_trainer->gradients(step, ref_next);
      ref_offset = default_generator().offset();
      row.ref_loss = rr.loss;
    }
    if (in_process)
      for (auto& o : one_sided_gradients(trainer.master().master_params(), ref_trainer->master().master_params(), plan))
        report.one_sided.push_back(fmt::format("step {}: {}", step + 1, o));
    // Gradients before clipping (what grad writes, and what the optimizer is given after the
    // clip): of step 1, where both sides start from the same weights, and of the last step.
    if (in_process && (step == 0 || last)) {
      auto diffs = compare_tensors(mine(gradients_of(trainer.master().master_params())),
                                   gradients_of(ref_trainer->master().master_params()), plan, "in-process");
      (step == 0 ? report.first_grads : report.grads) = std::move(diffs);
    }
    if (ref.kind == Reference::Kind::kGradients)
      report.first_grads = compare_tensors(mine(gradients_of(trainer.master().master_params())), ref.grads, plan, ref.path);
    row.grad_norm = trainer.clip(step, row.loss);
    if (in_process) row.ref_grad_norm = ref_trainer->clip(step, *row.ref_loss);
    trainer.apply();
    if (in_process) ref_trainer->apply();
    report.steps.push_back(row);
  }
  if (in_process)
    report.weights = compare_tensors(mine(trainer.master().master_params()), ref_trainer->master().master_params(), plan,
                                     "in-process");
  if (ref.kind == Reference::Kind::kCheckpoint)
    report.weights = compare_tensors(mine(trainer.master().master_params()), ref.weights, plan, ref.path);

  if (args.flag("per-module")) {
    // One more forward/backward from the reference's weights on both sides, with hooks, each side
    // from the parallel run's generator position.
    default_generator().set_offset(par_offset);
    report.per_module = per_module_check(*model, trainer, *ref_model, *ref_trainer, par_next, ref_next, steps - 1,
                                         plan, s.tol);
  }

  // The file first: an unwritable --json is "no verdict" (2), with no verdict printed before it.
  if (!args.str("json").empty() && plan.is_root()) {
    try {
      write_file_atomically(args.str("json"), [&](std::ostream& f) { f << report_json(report).dump(2) << "\n"; });
    } catch (const Error& e) {
      throw ExitError(fmt::format("meshtrain parity: --json: {}", e.what()), 2, false);
    }
  }
  print_report(report);
  flush_stdout("parity");
  return report.pass() ? 0 : 1;
}

}  // namespace

int run_parity(int argc, char** argv) {
  try {
    return parity_main(argc, argv);
  } catch (const ExitError&) {
    throw;
  } catch (const std::exception& e) {
    // An error after start-up (seen by some ranks only, perhaps): no verdict, exit code 2 for the
    // whole job at once.
    throw ExitError(e.what(), 2, false);
  }
}

}  // namespace mt::cli
