// `meshtrain train`: trains a causal LM (llama-tiny on the embedded corpus by default) with AdamW,
// warmup + cosine learning rate, gradient clipping, gradient accumulation, f32 or bf16 (with f32
// master weights), checkpoints and exact resume. One line per step on stdout plus JSONL metrics.
// With --plan P under mpirun the model is parallelized by the plan (docs/cli.md, "--plan"): every
// rank reads the same global batch and keeps its shard of it, gradients are reduced by the fused
// GradReducer, AdamW and clipping work on the shards, rank 0 prints and logs, and every rank writes
// its own chunks of a sharded checkpoint, asynchronously (tools/cli/sharded_save.h; resumes under any
// plan, or none). The step itself (its flags, the model
// construction, gradients / clip / apply) is tools/cli/trainer.h, shared with `meshtrain parity`.
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "checkpoint/shard_reader.h"
#include "mesh/dtensor.h"
#include "models/corpus.h"
#include "models/data.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "models/json_io.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "optim/master_weights.h"
#include "plan/fsdp_buffer.h"
#include "plan/grad_reducer.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/profiler.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "tools/cli/args.h"
#include "tools/cli/checks.h"
#include "tools/cli/commands.h"
#include "tools/cli/device.h"
#include "tools/cli/outputs.h"
#include "tools/cli/parallel.h"
#include "tools/cli/sharded_save.h"
#include "tools/cli/stop_signals.h"
#include "tools/cli/train_resume.h"
#include "tools/cli/train_samples.h"
#include "tools/cli/train_state.h"
#include "tools/cli/trainer.h"

