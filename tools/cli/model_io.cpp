// `meshtrain eval`, `grad` and `init`: the contracts other tools rely on.
//   eval --hf DIR --tokens FILE               prints {"loss": L} as the last stdout line
//   grad --hf DIR --tokens FILE --out G       also writes every parameter's gradient (f32, HF names)
//   init --config NAME_OR_JSON --seed S --out DIR   writes freshly initialized weights
// With --plan P (under mpirun -np N) the model is parallelized by the plan: the checkpoint is
// loaded whole and sliced to each rank's shards (init: built on meta, each rank initializing its
// shards), the batch placed with the plan's input placements, and rank 0 prints/writes the same
// outputs as one device (full tensors, gathered by every rank). Under a pipeline plan each rank
// keeps its stage's modules and the batch runs through the stages as one micro-batch (eval: the
// forwards only); every stage's tensors are gathered for what rank 0 writes.
// FILE holds one sequence per line of T+1 comma-separated ids: inputs are the first T, targets
// the last T, and the loss is the mean cross-entropy over all targets (no auxiliary losses).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <unordered_map>

#include "mesh/dtensor.h"
#include "models/data.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "models/safetensors.h"
#include "plan/grad_sync.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tools/cli/args.h"
#include "tools/cli/checks.h"
#include "tools/cli/commands.h"
#include "tools/cli/device.h"
#include "tools/cli/outputs.h"
#include "tools/cli/parallel.h"
#include "tools/cli/train_state.h"
#include "tools/cli/trainer.h"

