// The training step of the meshtrain commands, shared by `train` and `parity` so that `parity`
// runs exactly the step `train` runs (docs/cli.md, "parity"): the flags that define a step (batch,
// sequence, accumulation, AdamW, schedule, clipping, dropout, seed, gradient reduction), the
// model construction (loaded, on meta for a plan, or initialized), and one optimizer step split
// into its three phases, so that a caller may look at the gradients before they are clipped and
// applied:
//   StepResult r = t.gradients(step, next_batch);   // forward + backward (x accum), reduced
//   r.grad_norm = t.clip();                          // global norm, clipping, finiteness check
//   t.apply();                                       // AdamW, zero grads, masters to the model
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/data.h"
#include "models/hf_checkpoint.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "optim/master_weights.h"
#include "optim/schedule.h"
#include "plan/grad_reducer.h"
#include "tools/cli/args.h"
#include "plan/pipeline_run.h"
#include "tools/cli/parallel.h"
#include "tools/cli/pipeline_rng.h"

namespace mt::cli {

// The optimizer of --optimizer ("adamw", "adamw8bit", "muon"; errors name `command`) over `params`
// (decay `weight_decay` on the matrices), with `adam`'s lr, betas and eps. adamw8bit takes any
// plan's shards: blocks that a shard cuts are reduced over the mesh (optim/adamw8bit.h).
std::unique_ptr<Optimizer> make_optimizer(const std::string& kind, const NamedTensors& params, double weight_decay,
                                          const AdamWOptions& adam, const std::string& command);

// The flags read by Trainer and validate_step_flags: optimizer, batch, seq, accum, lr, min-lr, warmup,
// weight-decay, beta2, grad-clip, dropout, seed, no-fuse, bucket-mb (the given defaults for batch
// and seq; the others as `train` has always had them).
std::vector<FlagSpec> step_flags(const std::string& default_batch, const std::string& default_seq);

// Each step flag in its range (errors name `command` and the flag).
void validate_step_flags(const Args& args, const std::string& command);
// The cosine schedule's final rate: --min-lr, or --lr / 10 when it is not given (a fixed default
// refused every --lr below it).
double min_lr_of(const Args& args);

// --moe-aux-loss, --moe-z-loss and --moe-capacity-factor (part of step_flags; `plan` takes them too,
// so that its checks and estimates see the run's loss and routing).
std::vector<FlagSpec> moe_loss_flags();

// The value of one of moe_loss_flags() that `cfg` trains with (--moe-aux-loss: 0 unless
// output_router_logits), as apply_moe_loss_flags sets it.
double moe_setting(const ModelConfig& cfg, const std::string& flag);

// --moe-aux-loss / --moe-z-loss / --moe-capacity-factor into a Mixtral config (given flags only; errors name `command`
// and the flag). `eval` and `grad` never read them: their loss is the cross-entropy alone.
void apply_moe_loss_flags(const Args& args, ModelConfig& cfg, const std::string& command);

// --precision: f32 or bf16 (errors name `command`).
DType parse_precision(const std::string& precision, const std::string& command);

// The model of a run: the checkpoint's weights when `weights` is given (built on meta, then
// loaded), else built on meta for a plan (`on_meta`: parallelize() fills each rank's shards with
// the single-device init), else initialized here. The caller seeds the default generator first.
std::shared_ptr<CausalLM> build_run_model(const ModelConfig& cfg, HfCheckpoint* weights, bool on_meta);

// The llm.c shards that a --data / --val-data value names: the file itself when it exists, else
// the files its glob pattern matches (*, ?, [...]), sorted by name; errors name `flag`.
std::vector<std::string> data_files(const std::string& data, const char* flag);
// The token stream of a run: the shards `data` names (data_files), mapped and concatenated in
// order, or the embedded corpus when it is empty; an id outside the vocabulary is an error naming
// the file and position. With `entropy`, the same pass also gives the unigram entropy of the ids.
TokenStream run_tokens(const std::string& data, const ModelConfig& cfg, const char* flag = "--data",
                       double* entropy = nullptr);

// A token file of one sequence of T+1 comma-separated ids per line (eval/grad/parity --tokens):
// inputs are the first T ids, targets the last T. Errors name the file (ids outside the
// vocabulary, T beyond max_position_embeddings of the model from `source`).
TokenBatch read_token_batch(const std::string& path, const ModelConfig& cfg, const std::string& source);

// The fewest and most (token, slot) rows any expert of any MoE layer got in the model's last
// forward (tensor/moe.h); nullopt for a model without MoE layers. Under all_to_all dispatch the
// counts are over the whole expert-parallel group.
struct ExpertTokenRange {
  int64_t min = 0, max = 0;
  int64_t dropped = 0;  // rows the capacity dropped, over every layer
};
std::optional<ExpertTokenRange> expert_token_range(Module& model);

// A step whose loss or gradient norm is not finite: the run stops before the optimizer applies it.
// Every rank sees the same loss and norm (both are reduced over the job), so every rank throws this
// at the same step, and `train` may still commit a checkpoint save in flight before it exits.
class NonFiniteStop : public Error {
 public:
  using Error::Error;
};

struct StepResult {
  double loss = 0;       // mean over the micro-batches
  double grad_norm = 0;  // before clipping (set by clip())
};

class Trainer {
 public:
  // `model` holds f32 weights (fresh or loaded, already parallelized under a plan). With a plan
  // (`plan` and `par` set) gradients are reduced by a GradReducer (--no-fuse, --bucket-mb) and the
  // batch is placed with the plan's input placements. A compute dtype other than f32 casts the
  // model and keeps f32 master weights. `total_steps` sets the learning-rate schedule.
  Trainer(CausalLM& model, const Args& args, const std::string& command, int64_t total_steps, DType compute,
          const PlanContext* plan, const Parallelized* par);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Sets step `step`'s learning rate and runs --accum forward/backward passes on next(), reduced
  // once at the end. The gradients are on master().master_params() (for 16-bit compute the
  // model's own 16-bit grads), not clipped yet.
  StepResult gradients(int64_t step, const std::function<TokenBatch()>& next);
  // Global gradient norm (before clipping), clipping by --grad-clip. A non-finite loss or norm is
  // an error naming the step (stopped before the optimizer step applies it).
  double clip(int64_t step, double loss);
  // The optimizer step, then zeroed gradients and the masters rounded into the model.
  void apply();
  // The mean cross-entropy of the model on `batches` (validation: no router losses, no dropout,
  // no gradients, the default generator untouched), the same on every rank; under a pipeline plan
  // the batches go through the stages as micro-batches, forwards only.
  double validation_loss(const std::vector<TokenBatch>& batches);