namespace mt::cli {
namespace {

// The step flags (trainer.h: batch, seq, accum, AdamW, schedule, clipping, dropout, seed, gradient
// reduction) plus what only a training run has.
std::vector<FlagSpec> train_flags() {
  std::vector<FlagSpec> flags = {
      {"config", "built-in model name, config.json, or a directory holding one", "llama-tiny", false},
      {"hf", "start from the weights of this Hugging Face checkpoint directory", "", false},
      {"data", "llm.c token shard (.bin), or a quoted glob pattern of shards ('dir/train_*.bin': mapped, read in name "
               "order as one stream); default: the embedded corpus, byte-tokenized", "", false},
      {"val-data", "llm.c token shard or pattern (as --data) for a validation loss (cross-entropy, no dropout) on its "
                   "first --val-batches batches of --batch x --seq; default: none", "", false},
      {"val-every", "validation loss every N steps and at the end (0: at the end only)", "0", false},
      {"val-batches", "batches of --batch x --seq in the validation loss", "4", false},
      {"steps", "optimizer steps in the whole run (sets the LR schedule)", "300", false},
      {"stop-at", "stop after this many steps (0, or past --steps: run all --steps); with --resume this continues", "0", false},
      {"precision", "f32, or bf16 (bf16 compute, f32 master weights)", "f32", false},
      {"device", "cpu, cuda (under mpirun: GPU local rank % GPUs) or cuda:N", "cpu", false},
      {"checkpoint-dir", "directory for checkpoints (empty: none)", "", false},
      {"checkpoint-every", "save every N steps (0: only at the end)", "0", false},
      {"keep", "keep only the newest N checkpoints in --checkpoint-dir (0: all)", "0", false},
      {"sync-save", "--plan: write each sharded checkpoint before training goes on (default: in the background, "
                    "committed at the next save or the end; docs/checkpoints.md)", "", true},
      {"gather-save", "--plan: gather full tensors and write the single-process layout on rank 0 instead of a "
                      "sharded checkpoint (the former behaviour; for comparison)", "", true},
      {"resume", "continue from the latest checkpoint in --checkpoint-dir", "", true},
      {"overwrite", "replace checkpoints in --checkpoint-dir that this run did not write (docs/checkpoints.md)", "", true},
      {"allow-changes", "--resume with settings that differ from the checkpoint's (learning rates, warmup, weight "
                        "decay, clipping, dropout, optimizer, MoE losses, seed, data): each change is printed "
                        "instead of refused (docs/cli.md)", "", true},
      {"metrics", "JSONL metrics file (empty: none)", "metrics.jsonl", false},
      {"log-every", "print every N steps", "1", false},
      {"plan", "parallelize with this plan file over the mpirun world (docs/cli.md, --plan)", "", false},
      {"profile", "record every op, module and collective of the steps to this Chrome trace file and print the "
                  "top ops and modules (docs/profiler.md; under --plan rank r > 0 writes FILE.rank<r>)", "", false},
  };
  for (auto& f : step_flags("8", "128")) flags.push_back(std::move(f));
  for (auto& f : sample_flags()) flags.push_back(std::move(f));
  return flags;
}

// Training FLOPs per token: 6 per weight used in a matmul plus the attention scores (PaLM, app. B).
// The matmul weights are counted from the shapes: the projections, the routed experts and router of
// an MoE layer, lm_head (a tied one too); not the embedding lookup, the norms' gains or biases
// (which the parameter count held until 2026-12-07, 0.15% of llama-tiny).
double flops_per_token(const ModelConfig& c, int64_t seq) {
  const auto h = static_cast<double>(c.hidden_size), d = static_cast<double>(c.resolved_head_dim());
  const double q = static_cast<double>(c.num_attention_heads) * d, kv = static_cast<double>(c.num_key_value_heads) * d;
  const double attn_proj = h * q + 2 * h * kv + q * h;
  const double mlp = 3 * h * static_cast<double>(c.intermediate_size);
  const double ffn = c.is_moe() ? mlp * static_cast<double>(c.num_experts_per_tok) +
                                      h * static_cast<double>(c.num_local_experts)
                                : mlp;
  const double n = static_cast<double>(c.num_hidden_layers) * (attn_proj + ffn) + static_cast<double>(c.vocab_size) * h;
  const double attn = 12.0 * static_cast<double>(c.num_hidden_layers * c.num_attention_heads * c.resolved_head_dim() * seq);
  return 6.0 * n + attn;
}

// Hugging Face config fields that change training and that meshtrain does not apply, announced
// (not refused: the same checkpoint evaluates and generates exactly as in HF, where they act in
// training only). `config_json`: the file the run's model comes from.
// `config_json` may be a directory holding config.json, as --config may (resolve_config).
void note_unapplied_fields(std::string config_json) {
  std::error_code ec;
  if (!config_json.empty() && std::filesystem::is_directory(config_json, ec))
    config_json = (std::filesystem::path(config_json) / "config.json").string();
  if (config_json.empty() || !std::filesystem::is_regular_file(config_json, ec)) return;
  const nlohmann::json j = read_json_file(config_json, "config.json");
  if (!j.is_object()) return;
  const auto it = j.find("router_jitter_noise");
  if (it != j.end() && it->is_number() && it->get<double>() > 0)
    fmt::print("note: {}: router_jitter_noise {} is not applied: meshtrain trains the MoE router without jitter "
               "(Hugging Face multiplies the router's input by uniform(1 - j, 1 + j) noise in training)\n",
               config_json, it->get<double>());
}

// Each tensor's local shard (a DTensor's), or the tensor: what this rank holds.
NamedTensors local_tensors(const NamedTensors& tensors) {
  NamedTensors out;
  for (const auto& [name, t] : tensors) out.emplace_back(name, t.is_distributed() ? to_local(t).detach() : t.detach());
  return out;
}

// The names of `t`, in order.
std::vector<std::string> names_of(const NamedTensors& t) {
  std::vector<std::string> out;
  for (const auto& [name, x] : t) out.push_back(name);
  return out;
}

// Where rank `rank` writes its --profile trace: FILE on rank 0, FILE.rank<r> on the others; none
// on the others when FILE is written in place (a device or pipe, anything under /dev or /proc:
// /dev/null, /dev/stdout even when a rank's stdout is a file), which rank 0 writes
// (`/dev/null.rank1` was created as a file, or refused after the run, until 2026-12-08).
std::string rank_trace_path(const std::string& file, int rank) {
  if (rank == 0) return file;
  return written_in_place(file) ? "" : fmt::format("{}.rank{}", file, rank);
}

// The routing figures of every MoE layer of the model: under a pipeline plan each stage counts
// only its own layers (expert_token_range), so the fewest and most rows and the dropped rows are
// combined over the pipeline dim (two collectives on it, every rank of the dim, every step;
// until 2026-12-07 the step line gave rank 0's stage alone). `r` itself without a pipeline.
std::optional<ExpertTokenRange> over_stages(const std::optional<ExpertTokenRange>& r, const PlanContext* plan) {
  if (!plan || !plan->is_pipeline()) return r;
  Communicator pp = plan->world_mesh->comm(plan->full_plan.pipeline_dim());
  // [-min, max]: one kMax; a stage without MoE layers offers nothing (-INT64_MAX, -1).
  Tensor ends = from_vector<int64_t>({r ? -r->min : -std::numeric_limits<int64_t>::max(), r ? r->max : -1}, Shape{2});
  Tensor dropped = from_vector<int64_t>({r ? r->dropped : 0}, Shape{1});
  pp.all_reduce(ends, CommReduceOp::kMax);
  pp.all_reduce(dropped, CommReduceOp::kSum);
  const std::vector<int64_t> e = ends.to_vector<int64_t>();
  if (e[1] < 0) return std::nullopt;
  return ExpertTokenRange{-e[0], e[1], dropped.to_vector<int64_t>()[0]};
}

}  // namespace

int run_train(int argc, char** argv) {
  Args args("train", train_flags(), argc, argv, 2);
  validate_train_flags(args);  // every flag in its range before anything is read
  const int64_t batch = args.integer("batch"), seq = args.integer("seq"), accum = args.integer("accum");
  const int64_t steps = args.integer("steps"), log_every = std::max<int64_t>(1, args.integer("log-every"));
  const int64_t stop_at = args.integer("stop-at") > 0 ? std::min(args.integer("stop-at"), steps) : steps;
  const DType compute = parse_precision(args.str("precision"), "train");
  const std::string ckpt_dir = args.str("checkpoint-dir");
  const bool resume = args.flag("resume");
  MT_CHECK(!resume || !ckpt_dir.empty(), "meshtrain train: --resume needs --checkpoint-dir");
  MT_CHECK(!(args.has("hf") && args.has("config")),
           "meshtrain train: give --config or --hf, not both (--hf {} brings its own config.json)", args.str("hf"));
  MT_CHECK(args.integer("keep") >= 0, "meshtrain train: --keep must be >= 0, got {}", args.integer("keep"));
  // Every output path and the checkpoint history rules, on every rank, before anything is built.
  const Overwrite overwrite = args.flag("overwrite") ? Overwrite::kAllow : Overwrite::kRefuse;
  check_output_file(args.str("metrics"), "--metrics");
  std::vector<std::pair<std::string, std::string>> inputs = {
      {"--hf", args.str("hf")}, {"--config", args.str("config")}, {"--checkpoint-dir", ckpt_dir}};
  for (const char* flag : {"--data", "--val-data"})
    for (const std::string& f : data_files(args.str(flag + 2), flag)) inputs.emplace_back(flag, f);
  check_not_input(args.str("metrics"), "--metrics", inputs);
  // A --profile trace file (FILE here; FILE.rank<r> of rank r > 0 in the start-up block below).
  auto check_trace = [&](const std::string& path, const std::string& flag) {
    check_output_file(path, flag);
    check_not_input(path, flag, inputs);
    MT_CHECK(!same_path(args.str("metrics"), path),
             "meshtrain train: --metrics {} and {} {} are the same file: give each its own file", args.str("metrics"),
             flag, path);
  };
  check_trace(args.str("profile"), "--profile");
  if (!ckpt_dir.empty())
    check_checkpoint_history({ckpt_dir, resume ? RunKind::kResume : RunKind::kFresh, overwrite, stop_at,
                              args.integer("checkpoint-every")});
  std::unique_ptr<PlanContext> plan;
  if (!args.str("plan").empty()) {
    // A plan file's errors (the same on every rank) end each rank with exit 1, without MPI_Abort.
    agree_on_start("train", 1, [&] { plan = std::make_unique<PlanContext>(load_plan_context(args.str("plan"))); });
    quiet_non_root(*plan);
  }
  const bool root = !plan || plan->is_root();
  // One run per checkpoint directory: the root, which commits every step directory, holds its lock
  // until the run ends (an error on the root ends the whole job).
  std::optional<CheckpointDirLock> ckpt_lock;
  if (!ckpt_dir.empty() && root) ckpt_lock.emplace(ckpt_dir);
  const Device device = resolve_device("train", args.str("device"));
  // The MFU reference first, before the model exists: its GEMM (16 MiB on the CPU, 192 MiB for an
  // unknown GPU's 4096^3) must not count in the steps' peak memory (nothing else of size is
  // allocated yet).
  const double peak = peak_flops(device, compute);
  reset_memory_peak(device);

  // Model and weights.
  LoadedCheckpoint loaded;
  HfCheckpoint start_weights;  // --hf
  ModelConfig cfg;
  uint64_t seed = static_cast<uint64_t>(args.integer("seed"));
  const auto load_t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, std::string>> settings;
  std::string cfg_source;
  std::optional<TrainSampler> sampler;
  // The start-up reads and checks, before any collective: under a plan every rank runs them and the
  // ranks agree (agree_on_start), so that a file or setting every rank finds bad (a missing --data
  // or --hf, a resume that differs) ends each rank with exit 1 and its error, without MPI_Abort.
  auto start_up = [&] {
    // Rank r > 0 writes its trace to FILE.rank<r>: checked as FILE is above (it could name the
    // --data shard or the metrics file, or be a directory, found only after the run until
    // 2026-12-08). Each rank checks its own.
    const std::string mine =
        plan && plan->rank > 0 && !args.str("profile").empty() ? rank_trace_path(args.str("profile"), plan->rank) : "";
    if (!mine.empty()) check_trace(mine, fmt::format("--profile (rank {}'s trace)", plan->rank));
    // The settings a checkpoint records, read once (the --data fingerprint reads the file's ends).
    settings = resume_settings(args);
    if (!args.str("val-data").empty())
      for (const std::string& f : data_files(args.str("val-data"), "--val-data")) read_token_file_header(f);
    if (resume) {
      // A sharded checkpoint under a plan: each rank reads its own boxes below, after parallelize().
      loaded = load_latest_checkpoint(ckpt_dir, /*full=*/args.str("plan").empty());
      check_resume_matches(loaded.state, args);
      check_resume_settings(loaded.state, settings, args, loaded.path, loaded.config);
      check_resume_model(loaded.config, args, loaded.path);
      cfg = loaded.config;
      seed = loaded.state.seed;
    } else if (!args.str("hf").empty()) {
      start_weights = read_model_checkpoint(args.str("hf"));
      cfg = start_weights.config;
      note_unapplied_fields(args.str("hf"));
    } else {
      cfg = resolve_config(args.str("config"));
      if (!is_builtin_config(args.str("config"))) note_unapplied_fields(args.str("config"));
    }
    cfg.attention_dropout = cfg.residual_dropout = args.real("dropout");
    apply_moe_loss_flags(args, cfg, "train");
    cfg.validate();
    cfg_source = resume ? loaded.path : !args.str("hf").empty() ? args.str("hf") : args.str("config");
    validate_train_flags(args, cfg, cfg_source);
    check_model_fits_memory(cfg, ModelUse::kTraining, "train", cfg_source);
    sampler = TrainSampler::from_args(args, cfg, args.str("hf"), plan != nullptr, seed);
    // The plan against the model, on meta (lowering, the input split, a forward), before the init
    // is seeded (it builds meta models).
    if (plan) check_plan_on_meta(*plan, cfg, batch, seq, "train", "", accum);
  };
  if (plan) agree_on_start("train", 1, start_up);
  else start_up();
  manual_seed(seed);
  HfCheckpoint start_from;  // --resume or --hf: the model starts from these weights
  const bool sharded_resume = resume && loaded.sharded && plan;
  // --hf names the starting weights of a fresh run; a resumed run's weights are the checkpoint's.
  const bool loaded_weights = resume ? !sharded_resume : !args.str("hf").empty();
  if (loaded_weights) {
    start_from.tensors = resume ? std::move(loaded.model) : std::move(start_weights.tensors);
    start_from.source = resume ? loaded.path : start_weights.source;
    if (!resume) start_from.file_of = std::move(start_weights.file_of);
    // A NaN or inf in the starting weights: refused here, naming the tensor, rather than as a
    // non-finite loss at the first step.
    if (auto bad = first_non_finite(start_from.tensors))
      MT_FAIL("meshtrain train: {}: weight '{}' holds {} at element {}: refusing to train from non-finite weights",
              resume ? loaded.path : args.str("hf"), bad->name, value_text(bad->value), bad->index);
  }
  std::shared_ptr<CausalLM> model = build_run_model(cfg, loaded_weights ? &start_from : nullptr, plan != nullptr);
  // --plan: loaded weights are sliced to the shards, meta ones initialized shard-wise (equal to the
  // single-device init). The trainer's reducer hooks every parameter.
  std::unique_ptr<Parallelized> par;
  if (plan) {
    std::optional<SkipShardInitGuard> no_init;  // sharded resume: every shard is read below
    if (sharded_resume) no_init.emplace();
    par = std::make_unique<Parallelized>(parallelize_run(*model, *plan));
  }
  std::unique_ptr<ShardedCheckpointReader> reader;
  double read_s = 0;  // sharded resume: seconds spent reading this rank's boxes
  if (sharded_resume) {
    const auto r0 = std::chrono::steady_clock::now();
    // Each rank reads only the boxes of its shards (docs/checkpoints.md, "Sharded checkpoints").
    reader = std::make_unique<ShardedCheckpointReader>(loaded.path);
    const NamedTensors params = model->named_parameters();
    // A pipeline stage reads only its own modules' tensors (docs/pipeline.md, "Checkpoints"); a
    // tensor that no stage holds is an error as without stages (collective over the stages).
    const std::set<std::string> whole = keys_over_stages(*plan, names_of(params));
    const NamedTensors values = reader->load_like("model", params, &whole);
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor dst = params[i].second.is_distributed() ? to_local(params[i].second).detach() : params[i].second.detach();
      dst.copy_(values[i].second.is_distributed() ? to_local(values[i].second) : values[i].second);
    }
    read_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
  }
  // Built, loaded and sharded on the host exactly as a CPU run; then moved (the same bytes).
  if (!device.is_cpu()) model->to(device);
  // The loaded weights are the model's now: their copy is let go, not held for the whole run (4
  // bytes per parameter of f32 weights until 2026-12-07).
  start_from = HfCheckpoint{};

