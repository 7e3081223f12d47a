// The training step shared by `meshtrain train` and `meshtrain parity` (see trainer.h).
#include "tools/cli/trainer.h"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "models/corpus.h"
#include "models/recompute.h"
#include "mesh/dtensor.h"
#include "optim/adamw8bit.h"
#include "optim/clip.h"
#include "optim/muon.h"
#include "runtime/error.h"
#include "tensor/moe.h"
#include "tensor/ops.h"
#include "tensor/ops_nn.h"
#include "tensor/random.h"
#include "tools/cli/checks.h"

namespace mt::cli {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// A real flag in [lo, hi] (or [lo, hi) when `open_hi`), named in the error with why.
void real_in(const Args& args, const std::string& command, const char* name, double lo, double hi, bool open_hi,
             const char* why) {
  const double x = args.real(name);
  MT_CHECK(x >= lo && (open_hi ? x < hi : x <= hi), "meshtrain {}: --{} {} is out of range: {}", command, name,
           args.str(name), why);
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const std::string& kind, const NamedTensors& params, double weight_decay,
                                          const AdamWOptions& adam, const std::string& command) {
  std::vector<ParamGroup> groups = make_param_groups(params, weight_decay);
  if (kind == "adamw") return std::make_unique<AdamW>(std::move(groups), adam);
  if (kind == "muon") {
    MuonOptions mo;
    mo.lr = adam.lr;
    mo.beta1 = adam.beta1;
    mo.beta2 = adam.beta2;
    mo.eps = adam.eps;
    return std::make_unique<Muon>(std::move(groups), mo);
  }
  MT_CHECK(kind == "adamw8bit", "meshtrain {}: --optimizer must be adamw, adamw8bit or muon, got '{}'", command, kind);
  return std::make_unique<AdamW8bit>(std::move(groups), adam);
}

std::vector<FlagSpec> step_flags(const std::string& default_batch, const std::string& default_seq) {
  std::vector<FlagSpec> f = {
      {"optimizer", "adamw, adamw8bit (8-bit block-quantized moments) or muon (Newton-Schulz orthogonalized "
                    "momentum for hidden matrices, AdamW for the rest); docs/optim.md", "adamw", false},
      {"batch", "sequences per micro-batch", default_batch, false},
      {"seq", "tokens per sequence", default_seq, false},
      {"accum", "micro-batches per optimizer step (gradient accumulation)", "1", false},
      {"accum-dtype", "with --accum > 1 and --precision bf16: the dtype gradients are summed in over the "
                      "micro-batches, f32 (2 more bytes per parameter) or bf16 (rounded per micro-batch)", "f32",
       false},
      {"lr", "peak learning rate", "3e-3", false},
      {"min-lr", "final learning rate of the cosine schedule (default: --lr / 10)", "", false},
      {"warmup", "linear warmup steps", "20", false},
      {"weight-decay", "AdamW decoupled weight decay (matrices only)", "0.1", false},
      {"beta2", "AdamW beta2", "0.95", false},
      {"grad-clip", "clip the global gradient norm to this (0: off)", "1.0", false},
      {"dropout", "attention and residual dropout probability", "0", false},
      {"recompute", "activation recomputation: none, full (every decoder layer keeps only its input and runs "
                    "again in backward) or selective (each layer's feed-forward block); docs/models.md", "none",
       false},
      {"seed", "random seed (init, dropout)", "1337", false},
      {"no-fuse", "with --plan: one collective per gradient and mesh dim instead of fused buckets", "", true},
      {"bucket-mb", "with --plan: gradient bucket size in MiB", "25", false},
  };
  for (FlagSpec& e : moe_loss_flags()) f.push_back(std::move(e));
  return f;
}

std::vector<FlagSpec> moe_loss_flags() {
  return {
      {"moe-aux-loss", "Mixtral: load-balancing loss coefficient in the training loss (0: off; default: the "
                       "config's output_router_logits and router_aux_loss_coef)", "", false},
      {"moe-z-loss", "Mixtral: router z-loss coefficient in the training loss (default: the config's, 0)", "", false},
      {"moe-capacity-factor", "Mixtral: expert capacity factor, rows beyond it dropped (0: dropless; default: the "
                              "config's, 0)", "", false},
  };
}

void validate_step_flags(const Args& args, const std::string& command) {
  const std::string opt = args.str("optimizer");
  MT_CHECK(opt == "adamw" || opt == "adamw8bit" || opt == "muon",
           "meshtrain {}: --optimizer must be adamw, adamw8bit or muon, got '{}'", command, opt);
  args.integer("batch", 1, kMaxBatch);
  args.integer("seq", 1, kMaxPositions);
  args.integer("accum", 1, kMaxAccum);
  MT_CHECK(args.str("accum-dtype") == "f32" || args.str("accum-dtype") == "bf16",
           "meshtrain {}: --accum-dtype must be f32 or bf16, got '{}'", command, args.str("accum-dtype"));
  args.integer("warmup", 0, kMaxSteps);
  args.integer("seed", 0, kInt64Max);
  const double inf = std::numeric_limits<double>::infinity();
  const double lr = args.real("lr");
  MT_CHECK(lr > 0, "meshtrain {}: --lr {} must be positive", command, args.str("lr"));
  if (args.has("min-lr")) {
    real_in(args, command, "min-lr", 0, inf, false, "the final learning rate must be >= 0");
    MT_CHECK(args.real("min-lr") <= lr,
             "meshtrain {}: --min-lr {} is above --lr {}: the cosine schedule decays from --lr to --min-lr", command,
             args.str("min-lr"), args.str("lr"));
  }
  real_in(args, command, "weight-decay", 0, inf, false, "weight decay must be >= 0");
  real_in(args, command, "beta2", 0, 1, true, "AdamW's beta2 must be in [0, 1)");
  real_in(args, command, "grad-clip", 0, inf, false, "the clipping norm must be >= 0 (0: off)");
  real_in(args, command, "dropout", 0, 1, true, "a dropout probability must be in [0, 1)");
  parse_recompute(args.str("recompute"), "meshtrain " + command + " --recompute");
  real_in(args, command, "bucket-mb", 1.0 / (1 << 20), 1 << 20, false,
          "the gradient bucket must be between 1 byte and 1 TiB");
}

DType parse_precision(const std::string& precision, const std::string& command) {
  MT_CHECK(precision == "f32" || precision == "bf16", "meshtrain {}: --precision must be f32 or bf16, got '{}'",
           command, precision);
  return precision == "f32" ? DType::kF32 : DType::kBF16;
}

std::shared_ptr<CausalLM> build_run_model(const ModelConfig& cfg, HfCheckpoint* weights, bool on_meta) {
  std::shared_ptr<CausalLM> model;
  if (weights || on_meta) {
    InitDeviceGuard meta(Device::meta());  // loaded weights, or parallelize() fills the shards
    model = build_causal_lm(cfg);
  } else {
    model = build_causal_lm(cfg);
  }
  if (weights) {
    weights->config = cfg;
    load_into_module(*model, *weights);
  }
  model->train();
  return model;
}

std::vector<std::string> data_files(const std::string& data, const char* flag) {
  std::error_code ec;
  if (data.empty() || std::filesystem::exists(data, ec) || data.find_first_of("*?[") == std::string::npos)
    return {data};  // read_token_file names what is wrong with it
  // Without GLOB_ERR: a directory of the pattern that is missing or unreadable matches nothing
  // (GLOB_ERR made a mistyped directory "cannot be read").
  glob_t g{};
  const int rc = ::glob(data.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  MT_CHECK(rc != GLOB_NOSPACE, "{} {}: out of memory expanding the pattern", flag, data);
  MT_CHECK(!out.empty(), "{} {}: no file matches the pattern", flag, data);
  std::sort(out.begin(), out.end());
  return out;
}

TokenStream run_tokens(const std::string& data, const ModelConfig& cfg, const char* flag, double* entropy) {
  TokenStream tokens;
  if (data.empty()) {
    tokens = TokenStream(embedded_corpus_tokens());
  } else {
    const std::vector<std::string> files = data_files(data, flag);
    try {
      tokens = TokenStream::map_files(files);
    } catch (const Error& e) {
      if (files.size() == 1 && files[0] == data) throw;  // the message names the file given
      MT_FAIL("{} {}: {}", flag, data, e.what());       // a file of the pattern: name the pattern too
    }
  }
  // With `entropy`, one pass both checks the ids and counts them (a multi-GB corpus is read once).
  TokenStream::IdCounts counts;
  if (entropy) counts = tokens.count_ids(cfg.vocab_size);
  const int64_t bad = entropy ? counts.outside : tokens.find_outside(cfg.vocab_size);
  if (bad >= 0) {
    int64_t t = 0;
    tokens.copy(bad, 1, &t);
    MT_FAIL("{}: token id {} (at {}) is out of range for vocab_size {}",
            data.empty() ? std::string("embedded corpus") : fmt::format("{} {}", flag, data), t, tokens.where(bad),
            cfg.vocab_size);
  }
  if (entropy) *entropy = tokens.size() > 0 ? counts.entropy() : 0.0;  // too few tokens: the DataLoader says so
  return tokens;
}

TokenBatch read_token_batch(const std::string& path, const ModelConfig& cfg, const std::string& source) {
  TokenRows rows = read_token_lines(path);
  check_token_range(rows, cfg.vocab_size, path);
  MT_CHECK(rows.cols >= 2, "{}: each line needs at least 2 token ids (T+1 with T >= 1), found {}", path, rows.cols);
  MT_CHECK(rows.cols - 1 <= cfg.max_position_embeddings,
           "{}: sequences of T = {} tokens are longer than max_position_embeddings = {} of checkpoint '{}'", path,
           rows.cols - 1, cfg.max_position_embeddings, source);
  Tensor all = from_vector<int64_t>(rows.ids, Shape{rows.rows, rows.cols});
  return {all.narrow(1, 0, rows.cols - 1).contiguous(), all.narrow(1, 1, rows.cols - 1).contiguous()};
}

std::optional<ExpertTokenRange> expert_token_range(Module& model) {
  std::optional<ExpertTokenRange> r;
  for (auto& [path, m] : model.named_modules()) {
    const auto* moe = dynamic_cast<const MoeModule*>(m.get());
    if (!moe) continue;
    if (!moe->tokens_per_expert().empty()) {
      if (!r) r = ExpertTokenRange{moe->tokens_per_expert()[0], moe->tokens_per_expert()[0]};
      r->dropped += moe->dropped_rows();
    }
    for (int64_t n : moe->tokens_per_expert()) {
      if (!r) r = ExpertTokenRange{n, n};
      r->min = std::min(r->min, n);
      r->max = std::max(r->max, n);
    }
  }
  return r;
}

double moe_setting(const ModelConfig& cfg, const std::string& flag) {
  if (flag == "moe-aux-loss") return cfg.output_router_logits ? cfg.router_aux_loss_coef : 0;
  if (flag == "moe-z-loss") return cfg.router_z_loss_coef;
  MT_CHECK(flag == "moe-capacity-factor", "moe_setting: '{}' is not an MoE flag", flag);
  return cfg.moe_capacity_factor;
}

void apply_moe_loss_flags(const Args& args, ModelConfig& cfg, const std::string& command) {
  for (const char* flag : {"moe-aux-loss", "moe-z-loss", "moe-capacity-factor"}) {
    if (args.str(flag).empty()) continue;
    MT_CHECK(cfg.is_moe(), "meshtrain {}: --{} applies to mixture-of-experts models (mixtral), not {}", command, flag,
             cfg.model_type);
    const double v = args.real(flag);
    // Bounded by f32's largest value: the losses it scales are f32 (1e39 gave an infinite loss).
    MT_CHECK(std::isfinite(v) && v >= 0 && v <= std::numeric_limits<float>::max(),
             "meshtrain {}: --{} {} must be a finite coefficient >= 0 (at most 3.4e38)", command, flag, args.str(flag));
    if (std::string(flag) == "moe-aux-loss") {
      cfg.output_router_logits = v > 0;
      cfg.router_aux_loss_coef = v;
    } else if (std::string(flag) == "moe-z-loss") {
      cfg.router_z_loss_coef = v;
    } else {
      cfg.moe_capacity_factor = v;
    }
  }
}

double min_lr_of(const Args& args) { return args.has("min-lr") ? args.real("min-lr") : args.real("lr") / 10; }

Trainer::Trainer(CausalLM& model, const Args& args, const std::string& command, int64_t total_steps, DType compute,
                 const PlanContext* plan, const Parallelized* par)
    : model_(model),
      command_(command),
      plan_(plan),
      par_(par),
      accum_(args.integer("accum")),
      grad_clip_(args.real("grad-clip")),
      // A run shorter than the warmup warms up over the whole run.
      sched_{args.real("lr"), min_lr_of(args), std::min(args.integer("warmup"), total_steps), total_steps} {
  // A pipeline stage holding no decoder layer (the embedding alone) has nothing to recompute (it
  // was an error on that stage, with MPI_Abort, until 2026-12-08).
  apply_recompute(model, parse_recompute(args.str("recompute"), "meshtrain " + command + " --recompute"),
                  plan && plan->is_pipeline());
  if (plan) {
    GradReducerOptions ro;
    ro.fuse = !args.flag("no-fuse");
    ro.bucket_bytes = static_cast<int64_t>(args.real("bucket-mb") * (1 << 20));
    reducer_ = std::make_unique<GradReducer>(model, *plan->mesh, ro);
    if (par) check_input_split(par->ir(), *plan, args.integer("batch"), args.integer("seq"), command);
    if (plan->is_pipeline()) {
      MT_CHECK(plan->pipeline != nullptr, "meshtrain {}: internal: pipeline plan {} not resolved (parallelize_run)",
               command, plan->path);
      const PipelineScheduleKind kind = plan->pipeline->schedule;
      check_pipeline_accum(*plan->pipeline, accum_, command, plan->path);  // also at start-up (check_plan_on_meta)
      const NamedTensors params = model.named_parameters();
      const Device device = params.empty() ? Device::cpu() : params.front().second.device();
      pipe_ = std::make_unique<PipelineRunner>(*plan->world_mesh, plan->pipeline->dim, *plan->mesh, kind, device,
                                               plan->pipeline->virtual_stages);
      rng_ = std::make_unique<PipelineRng>(model.config());
      tied_ = TiedPair(*plan, model, *pipe_, command);
    }
  }
  // The model holds f32 weights here. For bf16, keep exact f32 copies as the optimizer's master
  // weights and cast the model itself to bf16 for compute.
  NamedTensors f32_weights;
  if (compute != DType::kF32) {
    for (auto& [name, p] : model.named_parameters()) f32_weights.emplace_back(name, p.detach().clone());
    cast_parameters(model, compute);
  }
  // 16-bit gradients of several micro-batches are summed in f32 (Megatron's main_grad, FSDP2's
  // reduce_dtype): one rounding per step where the model's bf16 .grad rounded once per micro-batch.
  // Collectives still carry the compute dtype (docs/optim.md, "Gradient accumulation in bf16").
  if (compute != DType::kF32 && accum_ > 1 && args.str("accum-dtype") == "f32")
    for (auto& [name, p] : model.named_parameters())
      if (p.requires_grad()) p.set_grad_dtype(DType::kF32);
  master_ = std::make_unique<MasterWeights>(model.named_parameters());
  if (compute != DType::kF32) master_->load_state_dict(f32_weights);
  AdamWOptions adam;
  adam.lr = args.real("lr");
  adam.beta1 = 0.9;
  adam.beta2 = args.real("beta2");
  adam.eps = 1e-8;
  opt_ = make_optimizer(args.str("optimizer"), master_->master_params(), args.real("weight-decay"), adam, command);
  adamw_ = dynamic_cast<AdamW*>(opt_.get());
  // 16-bit compute with AdamW: the optimizer reads the model's 16-bit grads and writes its 16-bit
  // weights in the same pass that updates the f32 masters (no f32 grad copies, no separate cast).
  // Other optimizers take the copy path (f32 master grads, masters rounded into the model).
  one_pass_ = !master_->pass_through() && adamw_;
  if (one_pass_) adamw_->set_param_copies(master_->model_copies());
}

StepResult Trainer::gradients(int64_t step, const std::function<TokenBatch()>& next) {
  opt_->set_lr(sched_.lr(step));
  if (pipe_) return pipeline_gradients(next);
  double loss_sum = 0;
  for (int64_t micro = 0; micro < accum_; ++micro) {
    auto [inputs, targets] = next();
    if (plan_) {
      inputs = place_input(inputs, *par_, *plan_);
      targets = place_input(targets, *par_, *plan_);
      reducer_->set_sync(micro + 1 == accum_);  // reduce once per optimizer step
    }
    Tensor loss = model_.loss(inputs, targets);
    loss_sum += scalar_value(loss);
    (accum_ > 1 ? div(loss, static_cast<double>(accum_)) : loss).backward();
  }
  if (reducer_) reducer_->finish();
  if (one_pass_)
    master_->attach_model_grads();
  else
    master_->grads_to_master();
  return {loss_sum / static_cast<double>(accum_), 0};
}

StepResult Trainer::pipeline_gradients(const std::function<TokenBatch()>& next) {
  // The micro-batches are drawn in the single-device order on every rank, whatever its stage.
  std::vector<TokenBatch> batches;
  for (int64_t m = 0; m < accum_; ++m) batches.push_back(next());
  Generator& gen = default_generator();
  const uint64_t base = gen.offset();
  const PipelineRng::Offsets& off = rng_->at(batches.front().inputs.shape());
  std::vector<double> losses(static_cast<size_t>(accum_), 0.0);
  PipelineRunner::Step s;
  s.micros = accum_;
  s.input = [&](int64_t m) { return place_input(batches[static_cast<size_t>(m)].inputs, *par_, *plan_); };
  s.forward = [&](int64_t m, int64_t v, const std::vector<Tensor>& x) -> std::vector<Tensor> {
    const PipelineStage& ch = plan_->pipeline->chunk(plan_->stage, v);
    if (pipe_->virtual_stages() > 1) model_.set_pipeline_span(ch.first, ch.last);
    // Dropout draws exactly the blocks the single-device run draws for these units (pipeline_rng.h).
    gen.set_offset(base + static_cast<uint64_t>(m) * off.forward + off.unit_start[static_cast<size_t>(ch.first)]);
    const std::vector<Tensor> o = model_(std::vector<Tensor>{x[0]});
    // The MoE router losses: this chunk's layers' statistics added to the sums the chunks before
    // carried (x[1..]), in layer order; the losses of the totals join the cross-entropy on the
    // last chunk, and the sums' gradients travel back (docs/pipeline.md).
    const RouterSums sums =
        causal_lm_router_sums(model_.config(), router_sums_of(std::vector<Tensor>(x.begin() + 1, x.end())), o);
    if (!pipe_->makes_loss(v)) {
      std::vector<Tensor> out{o[0]};
      for (const Tensor& t : router_sums_tensors(sums, x[0].device())) out.push_back(t);
      return out;
    }
    Tensor loss =
        causal_lm_loss(model_.config(), o[0], place_input(batches[static_cast<size_t>(m)].targets, *par_, *plan_), sums);
    losses[static_cast<size_t>(m)] = scalar_value(loss);
    return {accum_ > 1 ? div(loss, static_cast<double>(accum_)) : loss};
  };
  s.before_backward = [&](int64_t m) { reducer_->set_sync(m + 1 == accum_); };
  pipe_->run(s);
  gen.set_offset(base + static_cast<uint64_t>(accum_) * off.forward);
  reducer_->finish();
  // Both stages that hold a tied weight get the single-device gradient (then both optimizers make
  // the same update).
  tied_.sum_gradient(model_, pipe_->stage(), command_);
  if (one_pass_)
    master_->attach_model_grads();
  else
    master_->grads_to_master();
  double loss_sum = 0;
  for (double l : losses) loss_sum += l;  // micro-batch order, as gradients() sums
  Tensor t = from_vector<double>({loss_sum}, Shape{1});
  pipe_->comm().broadcast(t, static_cast<int>(pipe_->stages() - 1));
  return {t.to_vector<double>()[0] / static_cast<double>(accum_), 0};
}

double Trainer::clip(int64_t step, double loss) {
  // With AdamW: the norm here, the scaling inside the optimizer's read of each gradient (no pass
  // over the gradients to scale them; the same bits: g * coef rounded once either way).
  const bool scale_in_adamw = adamw_ != nullptr;
  double norm = 0;
  if (pipe_) {
    // Pipeline: the squares of every stage's gradients summed over the pipeline dim, then the
    // same scaling as clip_grad_norm.
    // A tied weight held by two stages counts once (the first stage's).
    NamedTensors counted;
    for (const auto& [name, p] : master_->master_params())
      if (!(pipe_->is_last() && !pipe_->is_first() && name == tied_.param())) counted.emplace_back(name, p);
    const double mine = clip_grad_norm(counted, 0);
    Tensor sq = from_vector<double>({mine * mine}, Shape{1});
    pipe_->comm().all_reduce(sq);
    norm = std::sqrt(sq.to_vector<double>()[0]);
    if (!scale_in_adamw && grad_clip_ > 0 && std::isfinite(norm) && grad_clip_ / (norm + 1e-6) < 1) {
      NoGradGuard no_grad;
      for (const auto& [name, p] : master_->master_params()) {
        Tensor g = p.grad();
        if (g.defined()) g.mul_(grad_clip_ / (norm + 1e-6));
      }
    }
  } else {
    norm = clip_grad_norm(master_->master_params(), scale_in_adamw ? 0 : grad_clip_);
  }
  if (scale_in_adamw && grad_clip_ > 0 && std::isfinite(norm)) {
    const double coef = grad_clip_ / (norm + 1e-6);
    if (coef < 1) adamw_->set_grad_scale(coef);
  }
  // A non-finite loss or gradient stops the run before the optimizer step applies it: the weights
  // stay those of the previous step, and this step is never saved (docs/cli.md, "Bad input and
  // non-finite values").
  // What to do next: a train run goes on from its last checkpoint with other flags.
  const std::string next = command_ == "train"
                               ? "resume from the last one with --allow-changes and a lower --lr and --min-lr, or "
                                 "--grad-clip; or check the data and the starting weights"
                               : "lower --lr, or use --grad-clip; or check the data and the starting weights";
  if (!std::isfinite(loss) || !std::isfinite(norm))
    throw NonFiniteStop(fmt::format(
        "meshtrain {}: step {}: the loss is {} and the gradient norm {}; stopped before the optimizer step, so no "
        "checkpoint of step {} is written ({})", command_, step + 1, value_text(loss), value_text(norm), step + 1, next));
  // The norm is summed in f64, but the optimizers square gradient elements in f32: one element
  // above sqrt(FLT_MAX) makes an inf second moment (and, for 8-bit AdamW, an inf block absmax whose
  // zero codes decode to nan). Unclipped, such a norm stops the run as a non-finite one does.
  constexpr double kF32SquareMax = 1.8446742974197924e19;  // sqrt(FLT_MAX), rounded down
  if (grad_clip_ <= 0 && norm > kF32SquareMax)
    throw NonFiniteStop(fmt::format(
        "meshtrain {}: step {}: the gradient norm {:.4g} is beyond {:.4g}, where a gradient element's square "
        "overflows the optimizer's f32 moments; stopped before the optimizer step, so no checkpoint of step {} is "
        "written (enable --grad-clip, or check the data and the starting weights)",
        command_, step + 1, norm, kF32SquareMax, step + 1));
  return norm;
}

double Trainer::validation_loss(const std::vector<TokenBatch>& batches) {
  if (batches.empty()) return 0;
  NoGradGuard no_grad;
  Generator& gen = default_generator();
  const uint64_t offset = gen.offset();
  const bool was_training = model_.is_training();
  model_.eval();
  struct Restore {
    CausalLM& model;
    Generator& gen;
    uint64_t offset;
    bool training;
    ~Restore() {
      if (training) model.train();
      gen.set_offset(offset);
    }
  } restore{model_, gen, offset, was_training};
  auto placed = [&](const Tensor& t) { return plan_ ? place_input(t, *par_, *plan_) : t; };
  double sum = 0;
  if (!pipe_) {
    for (const TokenBatch& b : batches) sum += scalar_value(model_.loss(placed(b.inputs), placed(b.targets), false));
    return sum / static_cast<double>(batches.size());
  }
  // Forwards only, in GPipe order (any number of batches; the chunks of an interleaved plan one
  // after the other).
  const PipelineScheduleKind kind = pipe_->schedule();
  pipe_->set_schedule(PipelineScheduleKind::kGPipe);
  sum = pipeline_cross_entropy(*pipe_, *plan_, *par_, model_, batches, false);
  pipe_->set_schedule(kind);
  return sum / static_cast<double>(batches.size());
}

void Trainer::apply() {
  opt_->step();
  opt_->zero_grad();
  model_.zero_grad();
  if (!one_pass_) master_->master_to_model();
}

}  // namespace mt::cli