  MasterWeights& master() { return *master_; }
  Optimizer& optimizer() { return *opt_; }
  // The warmup in use: --warmup, or the whole run when --steps is shorter. A resumed run keeps
  // the one its checkpoint recorded (keep_warmup), so that a longer --steps does not restart the
  // warmup of a run that had finished it (capped at --steps, when a run is shortened below it).
  int64_t warmup_steps() const { return sched_.warmup_steps; }
  void keep_warmup(int64_t recorded) { sched_.warmup_steps = std::min(recorded, sched_.total_steps); }
  // A resumed run without --min-lr keeps the checkpoint's final rate (not --lr / 10 of this run).
  void keep_min_lr(double recorded) { sched_.min_lr = recorded; }
  const GradReducer* reducer() const { return reducer_.get(); }
  // Pipeline plans: this stage's runner (its schedule may be changed between steps), else null.
  PipelineRunner* pipeline() { return pipe_.get(); }

 private:
  CausalLM& model_;
  std::string command_;
  const PlanContext* plan_;
  const Parallelized* par_;
  int64_t accum_;
  double grad_clip_;
  LrSchedule sched_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<MasterWeights> master_;
  std::unique_ptr<Optimizer> opt_;
  AdamW* adamw_ = nullptr;  // opt_ when --optimizer adamw
  bool one_pass_ = false;   // 16-bit compute with AdamW: it reads 16-bit grads and writes the 16-bit weights
  // Pipeline plans (docs/pipeline.md): the schedule runner and the dropout offsets of the units.
  std::unique_ptr<PipelineRunner> pipe_;
  std::unique_ptr<PipelineRng> rng_;
  TiedPair tied_;  // tied embeddings: the first and the last stage (defined on those two only)
  StepResult pipeline_gradients(const std::function<TokenBatch()>& next);
};

}  // namespace mt::cli