  // Data.
  double entropy = 0.0;  // of the tokens, for the start-up line
  TokenStream tokens = run_tokens(args.str("data"), cfg, "--data", &entropy);
  DataLoader loader = [&] {
    try {
      return DataLoader(tokens, batch, seq, 0, 1, accum);
    } catch (const std::exception& e) {
      MT_FAIL("--data {}: {}", args.str("data").empty() ? "(the embedded corpus)" : args.str("data"), e.what());
    }
  }();
  // --val-data: the same first --val-batches global batches at every validation.
  std::vector<TokenBatch> val_batches;
  const int64_t val_every = args.integer("val-every");
  if (!args.str("val-data").empty()) {
    const int64_t n = args.integer("val-batches");
    TokenStream val_tokens = run_tokens(args.str("val-data"), cfg, "--val-data");
    const int64_t need = n * batch * seq + 1;  // no overflow: validate_train_flags checked it
    MT_CHECK(static_cast<int64_t>(val_tokens.size()) >= need,
             "meshtrain train: --val-data {} holds {} tokens, fewer than the {} that --val-batches {} x --batch {} x "
             "--seq {} (+1 for the last target) need", args.str("val-data"), val_tokens.size(), need, n, batch, seq);
    DataLoader val_loader(std::move(val_tokens), batch, seq);
    for (int64_t i = 0; i < n; ++i) {
      TokenBatch b = val_loader.next();
      if (!device.is_cpu()) b = {b.inputs.to(device), b.targets.to(device)};
      val_batches.push_back(std::move(b));
    }
  }

