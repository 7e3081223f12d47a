// Pipeline parallelism, the static half (docs/pipeline.md): a plan's `stage` / `stages` lines
// resolved against a model's pipeline units (its top-level blocks in forward order) into one
// contiguous range of units per stage, the schedule of forwards and backwards each stage runs,
// and the pruning that leaves a rank only its stage's modules. plan/pipeline_run.h runs the
// schedule. Nothing here communicates: `meshtrain plan` prints the layout for any world size.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "tensor/module.h"

namespace mt {

struct PipelineUnit {
  std::string path;  // module path, e.g. "model.layers.3"
  bool is_layer = false;
  int64_t params = 0;  // parameter elements (filled by pipeline_units_of)
};

struct PipelineStage {
  int64_t first = 0, last = 0;  // units [first, last)
  int64_t params = 0;
  std::vector<PlanLoc> from;    // the stage lines that assigned its units
};

struct PipelineLayout {
  std::string dim;  // the pipeline mesh dim
  PipelineScheduleKind schedule = PipelineScheduleKind::kOneFOneB;
  std::vector<PipelineUnit> units;
  std::vector<PipelineStage> stages;  // per rank; under interleaved(V) first/last are its chunk 0's
  // Virtual stages (chunks): p * V contiguous unit ranges in forward order, chunk c on stage c % p
  // (V = 1: chunks == stages).
  int64_t virtual_stages = 1;
  std::vector<PipelineStage> chunks;
  int64_t size() const { return static_cast<int64_t>(stages.size()); }
  // Chunk v (0 .. V-1) of stage s.
  const PipelineStage& chunk(int64_t s, int64_t v) const { return chunks[static_cast<size_t>(v * size() + s)]; }
  // "stage 0: model.embed_tokens .. model.layers.1 (4 units, 123456 parameters)", one per line,
  // then the schedule.
  std::string str(int64_t micro_batches) const;
};

// `units` (path, is_layer) with the parameter counts of `model`'s modules at those paths.
std::vector<PipelineUnit> pipeline_units_of(Module& model, const std::vector<std::pair<std::string, bool>>& units);

// Resolves the plan's stage lines for the pipeline dim's size in `mesh` (the plan's whole mesh).
// Errors name the plan line: a regex that matches no unit, a unit no line assigns or two lines
// assign, a stage that gets no unit or units out of forward order, a pipeline size that does not
// divide the layer count under `stages pp=even`.
PipelineLayout resolve_pipeline(const Plan& plan, const PlanMesh& mesh, const std::vector<PipelineUnit>& units);

// Whether `m` stands for a unit of another pipeline stage (prune_to_stage's placeholder).
bool is_other_stage_module(const Module& m);
// Whether `model` was pruned to one pipeline stage (holds a placeholder of another stage's unit).
bool is_stage_pruned(Module& model);

// Replaces every unit module of the other stages by an empty module whose forward is an error,
// so the rank neither holds nor initializes them (call on the model built on meta, before
// parallelize()). Units in `keep` stay (tied weights: the last stage keeps the embedding whose
// weight its logits use).
void prune_to_stage(Module& model, const PipelineLayout& layout, int64_t stage,
                    const std::vector<std::string>& keep = {});

// ---- schedules --------------------------------------------------------------------------------

struct PipelineAction {
  bool forward = true;
  int64_t micro = 0;
  int64_t chunk = 0;  // the stage's chunk (interleaved), else 0
};
// What stage `stage` of `stages` runs for `micros` micro-batches, in order. GPipe: every forward,
// then every backward (with V chunks per stage, as `eval` and `grad` run an interleaved plan: the
// forwards chunk by chunk, the backwards in the reverse chunk order); 1F1B: stages - stage - 1
// warm-up forwards, then one forward and one backward alternately, then the remaining backwards.
// Backwards always come in micro-batch order (gradients accumulate in the single-device order).
// Interleaved 1F1B (V chunks per stage, micros a multiple of stages): forwards go through the
// micro-batches in groups of `stages`, chunk by chunk; (stages - stage - 1) * 2 + (V - 1) * stages
// warm-up forwards, then one forward and one backward alternately (backwards in the reverse chunk
// order), then the remaining backwards (Narayanan et al., SC'21).
std::vector<PipelineAction> pipeline_schedule(PipelineScheduleKind kind, int64_t stages, int64_t stage,
                                              int64_t micros, int64_t virtual_stages = 1);
// The idle share of an ideal schedule with equal stage times: (p - 1) / (m + p - 1) for GPipe and
// 1F1B, (p - 1) / (V * m + p - 1) for interleaved 1F1B with V chunks per stage.
double bubble_fraction_theory(int64_t stages, int64_t micros, int64_t virtual_stages = 1);
// The step of a schedule whose ranks share compute: every stage's actions in their order, a
// forward after the previous chunk's forward of its micro-batch, a backward after the next chunk's
// backward, equal stages (a micro-batch's forward and backward take 1 on a rank of its own, the
// backward twice the forward, split evenly over the V chunks), and while n of the p stages compute
// each runs at min(1, p / (n x crowding)) of its own speed: `crowding` ranks per compute slot when
// all of them compute (a CPU host with more ranks than cores; 1: no sharing). Returns the makespan
// over m (in units of one micro-batch): >= max(crowding, (V m + p - 1) / (V m)) and equal to the
// latter when crowding is 1 (1F1B, GPipe). Time and memory O(p x actions).
double pipeline_shared_stretch(PipelineScheduleKind kind, int64_t stages, int64_t micros, int64_t virtual_stages,
                               double crowding);
// "F0 F1 B0 F2 B1 B2" per stage, one line each (interleaved: "F0.1" is micro-batch 0, chunk 1).
std::string schedule_table(PipelineScheduleKind kind, int64_t stages, int64_t micros, int64_t virtual_stages = 1);

}  // namespace mt
