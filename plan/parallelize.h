// parallelize(model, plan, mesh): lowers the plan (plan/lower.h), turns every parameter into a
// DTensor holding only this rank's shard of its storage (INIT) placements, and installs module
// hooks that carry out the rest of the IR. No model code changes. What runs where:
//   param_init   (now)          meta parameters: only the local shard is allocated and filled from
//                                the InitRecord (the recorded Philox offsets), piece by piece with
//                                the shard's global base and strides, so the values equal the
//                                single-device init bit for bit; already materialized parameters
//                                are sliced. The TensorImpl is kept (handles stay valid).
//   forward_pre  parameter      the module's slot holds redistribute(param, RUN) during forward
//                                (collective: e.g. ZeRO-3's all-gather); its gradient flows back
//                                through redistribute's backward to the stored parameter.
//   forward      parameter      the slot gets the stored parameter back ("release").
//   forward_pre  <in>:k / forward <out>:k: a DTensor is redistributed to the plan's placements; a
//                plain tensor is taken as the global value (from_local with Replicate) and
//                redistributed, or with `annotate` wrapped as the given placements (from_local),
//                or with an explicit `redistribute SRC -> DST` taken as SRC and handed on as a
//                plain local tensor again (static eager).
//   backward_pre <out>:k / backward <in>:k: the gradient is redistributed GSRC -> GDST (local
//                shapes must not change: a module hook cannot change a gradient's shape).
//   forward_pre  factory        a scope read by current_factory() while the module's forward runs.
// Ops on DTensors go through the op dispatch (docs/sharding.md). plan/job.h does plan file -> mesh
// -> parallelize -> GradReducer in one call (docs/embedding.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "plan/lower.h"
#include "plan/plan.h"
#include "tensor/hooks.h"
#include "tensor/module.h"

namespace mt {

// While one is alive on this thread, parallelize() allocates the local shards of meta parameters
// without filling them from their init records: for a caller that overwrites every shard right
// after (a resume from a sharded checkpoint, tools/cli/train.cpp), which would otherwise pay for a
// random init it discards. The default generator is not touched either way.
class SkipShardInitGuard {
 public:
  SkipShardInitGuard();
  ~SkipShardInitGuard();
  SkipShardInitGuard(const SkipShardInitGuard&) = delete;
  SkipShardInitGuard& operator=(const SkipShardInitGuard&) = delete;

 private:
  bool prev_;
};

// Owns the installed hooks: destroying it (or remove()) removes them. Parameters stay DTensors.
// Keep it alive as long as the model trains: a dropped result leaves DTensor parameters without
// the hooks that redistribute activations (TP then fails on a Partial input, DP would not shard).
class [[nodiscard]] Parallelized {
 public:
  // `module_paths`: every module path of the model (input_placements checks names against them).
  Parallelized(HookIR ir, std::vector<HookHandle> hooks, std::vector<std::string> module_paths = {});
  Parallelized(Parallelized&&) = default;
  Parallelized& operator=(Parallelized&& o) noexcept;  // removes this one's hooks first
  Parallelized(const Parallelized&) = delete;
  Parallelized& operator=(const Parallelized&) = delete;
  ~Parallelized() { remove(); }

  const HookIR& ir() const { return ir_; }
  // The placements the plan gives input `index` of module `path` (its forward_pre record), all
  // Replicate when the plan says nothing for that module. Trainers place data (ids, and targets
  // alike) with it. Throws for a path that names no module of the model, and for the root ""
  // when the plan places no input of the root but does of another module (e.g. "model").
  Placements input_placements(const std::string& path, int index = 0) const;
  size_t num_hooks() const { return hooks_.size(); }
  void remove();

 private:
  HookIR ir_;
  std::vector<HookHandle> hooks_;
  std::vector<std::string> modules_;
};

// `model` must not have been parallelized before. `device` receives the local shards. `wanted`,
// when given, says which of the lowered activation and gradient hooks to install (all by default;
// the IR keeps every record): a pipeline stage after the first leaves out its model input's,
// whose input there is the hidden state the stage before sent, already placed.
[[nodiscard]] Parallelized parallelize(Module& model, const Plan& plan, const DeviceMesh& mesh, Device device = Device::cpu(),
                                       const std::function<bool(const HookRecord&)>& wanted = {});

// ---- factory scopes ---------------------------------------------------------------------------

// A `factory` entry in effect: while the forward of `module` runs, tensors it creates under
// `label` ("*" = any) are meant to be DTensors with `placements` on `mesh`.
struct FactoryScope {
  std::string module, label;
  DeviceMesh mesh;
  Placements placements;
};
// The innermost scope for `label` (or "*") on this thread; nullptr when none.
const FactoryScope* current_factory(const std::string& label);

// ---- helpers (public for tests) ---------------------------------------------------------------

// The global shape of a plain local tensor of `local_shape` under `placements`: split dims summed
// over their mesh dim's group (one tiny all_reduce per split mesh dim of size > 1).
Shape infer_global_shape(const Shape& local_shape, const Placements& placements, const DeviceMesh& mesh);

}  // namespace mt