  Trainer trainer(*model, args, "train", steps, compute, plan.get(), par.get());
  MasterWeights& master = trainer.master();
  Optimizer& opt = trainer.optimizer();
  int64_t start = 0;
  if (resume && loaded.state.warmup_steps >= 0) {
    // The schedule's warmup is the run's, not recomputed from a new --steps (which would restart a
    // finished warmup), unless --warmup itself was changed (--allow-changes).
    const std::string* warmup = loaded.state.setting("warmup");
    if (!warmup || *warmup == args.str("warmup")) trainer.keep_warmup(loaded.state.warmup_steps);
  }
  if (resume && min_lr_as_recorded(loaded.state, args)) {
    // The final rate the checkpoint's run used: recorded exactly (the shortest round-trip form);
    // a checkpoint without settings was written when the default was 3e-4.
    const std::string* min_lr = loaded.state.setting("min-lr");
    const std::string recorded = min_lr ? *min_lr : "3e-4";
    char* end = nullptr;
    const double v = std::strtod(recorded.c_str(), &end);
    MT_CHECK(!recorded.empty() && end == recorded.c_str() + recorded.size() && std::isfinite(v) && v >= 0 &&
                 v <= args.real("lr"),
             "--resume: {}/trainer_state.json: the recorded --min-lr '{}' is not a rate in [0, --lr {}]; give "
             "--min-lr", loaded.path, recorded.substr(0, 80), args.str("lr"));
    trainer.keep_min_lr(v);
    for (auto& [k, value] : settings)
      if (k == "min-lr") value = recorded;
  }
  if (resume) {
    // Checkpoints hold full tensors: with --plan, each rank takes its shards of the moments.
    // Sharded checkpoints: this rank's boxes of the moments only.
    const auto r0 = std::chrono::steady_clock::now();
    std::set<std::string> whole_state;
    if (reader) whole_state = keys_over_stages(*plan, names_of(opt.state_dict()));
    opt.load_state_dict(reader ? reader->load_like("optimizer", opt.state_dict(), &whole_state)
                        : plan ? shard_like(loaded.optimizer, opt.state_dict())
                               : loaded.optimizer);
    loaded.optimizer = NamedTensors{};  // loaded: its copy is let go (8 bytes per parameter of AdamW moments)
    if (reader) read_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
    // Non-finite moments (a checkpoint written before saves checked them): every step would train
    // and every save be refused, pointing back at this checkpoint. Refused here, naming it.
    const std::optional<NonFinite> bad = first_non_finite(local_tensors(opt.state_dict()));
    if (max_over_job(bad.has_value() ? 1 : 0, plan.get()) != 0)
      MT_FAIL("meshtrain train: --resume: {}: {} holds a non-finite value: refusing to train from it; resume from "
              "an earlier step directory (name it in {}/latest), or start a new run from its weights (train --hf)",
              loaded.path,
              bad ? fmt::format("optimizer state '{}' (element {}: {})", bad->name, bad->index, value_text(bad->value))
                  : std::string("another rank's shard of the optimizer state"),
              ckpt_dir);
    try {
      loader.set_position(loaded.state.data_position);
    } catch (const std::exception& e) {
      MT_FAIL("--resume: {}/trainer_state.json: field 'data_position' {} does not fit the data ({}): {}",
              loaded.path, loaded.state.data_position,
              args.str("data").empty() ? "the embedded corpus" : args.str("data"), e.what());
    }
    default_generator().set_offset(loaded.state.rng_offset);
    start = loaded.state.step;
    fmt::print("resumed from {} at step {}\n", loaded.path, start);
    fmt::print("checkpoint loaded in {:.3f} s ({}{})\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - load_t0).count(),
               loaded.sharded ? "sharded" : "full tensors",
               reader ? fmt::format(", rank 0 read {} bytes in {:.3f} s", reader->bytes_read(), read_s) : "");
  }
  master.master_to_model();