namespace mt::cli {
namespace {

const std::vector<FlagSpec> kEvalFlags = {
    {"hf", "Hugging Face checkpoint directory (config.json + model.safetensors[.index.json])", "", false},
    {"tokens", "text file: one sequence of T+1 comma-separated token ids per line", "", false},
    {"out", "where grad writes the gradients (safetensors, f32, HF names)", "", false},
    {"plan", "parallelize with this plan file over the mpirun world (docs/cli.md, --plan)", "", false},
    {"device", "cpu, cuda (under mpirun: GPU local rank % GPUs) or cuda:N", "cpu", false},
};

struct Parallel {
  PlanContext ctx;
  std::unique_ptr<Parallelized> par;
};

// The plan against the model of `cfg` and a [batch, seq] batch on meta (check_plan_on_meta: the
// stages, every entry, the input split, a forward), agreed on by every rank before any builds its
// own part: a plan the model cannot take ends each rank with exit 1 and its error, without
// MPI_Abort (a stage resolution error, e.g. lm_head on no stage, aborted the job until 2026-12-07).
// Builds meta models, which advance the default generator: call it before seeding an init.
// The loss it checks is the cross-entropy alone, as these commands compute (no router losses,
// whatever `cfg` says).
void check_plan_at_start(const std::string& command, const PlanContext& ctx, const ModelConfig& cfg, int64_t batch,
                         int64_t seq, const std::string& source) {
  ModelConfig plain = cfg;
  plain.router_aux_loss_coef = 0;
  plain.router_z_loss_coef = 0;
  agree_on_start(command, 1, [&] { check_plan_on_meta(ctx, plain, batch, seq, command, source); });
}

// The checkpoint and the token file of eval and grad. Under a plan every rank reads them and the
// ranks agree (agree_on_start): a file every rank finds bad ends each with exit 1 and its error,
// without MPI_Abort.
void read_inputs(const std::string& command, const PlanContext* ctx, const std::string& dir, const std::string& tokens,
                 HfCheckpoint& ck, TokenBatch& batch) {
  auto read = [&] {
    ck = read_model_checkpoint(dir);
    batch = read_token_batch(tokens, ck.config, dir);
  };
  if (ctx) agree_on_start(command, 1, read);
  else read();
}

// Loads the checkpoint in f32 and returns the model with its mean cross-entropy on the file. With
// --plan (`parallel` set), the loaded model is parallelized (each rank keeps its shards) and the
// loss is a replicated DTensor.
std::pair<std::shared_ptr<CausalLM>, Tensor> model_loss(const std::string& command, const Args& args,
                                                        Parallel* parallel) {
  const std::string dir = args.required("hf"), tokens = args.required("tokens");
  const Device device = resolve_device(command, args.str("device"));
  HfCheckpoint ck;
  TokenBatch batch;
  read_inputs(command, parallel ? &parallel->ctx : nullptr, dir, tokens, ck, batch);
  if (parallel) check_plan_at_start(command, parallel->ctx, ck.config, batch.inputs.size(0), batch.inputs.size(1), tokens);
  std::shared_ptr<CausalLM> model = build_run_model(ck.config, &ck, false);  // on meta, then the file's weights
  model->eval();
  if (parallel)
    parallel->par = std::make_unique<Parallelized>(parallelize(*model, parallel->ctx.plan, *parallel->ctx.mesh));
  if (parallel)
    check_input_split(parallel->par->ir(), parallel->ctx, batch.inputs.size(0), batch.inputs.size(1), command, tokens);
  if (!device.is_cpu()) {  // loaded (and sliced) on the host, then moved: the same bytes
    model->to(device);
    batch.inputs = batch.inputs.to(device);
    batch.targets = batch.targets.to(device);
  }
  if (parallel) {
    batch.inputs = place_input(batch.inputs, *parallel->par, parallel->ctx);
    batch.targets = place_input(batch.targets, *parallel->par, parallel->ctx);
  }
  Tensor logits = (*model)(std::vector<Tensor>{batch.inputs})[0];
  Tensor loss = cross_entropy(logits.to(DType::kF32), batch.targets);
  // A non-finite loss is an error, never a printed result; the message names the first non-finite
  // weight when there is one (else the forward pass itself overflowed).
  const double value = scalar_value(loss);
  MT_CHECK(std::isfinite(value), "meshtrain {}: the loss of checkpoint '{}' on '{}' is {}: {}", command, dir, tokens,
           value_text(value), describe_non_finite(ck.tensors));
  return {model, loss};
}

void print_loss(const std::string& command, double loss) {
  fmt::print("{{\"loss\": {:.9g}}}\n", loss);
  flush_stdout(command);
}

// --plan: reads the plan (every rank) and silences stdout on ranks other than 0.
std::unique_ptr<Parallel> parallel_from(const Args& args, const char* command) {
  if (args.str("plan").empty()) return nullptr;
  auto p = std::make_unique<Parallel>();
  // A plan file's errors (the same on every rank) end each rank with exit 1, without MPI_Abort.
  agree_on_start(command, 1, [&] { p->ctx = load_plan_context(args.str("plan")); });
  quiet_non_root(p->ctx);
  return p;
}

// Tensors gathered from the stages of a pipeline put in the single-device order (the whole
// model's parameter order, from a copy built on meta), so that the files equal one device's byte
// for byte.
NamedTensors in_model_order(const ModelConfig& cfg, NamedTensors tensors) {
  std::shared_ptr<CausalLM> whole;
  {
    const uint64_t offset = default_generator().offset();  // building draws nothing on meta; kept anyway
    InitDeviceGuard meta(Device::meta());
    whole = build_causal_lm(cfg);
    default_generator().set_offset(offset);
  }
  std::unordered_map<std::string, size_t> order;
  for (const auto& [name, p] : whole->named_parameters()) order.emplace(name, order.size());
  auto at = [&](const std::string& name) {
    auto it = order.find(name);
    return it == order.end() ? order.size() : it->second;
  };
  std::stable_sort(tensors.begin(), tensors.end(),
                   [&](const auto& a, const auto& b) { return at(a.first) < at(b.first); });
  return tensors;
}

// Pipeline plans (docs/pipeline.md, "eval, grad and init"): the checkpoint loaded into this
// stage's modules, the batch run through the stages as one micro-batch in GPipe order (an
// interleaved plan's chunks one after the other), eval the forwards only. Returns this rank's
// model and the mean cross-entropy, broadcast from the last stage to its pipeline; with
// `backward` the parameters hold their gradients, reduced to their placements, a tied
// embedding's summed over the first and the last stage.
std::pair<std::shared_ptr<CausalLM>, double> pipeline_loss(const std::string& command, const Args& args,
                                                          Parallel& parallel, bool backward) {
  const std::string dir = args.required("hf"), tokens = args.required("tokens");
  const Device device = resolve_device(command, args.str("device"));
  HfCheckpoint ck;
  TokenBatch batch;
  read_inputs(command, &parallel.ctx, dir, tokens, ck, batch);
  // The loss is the cross-entropy alone (eval's and grad's contract: no router losses).
  ck.config.router_aux_loss_coef = 0;
  ck.config.router_z_loss_coef = 0;
  PlanContext& ctx = parallel.ctx;
  check_plan_at_start(command, ctx, ck.config, batch.inputs.size(0), batch.inputs.size(1), tokens);
  std::shared_ptr<CausalLM> model = build_run_model(ck.config, &ck, true);
  model->eval();
  parallel.par = std::make_unique<Parallelized>(parallelize_run(*model, ctx));
  check_input_split(parallel.par->ir(), ctx, batch.inputs.size(0), batch.inputs.size(1), command, tokens);
  if (!device.is_cpu()) {  // loaded and sliced on the host, then moved: the same bytes
    model->to(device);
    batch.inputs = batch.inputs.to(device);
    batch.targets = batch.targets.to(device);
  }
  PipelineRunner pipe(*ctx.world_mesh, ctx.pipeline->dim, *ctx.mesh, PipelineScheduleKind::kGPipe, device,
                      ctx.pipeline->virtual_stages);
  TiedPair tied;
  if (backward) tied = TiedPair(ctx, *model, pipe, command);
  const double loss = pipeline_cross_entropy(pipe, ctx, *parallel.par, *model, {batch}, backward);
  if (backward) {
    sync_gradients(*model);
    tied.sum_gradient(*model, pipe.stage(), command);
  }
  // A non-finite loss is an error, never a printed result (every rank of the pipeline has it).
  MT_CHECK(std::isfinite(loss), "meshtrain {}: the loss of checkpoint '{}' on '{}' is {}: {}", command, dir, tokens,
           value_text(loss), describe_non_finite(ck.tensors));
  return {model, loss};
}

// init's weights as the file will hold them must be finite: an initializer_range that overflows
// the output dtype (f16 beyond 65504, or any dtype near FLT_MAX) wrote +-inf and exited 0 until
// 2026-12-07, and the checkpoint failed only when read. Refused, naming the tensor; nothing written.
void check_init_values(const NamedTensors& tensors, DType dtype, const ModelConfig& cfg, const std::string& source) {
  for (const auto& [name, x] : tensors) {
    if (x.numel() == 0) continue;
    const double m = max(abs(x.detach().to(Device::cpu()))).to(DType::kF64).item();  // one scalar cast, not the tensor
    const double stored = full(Shape{1}, m, DType::kF64).to(dtype).to(DType::kF64).item();
    MT_CHECK(std::isfinite(stored),
             "meshtrain init: weight '{}' would hold {} in {} (its largest magnitude is {}): initializer_range {} of "
             "{} overflows the output dtype; nothing written",
             name, std::isnan(m) ? "nan" : "inf", dtype, value_text(m), cfg.initializer_range, source);
  }
}

}  // namespace

int run_eval(int argc, char** argv) {
  std::vector<FlagSpec> flags;  // grad's, less --out: eval writes no file
  for (const FlagSpec& f : kEvalFlags)
    if (f.name != "out") flags.push_back(f);
  Args args("eval", flags, argc, argv, 2);
  NoGradGuard no_grad;
  auto parallel = parallel_from(args, "eval");
  if (parallel && parallel->ctx.is_pipeline()) {
    print_loss("eval", pipeline_loss("eval", args, *parallel, false).second);
    return 0;
  }
  auto [model, loss] = model_loss("eval", args, parallel.get());
  print_loss("eval", scalar_value(loss));
  return 0;
}

int run_grad(int argc, char** argv) {
  Args args("grad", kEvalFlags, argc, argv, 2);
  const std::string out = args.required("out");
  check_output_file(out, "--out");
  check_not_input(out, "--out", {{"--hf", args.str("hf")}, {"--tokens", args.str("tokens")}});
  auto parallel = parallel_from(args, "grad");
  const bool pipeline = parallel && parallel->ctx.is_pipeline();
  std::shared_ptr<CausalLM> model;
  double loss = 0;
  if (pipeline) {
    std::tie(model, loss) = pipeline_loss("grad", args, *parallel, true);
  } else {
    auto [m, l] = model_loss("grad", args, parallel.get());
    l.backward();
    // --plan: Partial gradients (data-parallel terms) reduced to the parameters' placements.
    if (parallel) sync_gradients(*m);
    model = m;
    loss = scalar_value(l);
  }
  // The model's own parameters (not hf_state's detached export views, which carry no grad).
  // Their paths are the HF names; tied models have no lm_head parameter. A parameter that got no
  // gradient (an expert no token was routed to) contributes zeros, as in transformers: zeros with
  // the parameter's placements, so that every rank gathers the same DTensors below (under expert
  // parallelism only an expert's owner computes its gradient; a plain zero tensor on the other
  // ranks made them skip that gather and pair the next one with it).
  std::vector<std::pair<std::string, Tensor>> grads;
  for (auto& [name, p] : model->named_parameters()) {
    Tensor g = p.grad().defined() ? p.grad() : zeros_like(p.detach());
    grads.emplace_back(name, g);
  }
  if (pipeline)
    grads = in_model_order(model->config(), gather_stages(parallel->ctx, grads));  // collective: every rank
  else if (parallel)
    grads = full_tensors(grads);  // collective: every rank
  for (auto& [name, g] : grads) g = g.to(DType::kF32);
  // A finite loss with a non-finite gradient (an overflow in the backward pass) is no result either.
  if (auto bad = first_non_finite(grads))
    MT_FAIL("meshtrain grad: the gradient of '{}' holds {} at element {} (checkpoint '{}', loss {}); nothing written",
            bad->name, value_text(bad->value), bad->index, args.str("hf"), value_text(loss));
  if (!parallel || parallel->ctx.is_root()) write_safetensors(out, grads);
  print_loss("grad", loss);
  return 0;
}

int run_init(int argc, char** argv) {
  Args args("init", {{"config", "built-in name, config.json, or a directory holding one", "", false},
                     {"seed", "random seed", "0", false},
                     {"out", "output directory for config.json + model.safetensors", "", false},
                     {"dtype", "f32, bf16 or f16 on disk", "f32", false},
                     {"plan", "initialize shard-wise under this plan over the mpirun world; rank 0 writes", "", false},
                     {"overwrite", "replace the checkpoint already in --out", "", true},
                     {"device", "initialize on cpu, cuda or cuda:N (the same bytes: docs/cuda.md)", "cpu", false}},
            argc, argv, 2);
  ModelConfig cfg = resolve_config(args.required("config"));
  const std::string out = args.required("out");
  check_checkpoint_out(out, "--out", args.flag("overwrite") ? Overwrite::kAllow : Overwrite::kRefuse);
  std::string dt = args.str("dtype");
  MT_CHECK(dt == "f32" || dt == "bf16" || dt == "f16", "meshtrain init: --dtype must be f32, bf16 or f16, got '{}'", dt);
  DType dtype = dt == "f32" ? DType::kF32 : dt == "bf16" ? DType::kBF16 : DType::kF16;
  auto parallel = parallel_from(args, "init");
  // The plan against the model, before the seed (it builds meta models), on a batch of one sequence
  // per rank of 2 x world tokens: every mesh dim divides it, and a load-balanced context-parallel
  // layout's 2 x cp too (init runs no forward of its own: no --seq is to be refused).
  if (parallel)
    check_plan_at_start("init", parallel->ctx, cfg, parallel->ctx.world,
                        std::min<int64_t>(2 * parallel->ctx.world, std::max<int64_t>(cfg.max_position_embeddings, 1)),
                        "");
  const Device device = resolve_device("init", args.str("device"));
  manual_seed(static_cast<uint64_t>(args.integer("seed", 0, std::numeric_limits<int64_t>::max())));
  check_model_fits_memory(cfg, ModelUse::kWeights, "init", args.str("config"));
  std::shared_ptr<CausalLM> model;
  if (!parallel) {
    InitDeviceGuard on(device);  // random init runs on the device (Philox: the CPU's values)
    model = build_causal_lm(cfg);
    const auto state = hf_state(*model, cfg);
    check_init_values(state, dtype, cfg, args.str("config"));
    write_hf_checkpoint(out, cfg, state, dtype);
  } else {
    {
      InitDeviceGuard meta(Device::meta());  // each rank fills only its shards (parallelize)
      model = build_causal_lm(cfg);
    }
    if (parallel->ctx.is_pipeline()) {
      // Each stage initializes its own modules' shards (the single-device values, on the host:
      // the same bytes as on a device), gathered.
      Parallelized par = parallelize_run(*model, parallel->ctx);
      auto full = in_model_order(cfg, gather_stages(parallel->ctx, hf_state(*model, cfg)));  // collective
      check_init_values(full, dtype, cfg, args.str("config"));  // every rank holds the full tensors
      if (parallel->ctx.is_root()) write_hf_checkpoint(out, cfg, full, dtype);
    } else {
      Parallelized par = parallelize(*model, parallel->ctx.plan, *parallel->ctx.mesh, device);
      auto full = full_tensors(hf_state(*model, cfg));  // collective: every rank
      check_init_values(full, dtype, cfg, args.str("config"));  // every rank holds the full tensors
      if (parallel->ctx.is_root()) write_hf_checkpoint(out, cfg, full, dtype);
    }
  }
  fmt::print("{{\"out\": \"{}\", \"parameters\": {}}}\n", out, cfg.num_parameters());
  flush_stdout("init");
  return 0;
}

}  // namespace mt::cli
