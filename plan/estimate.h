// Per-rank estimate of one training step under a plan, for any world size, in one process and
// without allocating anything (`meshtrain plan --estimate`, docs/estimate.md). For one mesh
// coordinate it builds the model on the meta device, parallelizes it on a simulated mesh at that
// coordinate, hooks a GradReducer and runs a warm-up step and then one measured step of forward,
// loss, backward and gradient reduction on meta tensors, with
//   - byte-counting meta storage (tensor/meta_memory.h): the peak bytes alive, from the model's
//     actual ops and the autograd graph's actual saved tensors;
//   - collective counting (mesh/collective_count.h): calls and bytes per kind and mesh dims, from
//     the plan's hooks, the DTensor redistributions and the reducer's buckets;
//   - kernel cost counting (kernels/cost.h): matmul/attention FLOPs and memory-bound bytes.
// Parameters, gradients, optimizer state and master weights are sized from the real local shapes.
// The same step on real tensors under mpirun gives the same collective bytes and, within the
// allocator's rounding, the same peak (tests/plan/test_estimate.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cost.h"
#include "mesh/placement.h"
#include "mesh/collective_count.h"
#include "plan/plan.h"
#include "runtime/dtype.h"
#include "tensor/module.h"

namespace mt {

struct EstimateOptions {
  int64_t batch = 8;   // global batch per micro-batch (sharded as the plan places the input)
  int64_t seq = 128;   // tokens per sequence
  int64_t accum = 1;   // micro-batches per optimizer step (gradients reduced once, on the last)
  DType precision = DType::kF32;  // parameter and compute dtype; bf16/f16 add f32 master weights
  // With accum > 1 and 16-bit precision: the dtype .grad sums the micro-batches in (f32, as
  // `meshtrain train --accum-dtype` defaults to; or the precision itself).
  DType accum_dtype = DType::kF32;
  // adamw (2 f32 moments per parameter), adamw8bit (optim/adamw8bit.h: 2 u8 codes + per-row absmax)
  // or muon (optim/muon.h: one f32 momentum per hidden matrix, AdamW's moments for the rest)
  std::string optimizer = "adamw";
  std::string recompute = "none";  // as printed; EstimateModel::build_meta marks the modules (models/recompute.h)
  int64_t bucket_bytes = int64_t{25} << 20;  // GradReducerOptions::bucket_bytes
  std::string input_module = "model";  // the module whose input 0 the token ids feed
};

// What the plan-independent part of the CLI supplies: the model on the meta device and its loss.
struct EstimateModel {
  std::function<std::shared_ptr<Module>()> build_meta;  // builds on the meta device
  std::function<Tensor(Module& model, const Tensor& ids, const Tensor& targets)> loss;
  // Pipeline plans only (docs/estimate.md "Pipeline plans"): the model's pipeline units (path,
  // is_layer) in forward order, its span setter (CausalLM::set_pipeline_span), the forward of the
  // current span (token ids or the received activation in; the span's outputs out: [0] the
  // activation or logits, then e.g. its MoE layers' router logits), the loss of the last stage's
  // outputs, the hidden size (a stage sends [batch, seq, hidden] in the compute precision) and
  // whether the first and last stage share the tied embedding.
  std::function<std::vector<std::pair<std::string, bool>>(Module& model)> pipeline_units;
  std::function<void(Module& model, int64_t first, int64_t last)> set_span;
  std::function<std::vector<Tensor>(Module& model, const Tensor& x)> forward;
  std::function<Tensor(const std::vector<Tensor>& outputs, const Tensor& targets)> logits_loss;
  int64_t hidden = 0;
  bool tied_embeddings = false;
  // The optimizer's matrix work on this rank per step (flops) from the parallelized model's f32
  // parameters (meta tensors): Muon's Newton-Schulz iterations (optim/muon.h,
  // planned_newton_schulz_flops: the matrices this rank is the root of), which plan/ does not
  // see. Called under --optimizer muon; empty: not modelled.
  std::function<double(Module& model)> optimizer_matmul_flops;
};

struct RankEstimate {
  std::vector<int64_t> coord;
  int64_t rank = 0;
  // From the local shapes (measured from shapes).
  int64_t local_params = 0;     // elements this rank stores
  int64_t param_bytes = 0;      // in the compute precision, FSDP shards' padding included
  int64_t fsdp_padding_bytes = 0;  // of those, this rank's padding in its FSDP units' shards
  int64_t grad_bytes = 0;       // reduced gradients (the parameters' placements; FSDP padding included)
  int64_t optimizer_bytes = 0;  // AdamW: two f32 moments; adamw8bit: two u8 codes + per-row absmax;
                                // muon: one f32 momentum per hidden matrix, two f32 moments elsewhere
  int64_t master_bytes = 0;     // f32 master weights for 16-bit parameters, else 0
  // From the meta dry run of the measured step (measured from shapes).
  int64_t persistent_bytes = 0;  // alive when the step starts: parameters + master + optimizer state
  int64_t peak_bytes = 0;        // the step's peak
  int64_t activation_bytes = 0;  // peak - persistent: saved activations, gradients, buckets, temporaries
  CollectiveCounts comm;         // per optimizer step
  KernelCost cost;               // per optimizer step (matmul_flops includes the optimizer's below)
  double optimizer_matmul_flops = 0;  // Muon's Newton-Schulz on this rank (EstimateModel), else 0
  // What decides the figures: every parameter's global shape and INIT placements, and the input's
  // (see same_local_shapes).
  std::vector<std::pair<Shape, Placements>> layouts;
  // Pipeline plans: this coordinate's stage, the stage count, micro-batches and chunks per stage,
  // and the schedule's ideal bubble (bubble_fraction_theory): the roofline stretches the compute
  // by 1 / (1 - bubble) = (V m + p - 1) / (V m). stages == 1 for other plans.
  bool pipeline = false;  // a pipeline plan (then `layouts` are the stage mesh's)
  int64_t stage = 0;
  int64_t stages = 1;
  int64_t micros = 1;
  int64_t virtual_stages = 1;
  double bubble = 0;
  PipelineScheduleKind schedule = PipelineScheduleKind::kOneFOneB;
};

// Whether coordinate `other` holds exactly the local shapes `est`'s coordinate holds (every
// parameter and the input): then its dry run would count the same bytes and collectives, and the
// CLI reuses `est` for it instead of running it (a 10,000-rank mesh with even shards: one run).
bool same_local_shapes(const RankEstimate& est, const PlanMesh& mesh, const std::vector<int64_t>& other);

// One coordinate of `mesh` (size of coord = mesh.ndim()).
RankEstimate estimate_rank(const EstimateModel& model, const Plan& plan, const PlanMesh& mesh,
                           const std::vector<int64_t>& coord, const EstimateOptions& options);

// The coordinates worth estimating: every one of a mesh of at most `all_up_to` ranks, else the
// first and the last (chunk semantics put the largest shards first and the smallest last).
std::vector<std::vector<int64_t>> estimate_coordinates(const PlanMesh& mesh, int64_t all_up_to = 8);

// The row-major rank of a coordinate.
int64_t rank_of(const PlanMesh& mesh, const std::vector<int64_t>& coord);

}  // namespace mt