  std::unique_ptr<std::ofstream> metrics;
  if (!args.str("metrics").empty() && root) {
    if (start > 0) drop_metrics_after(args.str("metrics"), start);
    metrics = std::make_unique<std::ofstream>(args.str("metrics"), start > 0 ? std::ios::app : std::ios::trunc);
    MT_CHECK(metrics->good(), "meshtrain train: cannot write metrics file {}", args.str("metrics"));
  }
  const double fpt = flops_per_token(cfg, seq);
  fmt::print("model {} ({:.2f}M parameters), {} tokens (unigram entropy {:.4f} nats), batch {}x{}x{}, {} steps, "
             "precision {}, device {}\n",
             cfg.model_type, static_cast<double>(cfg.num_parameters()) / 1e6, tokens.size(),
             entropy,
             batch, seq, accum, steps, args.str("precision"), device.str());
  if (plan)
    fmt::print("plan {} on {} ranks: mesh {}, input placements {}, gradient reduction {}\n", plan->path, plan->world,
               plan->plan_mesh.str(), placements_on(par->input_placements("model"), plan->plan_mesh),
               args.flag("no-fuse") ? "unfused" : "fused buckets");
  if (plan && plan->is_pipeline())
    fmt::print("pipeline: {} stages over {} of mesh {}, schedule {}, {} micro-batches (--accum); rank 0 is stage 0 "
               "with {} parameters\n",
               plan->pipeline->size(), plan->pipeline->dim, plan->full_mesh.str(),
               schedule_name(plan->pipeline->schedule), accum, plan->pipeline->stages[0].params);

