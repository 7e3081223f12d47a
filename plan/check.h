// Plan checks that need a forward. Lowering (plan/lower.h) checks what the plan and the parameter
// shapes alone decide; whether the model's ops can take the placements (attention heads split
// evenly, a Shard where a view needs one, an input split on a dim it has) shows only when they run.
// check_plan_forward runs them without a job: on a simulated mesh (DeviceMesh::simulated, no
// communicators), with meta tensors (no kernel runs, nothing is allocated), so `meshtrain plan`
// can check any world size in one process. See docs/plans.md, "Checks".
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "plan/parallelize.h"
#include "plan/plan.h"
#include "tensor/module.h"

namespace mt {

// For the first and the last coordinate of `mesh` (every coordinate when the mesh has at most 8),
// builds a fresh meta model with `build_meta_model` (it must build on the meta device, e.g. under
// InitDeviceGuard(Device::meta()); note that building advances the default generator), puts it in
// eval mode, parallelizes it under `plan` on a simulated mesh at that coordinate, and runs one
// forward on `example_inputs` (meta tensors, global shapes) in DTensor mode: every op's sharding
// rule and every plan hook runs, redistributions only change shapes. The first error is rethrown
// as "PLAN: a forward under the plan on mesh M at coordinate C fails: ERROR", where ERROR names
// the module path and the plan entries for it (Module::set_error_note, set by parallelize()).
// `after_forward` (optional) runs after each forward on its outputs, with the model's
// Parallelized and the simulated mesh, under the same guards: a trainer checks its loss there (the
// targets placed as the plan places the inputs), and its errors are reported the same way.
using AfterForward = std::function<void(const std::vector<Tensor>& outputs, const Parallelized& par,
                                        const DeviceMesh& mesh)>;
void check_plan_forward(const Plan& plan, const PlanMesh& mesh,
                        const std::function<std::shared_ptr<Module>()>& build_meta_model,
                        const std::vector<Tensor>& example_inputs, const AfterForward& after_forward = {});

}  // namespace mt
