// Lowering: a Plan resolved against a concrete model and mesh gives the hook IR, one record per
// concrete tensor and hook point, printed one per line as
//   model.layers.0.self_attn.o_proj.forward:<out>:0:redist(P(sum)->R@tp)
// Entries that touch the same tensor at the same hook are fused (per mesh dim, the later entry
// wins), duplicates vanish, and records come in a valid order: every param_init first (parameter
// order), then per module in module order (pre-order) forward_pre, forward, backward_pre,
// backward; within one hook parameters, factory labels, inputs, outputs. Regexes that match
// nothing and placements that do not fit a parameter are errors at the entry's file:line:column.
// lower() needs no communicator: `meshtrain plan` runs it for any world size. See docs/plans.md.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "plan/fsdp_layout.h"
#include "plan/plan.h"
#include "runtime/shape.h"
#include "tensor/module.h"
#include "tensor/tensor.h"

namespace mt {

enum class HookPoint { kParamInit, kForwardPre, kForward, kBackwardPre, kBackward };
const char* hook_point_name(HookPoint h);  // param_init, forward_pre, forward, backward_pre, backward

enum class HookAction {
  kInit,        // param_init: store the parameter as a DTensor with `dst` (shard-only materialization)
  kGather,      // forward_pre of a parameter: use redistribute(param, dst) (RUN) in the forward
  kRelease,     // forward of a parameter: put the stored (INIT) parameter back
  kActivation,  // forward_pre <in>:k / forward <out>:k: annotate, then redistribute src -> dst
  kGrad,        // backward <in>:k / backward_pre <out>:k: the gradient goes from src to dst
  kFactory,     // forward_pre: tensors created in the forward are `dst` (read by op dispatch)
  kDispatch,    // forward_pre of a MoE layer: its experts run over mesh dim `mesh_dim` (all_to_all)
};

struct HookRecord {
  std::string module;  // module path, "" for the root
  HookPoint hook = HookPoint::kParamInit;
  std::string tensor;  // parameter name, "<in>:k", "<out>:k" or a factory label
  HookAction action = HookAction::kInit;
  // kActivation: a plain tensor is taken as `annotate` (from_local) when set; `src` (explicit
  // redistribute entries) is what the tensor must be; `dst` what it becomes.
  std::optional<Placements> annotate, src, dst;
  Shape global_shape;          // parameters
  int io_index = -1;           // <in>:k / <out>:k
  int mesh_dim = -1;           // kDispatch
  std::string dispatch;        // kDispatch: "all_to_all"
  bool io_input = false;
  std::vector<PlanLoc> from;   // the plan entries that made this record
  // "model.layers.0.self_attn.forward_pre:<in>:0:redist(S(1)->R@tp)"
  std::string str(const PlanMesh& mesh) const;
  std::string action_str(const PlanMesh& mesh) const;
};

// One FSDP unit (an `fsdp` entry's module): its parameters' paths and local shapes as the layout
// planner saw them (after the placements on the other mesh dims), and the planned layout, whose
// blocks per rank are the parameters' RaggedShards over `mesh_dim` (docs/fsdp.md).
struct FsdpUnit {
  std::string module;
  int mesh_dim = -1;
  std::vector<std::string> params;       // paths, in layout input order (parameter order)
  std::vector<LayoutTensor> tensors;     // name = path, [rows, cols] of the local shard, block rows
  FsdpLayout layout;
  std::vector<PlanLoc> from;
  // The entries' `reshard=` / `prefetch=` (docs/fsdp.md); the root unit never reshards.
  bool reshard_after_forward = true, prefetch = true;
  std::string str(const PlanMesh& mesh) const;  // `meshtrain plan --fsdp-layout`
};

struct HookIR {
  PlanMesh mesh;
  std::vector<HookRecord> records;
  std::vector<FsdpUnit> fsdp_units;  // in module order
  std::string str() const;  // one record per line
  // The storage (INIT) placements of parameter `path`; throws when it has no record.
  const Placements& init_placements(const std::string& path) const;
};

// Placements printed with mesh-dim names: "S(0)@dp,S(1)@tp", all-replicate "R".
std::string placements_on(const Placements& ps, const PlanMesh& mesh);

HookIR lower(const Plan& plan, Module& model, const PlanMesh& mesh);

// Checks the IR's input/output records against the shapes a forward shows: runs `model` once on
// `example_inputs` (meta tensors under MetaKernelsGuard: no kernel runs, nothing is allocated;
// `model` must be free of hooks that communicate, e.g. not yet parallelized), recording every
// module's inputs and outputs, then requires that each <in>:K / <out>:K the plan names exists and
// that every split placement names a dim the tensor has. Errors at the file:line:column of the
// placement at fault. Modules the forward does not run are not checked. `meshtrain plan` uses it.
void check_io_shapes(const Plan& plan, const HookIR& ir, Module& model, const std::vector<Tensor>& example_inputs);
// The plan's mesh must resolve, for mesh.size() ranks, to exactly `mesh` (names and shape).
HookIR lower(const Plan& plan, Module& model, const DeviceMesh& mesh);

}  // namespace mt
