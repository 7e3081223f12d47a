// --plan support shared by the meshtrain subcommands (docs/cli.md, "--plan"): the plan file is
// read on every rank and its mesh resolved for the mpirun world (mt::world()); the model is built
// on meta (or loaded whole) and parallelized; data is placed with the plan's input placements;
// full tensors are gathered (collectively, on every rank) for what rank 0 writes.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mesh/device_mesh.h"
#include "models/data.h"
#include "models/llama.h"
#include "plan/parallelize.h"
#include "plan/pipeline.h"
#include "plan/pipeline_run.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

namespace mt::cli {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// With a pipeline plan (stage lines over a `pp` dim, docs/pipeline.md), `plan`, `plan_mesh` and
// `mesh` are those of this rank's stage (the plan without the pipeline dim: what parallelize(),
// the reducer and the input placement use), `full_plan` / `full_mesh` / `world_mesh` the whole.
struct PlanContext {
  std::string path;
  Plan plan;
  PlanMesh plan_mesh;
  std::shared_ptr<DeviceMesh> mesh;
  int rank = 0, world = 1;
  bool is_root() const { return rank == 0; }
  // Pipeline plans only.
  Plan full_plan;
  PlanMesh full_mesh;
  std::shared_ptr<DeviceMesh> world_mesh;
  std::shared_ptr<PipelineLayout> pipeline;  // set by parallelize_run
  int64_t stage = 0;
  // Tied word embeddings over several stages: the parameter both the first and the last stage
  // hold (its gradient is summed over the two); empty otherwise.
  std::string tied_param;
  bool is_pipeline() const { return full_plan.is_pipeline(); }
};

// parallelize(model, ctx.plan, *ctx.mesh), after, for a pipeline plan, resolving its stages
// against the model (ctx.pipeline, ctx.stage), dropping the other stages' modules and setting the
// model's span to this stage. `model` is built on meta (or loaded whole).
[[nodiscard]] Parallelized parallelize_run(CausalLM& model, PlanContext& ctx);

// Every rank of the job: the whole mesh's communicator (under a pipeline plan `mesh` is only this
// rank's stage).
Communicator world_comm(const PlanContext& ctx);
// The largest of `value` over every rank of the job (a collective on world_comm); `value` itself
// without a plan.
int64_t max_over_job(int64_t value, const PlanContext* plan);

// Pipeline plans: every stage's tensors (full, plain, on the host) in stage order, on every rank
// (collective over the world); `tensors` are this rank's (DTensors or plain). Other plans: the
// full tensors (mt::full_tensors, mesh/dtensor.h).
NamedTensors gather_stages(const PlanContext& ctx, const NamedTensors& tensors);

// Pipeline plans: for each of this rank's `keys` (e.g. "group/name"), the pipeline stages whose
// ranks hold that key too, ascending (collective over the pipeline dim: every rank passes its
// own keys). Other plans: {0} for every key.
std::vector<std::vector<int64_t>> stages_holding(const PlanContext& ctx, const std::vector<std::string>& keys);
// Pipeline plans: the union of every stage's `keys` (collective over the pipeline dim, as
// stages_holding). Other plans: `keys`.
std::set<std::string> keys_over_stages(const PlanContext& ctx, const std::vector<std::string>& keys);

// Tied word embeddings under a pipeline plan (ctx.tied_param set): the first and the last stage
// of a pipeline both hold the weight (parallelize_run keeps it on the last stage for the logits),
// each gets the gradient of its own uses, and their sum is the single-device gradient. The pair's
// communicator exists on those two ranks only (defined()); elsewhere everything is a no-op.
class TiedPair {
 public:
  TiedPair() = default;
  // Collective over the pair. Refuses a weight laid out differently on the two stages (its
  // gradient is summed piece by piece); errors name `command` and the plan file.
  TiedPair(const PlanContext& ctx, Module& model, PipelineRunner& pipe, const std::string& command);
  bool defined() const { return comm_.defined(); }
  const std::string& param() const { return param_; }
  // The weight's gradient summed over the pair, on both (an error names the stage without one).
  void sum_gradient(Module& model, int64_t stage, const std::string& command);