  std::unique_ptr<ShardedSaver> saver;
  // Under a pipeline plan too: each stage writes its own tensors (docs/pipeline.md, "Checkpoints").
  if (plan && !ckpt_dir.empty() && !args.flag("gather-save"))
    saver = std::make_unique<ShardedSaver>(
        ShardedSaveOptions{ckpt_dir, overwrite, !args.flag("sync-save"), args.integer("keep"), start}, *plan, cfg);
  double gather_save_s = 0;  // --gather-save: the time spent in saves
  // What trainer_state.json records of this run's settings: the seed is the one in use.
  for (auto& [k, v] : settings)
    if (k == "seed") v = std::to_string(seed);
  auto save = [&](int64_t done) {
    if (ckpt_dir.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    TrainState s{done,  seed,  default_generator().offset(), loader.position(), args.str("precision"), batch, seq,
                 accum, plan ? plan->world : 1, plan ? plan->path : "", settings, trainer.warmup_steps()};
    // Never a checkpoint with non-finite weights or optimizer state (the loop stops before such a
    // step; this guards it: an f32 moment can overflow where the f64 norm did not). `shards`: each
    // rank holds other values, so the ranks agree first, and every rank stops, after committing a
    // save still in flight (an earlier step's, the one to resume from; it was discarded until
    // 2026-12-07).
    auto refuse_non_finite = [&](const NamedTensors& weights, const NamedTensors& state, bool shards) {
      std::optional<NonFinite> bad = first_non_finite(weights);
      const char* what = "weight";
      if (!bad) {
        bad = first_non_finite(state);
        what = "optimizer state";
      }
      if (max_over_job(bad.has_value() ? 1 : 0, shards ? plan.get() : nullptr) == 0) return;
      if (saver) saver->finish();
      const std::string fix = "; the last checkpoint saved is the one to resume from (--resume --allow-changes "
                              "with a lower --lr and --min-lr, or with --grad-clip if it is off)";
      if (!bad)
        throw NonFiniteStop(fmt::format("meshtrain train: refusing to save step {}: another rank's shards of the "
                                        "weights or optimizer state are not finite{}", done, fix));
      throw NonFiniteStop(fmt::format("meshtrain train: refusing to save step {}: {} '{}' holds {} at element {} "
                                      "after the optimizer step{}", done, what, bad->name, value_text(bad->value),
                                      bad->index, fix));
    };
    if (!plan) {
      refuse_non_finite(master.master_params(), opt.state_dict(), false);
      fmt::print("checkpoint {}\n", save_checkpoint(ckpt_dir, cfg, master.master_params(), opt.state_dict(), s, overwrite));
      apply_retention(ckpt_dir, args.integer("keep"), start);
      return;
    }
    if (!saver) {  // --gather-save: full tensors, gathered by every rank (collective); rank 0 writes
      NamedTensors weights = gather_stages(*plan, master.master_params()),
                   moments = gather_stages(*plan, opt.state_dict());
      refuse_non_finite(weights, moments, false);  // full tensors: every rank sees the same
      if (root) fmt::print("checkpoint {}\n", save_checkpoint(ckpt_dir, cfg, weights, moments, s, overwrite));
      if (root) apply_retention(ckpt_dir, args.integer("keep"), start);
      gather_save_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return;
    }
    // Sharded: every rank checks and writes its own shards (sharded_save.h).
    const NamedTensors state = opt.state_dict();
    refuse_non_finite(local_tensors(master.master_params()), local_tensors(state), true);
    saver->save(s, master.master_params(), state);
  };

  // --profile: every step is a marked region of the trace (docs/profiler.md).
  std::unique_ptr<Profiler> profiler;
  if (!args.str("profile").empty()) profiler = std::make_unique<Profiler>();
  // SIGTERM / SIGINT / SIGUSR1: finish the step, save it, exit 128 + the signal (stop_signals.h).
  StopSignals signals;
  int stop_signal = 0;
  int64_t end = stop_at;     // the last step trained
  bool end_saved = false;    // its checkpoint already written by --checkpoint-every
  try {
    for (int64_t step = start; step < stop_at; ++step) {
      std::optional<ProfileScope> profiled_step;
      if (profiler) profiled_step.emplace(ProfileEvent::Kind::kRegion, fmt::format("step {}", step + 1));
      auto t0 = std::chrono::steady_clock::now();
      const FsdpCounters fsdp_before = fsdp_counters();
      StepResult r = trainer.gradients(step, [&] {
        TokenBatch b = loader.next();
        if (!device.is_cpu()) b = {b.inputs.to(device), b.targets.to(device)};
        return b;
      });
      const double loss = r.loss, norm = trainer.clip(step, r.loss);
      trainer.apply();
      synchronize(device);  // the step's queued kernels belong to its time
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      profiled_step.reset();
      double tok_s = static_cast<double>(batch * seq * accum) / secs;
      double mfu = tok_s * fpt / (peak * (plan ? plan->world : 1));  // --plan: every rank's peak
      // The largest peak of any rank (under a plan rank 0's alone was printed, which under a
      // pipeline can be the stage holding least; until 2026-12-08).
      const double mem = static_cast<double>(max_over_job(memory_stats(device).peak, plan.get())) / (1 << 20);
      // The reducer's collectives and the FSDP units' reduce-scatters and HSDP all-reduces.
      const GradReducer* reducer = trainer.reducer();
      const FsdpCounters fsdp_after = fsdp_counters();
      const int64_t collectives = (reducer ? reducer->stats().collectives : 0) +
                                  fsdp_after.reduce_scatters - fsdp_before.reduce_scatters +
                                  fsdp_after.replica_all_reduces - fsdp_before.replica_all_reduces;
      const std::optional<ExpertTokenRange> experts =  // MoE: routing balance
          cfg.is_moe() ? over_stages(expert_token_range(*model), plan.get()) : std::nullopt;
      // --val-data: after the step, every --val-every steps and at the end (collective: every rank).
      std::optional<double> val_loss;
      if (!val_batches.empty() && ((val_every > 0 && (step + 1) % val_every == 0) || step + 1 == stop_at)) {
        val_loss = trainer.validation_loss(val_batches);
        if (!std::isfinite(*val_loss))
          throw NonFiniteStop(fmt::format("meshtrain train: step {}: the validation loss on {} is {}; stopped before "
                                          "saving the step", step + 1, args.str("val-data"), value_text(*val_loss)));
      }
      if ((step + 1) % log_every == 0 || step + 1 == stop_at) {
        fmt::print("step {:5d}/{} | loss {:.4f} | grad norm {:.4f} | lr {:.2e} | {:.0f} tok/s | MFU {:.1f}% | mem {:.0f} MiB",
                   step + 1, steps, loss, norm, opt.lr(), tok_s, 100 * mfu, mem);
        if (reducer) fmt::print(" | {} grad collectives", collectives);
        if (experts) fmt::print(" | expert rows {}-{}", experts->min, experts->max);
        if (experts && cfg.moe_capacity_factor > 0) fmt::print(", {} dropped", experts->dropped);
        fmt::print("\n");
      }
      if (val_loss)
        fmt::print("step {:5d}/{} | val loss {:.4f} ({} batches of {}x{})\n", step + 1, steps, *val_loss,
                   val_batches.size(), batch, seq);
      std::optional<TrainSample> sample;  // --sample-every: eval mode, no gradients, its own generator
      if (sampler && sampler->due(step + 1, stop_at)) {
        sample = sampler->take(*model, device, step + 1);
        fmt::print("{}", TrainSampler::describe(*sample, step + 1, steps));
      }
      std::fflush(stdout);  // a step's lines whole in a log file or pipe, as they happen (a killed run keeps them)
      if (metrics) {
        nlohmann::json j = {{"step", step + 1}, {"loss", loss},   {"grad_norm", norm}, {"lr", opt.lr()},
                            {"tokens_per_s", tok_s}, {"mfu", mfu}, {"mem_peak_mib", mem}, {"step_s", secs}};
        if (reducer) j["grad_collectives"] = collectives;
        if (experts) j["expert_rows_min"] = experts->min, j["expert_rows_max"] = experts->max;
        if (experts && cfg.moe_capacity_factor > 0) j["expert_rows_dropped"] = experts->dropped;
        if (val_loss) j["val_loss"] = *val_loss;
        if (sample) {
          j["sample_tokens"] = sample->tokens;
          if (sample->text) j["sample"] = *sample->text;
        }
        *metrics << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        metrics->flush();
        MT_CHECK(metrics->good(), "meshtrain train: cannot write metrics file '{}' at step {}: {}", args.str("metrics"),
                 step + 1, std::strerror(errno));
      }
      int64_t every = args.integer("checkpoint-every");
      if (every > 0 && (step + 1) % every == 0 && step + 1 != stop_at) save(step + 1);
      if (step + 1 != stop_at && (stop_signal = StopSignals::agreed(plan.get())) != 0) {
        end = step + 1;
        end_saved = every > 0 && (step + 1) % every == 0;
        break;
      }
    }
  } catch (const NonFiniteStop&) {
    // Every rank stops at this step: the save of an earlier step still in flight is committed
    // (collective), so that it stays the checkpoint to resume from, as with synchronous saves.
    if (saver) saver->finish();
    throw;
  }
  if (profiler) profiler->stop();
  if (!end_saved) save(end);
  if (saver) {
    saver->finish();
    if (root) fmt::print("checkpoint saves blocked training for {:.3f} s ({})\n", saver->blocked_seconds(),
                         args.flag("sync-save") ? "synchronous" : "asynchronous");
  } else if (plan && !ckpt_dir.empty() && root) {
    fmt::print("checkpoint saves blocked training for {:.3f} s (gathered on rank 0)\n", gather_save_s);
  }
  // The trace last: a diagnostic file that cannot be written (a full disk) fails the run after the
  // final checkpoint is committed, not before (it lost the final save, and under --plan the
  // pending one, until 2026-11-28).
  if (profiler) {
    const int rank = plan ? plan->rank : 0;
    const std::string path = rank_trace_path(args.str("profile"), rank);
    if (!path.empty()) profiler->write_chrome_trace(path, rank);
    if (root) fmt::print("{}profile: trace written to {}\n", profiler->summary(), path);
  }
  if (stop_signal != 0 && root) {
    if (ckpt_dir.empty())
      fmt::print("stopped by {} after step {} of {}: nothing saved (no --checkpoint-dir)\n", signal_name(stop_signal),
                 end, stop_at);
    else
      fmt::print("stopped by {} after step {} of {}: its checkpoint is in {}; continue with --resume\n",
                 signal_name(stop_signal), end, stop_at, ckpt_dir);
  }
  flush_stdout("train");
  return stop_signal != 0 ? 128 + stop_signal : 0;
}

}  // namespace mt::cli