 private:
  Communicator comm_;
  std::string param_;
};

// Pipeline plans: `batches` through this rank's stage of `model` as micro-batches in `pipe`'s
// schedule (forwards only unless `backward`), each chunk run with its span; returns the sum of the
// last stage's cross-entropies in batch order, broadcast over the pipeline (every stage has it).
double pipeline_cross_entropy(PipelineRunner& pipe, const PlanContext& ctx, const Parallelized& par, CausalLM& model,
                              const std::vector<TokenBatch>& batches, bool backward);

// Reads the plan file and resolves its mesh for world().size(). Errors name the file (and the
// line for a malformed plan or a mesh the world does not fit).
PlanContext load_plan_context(const std::string& path);

// A rank other than 0 sends its stdout to /dev/null so that only rank 0 prints results.
void quiet_non_root(const PlanContext& ctx);

// The batch and sequence sizes the plan's split of the model's input needs, checked before the
// first forward: a load-balanced sequence split (ZS(1), context parallelism) needs the sequence
// length divisible by 2 x the dim's size; a batch split over two or more mesh dims (dp x ep) with
// MoE token dispatch needs the batch divisible by their product. `source` is "" for --batch/--seq,
// else the token file the sizes come from; errors name it (or the flag) and the plan line.
void check_input_split(const HookIR& ir, const PlanContext& ctx, int64_t batch, int64_t seq,
                       const std::string& command, const std::string& source = "");

// The plan against the whole model of `cfg`, built on meta, before any rank builds its own: the
// pipeline's stages (resolve_pipeline), every entry lowered (a regex that matches nothing, a
// placement the shapes refuse), check_input_split, and a meta forward of a [batch, seq] batch
// under the plan (check_io_shapes, check_plan_forward: an input split on a dim it lacks, heads
// that do not split evenly, a factory placement nothing reads), as `meshtrain plan` runs it. The
// same on every rank, so that `parity` and `train` agree on these usage errors at start-up
// (agree_on_start: no MPI_Abort). Builds meta models: call it before seeding the run's init.
// `accum` (train, parity): the micro-batches per step, checked against a pipeline's schedule
// (check_pipeline_accum); 0 for a command that runs one batch through the stages.
void check_plan_on_meta(const PlanContext& ctx, const ModelConfig& cfg, int64_t batch, int64_t seq,
                        const std::string& command, const std::string& source = "", int64_t accum = 0);

// --accum against a pipeline's schedule: 1F1B needs a micro-batch per stage at least, interleaved
// 1F1B a multiple of the stage count (errors name `command`, the plan and the fix).
void check_pipeline_accum(const PipelineLayout& layout, int64_t accum, const std::string& command,
                          const std::string& plan_path);

// One meta forward of a [batch, seq] batch of token ids: check_io_shapes on `model` (the whole
// model of `cfg`, built on meta, `ir` its lowering), then check_plan_forward at the mesh's
// coordinates, each followed by the training loss with the targets placed as the trainer places
// them (the plan's input placements of 'model'). Nothing is allocated, no kernel runs. A plan
// whose logits and targets split the rows differently (a reviewer's `place model\.norm <in>:0
// dp=S(1)`) failed only in the first step, naming no plan line, until 2026-12-07. `meshtrain
// plan` and check_plan_on_meta both run it.
void check_forward_on_meta(const Plan& plan, const PlanMesh& mesh, const HookIR& ir, CausalLM& model,
                           const ModelConfig& cfg, int64_t batch, int64_t seq);

// Runs `step` on every rank of the world and agrees on how it went (one all-reduce of the world):
// when it throws on any rank, every rank throws ExitError(code, agreed): the failing ranks with
// their error, the others saying that another rank could not start. So the job ends with every
// rank returning `code` and one message per rank, without MPI_Abort. `step` must call no
// collective that a rank failing before it would leave the others waiting in.
void agree_on_start(const std::string& command, int code, const std::function<void()>& step);

// The global tensor (the same on every rank) as a DTensor with the placements the plan gives the
// model's input (ids and targets alike).
Tensor place_input(const Tensor& global, const Parallelized& par, const PlanContext& ctx);

// Plain full tensors (one per key, as a checkpoint holds them) turned into tensors shaped like
// `live` (same keys): where the live tensor is a DTensor, this rank's shard of the full tensor
// with its placements; else the full tensor. Keys missing from `full` are left out (the consumer
// reports them).
NamedTensors shard_like(const NamedTensors& full, const NamedTensors& live);

// The plain value of a (replicated) scalar loss, DTensor or not.
double scalar_value(const Tensor& t);

}  // namespace mt::cli
