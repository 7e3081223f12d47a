// ParallelJob: plan file -> mesh for the mpirun world -> parallelize -> GradReducer, and the input
// placement and gathering helpers a step loop needs (see job.h for the pieces it stands for).
#include "plan/job.h"

#include <algorithm>

#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "runtime/error.h"

namespace mt {

namespace {

bool is_ancestor(const std::string& a, const std::string& b) {  // a strictly encloses b
  return a != b && (a.empty() || (b.size() > a.size() && b.compare(0, a.size(), a) == 0 && b[a.size()] == '.'));
}

// The outermost module whose input 0 the IR places; "" with found=false when none.
std::string outermost_input_module(const HookIR& ir, bool& found) {
  std::vector<std::string> placed;
  for (const HookRecord& r : ir.records)
    if (r.hook == HookPoint::kForwardPre && r.io_input && r.io_index == 0) placed.push_back(r.module);
  std::vector<std::string> outer;
  for (const std::string& m : placed) {
    bool enclosed = false;
    for (const std::string& o : placed) enclosed = enclosed || is_ancestor(o, m);
    if (!enclosed && std::find(outer.begin(), outer.end(), m) == outer.end()) outer.push_back(m);
  }
  found = !outer.empty();
  std::string names;
  for (const std::string& o : outer) names += (names.empty() ? "'" : ", '") + o + "'";
  MT_CHECK(outer.size() <= 1,
           "parallelize_job: the plan places the inputs of several unrelated modules ({}): say which one the "
           "trainer's data feeds with ParallelJobOptions::input_module",
           names);
  return found ? outer[0] : std::string();
}

PlanMesh resolve_for_world(const Plan& plan) {
  const int n = world().size();
  try {
    return plan.resolve_mesh(n);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.find(plan.source()) != std::string::npos) throw;
    MT_FAIL("{}: {} (world of {} ranks: mpirun -np {})", plan.source(), what, n, n);
  }
}

}  // namespace

ParallelJob::ParallelJob(Module& model, Plan plan_in, PlanMesh plan_mesh_in, DeviceMesh mesh_in, Parallelized par,
                         GradReducer reducer_in, std::string input_module_in)
    : plan(std::move(plan_in)),
      plan_mesh(std::move(plan_mesh_in)),
      mesh(std::move(mesh_in)),
      parallelized(std::move(par)),
      reducer(std::move(reducer_in)),
      input_module(std::move(input_module_in)),
      model_(&model) {}

int ParallelJob::rank() const { return world().rank(); }
int ParallelJob::world_size() const { return world().size(); }

Placements ParallelJob::input_placements() const {
  bool placed = false;
  if (input_module.empty()) outermost_input_module(parallelized.ir(), placed);
  if (input_module.empty() && !placed) return Placements(static_cast<size_t>(mesh.ndim()), Placement::replicate());
  return parallelized.input_placements(input_module);
}

Tensor ParallelJob::place_input(const Tensor& global) const {
  MT_CHECK(!global.is_distributed(), "place_input: {} is a DTensor already; pass the global (plain) tensor",
           global.desc());
  return distribute_tensor(global, mesh, input_placements());
}

ParallelJob::NamedTensors ParallelJob::full_state() const { return full_tensors(model_->named_parameters()); }

ParallelJob parallelize_job(Module& model, Plan plan, ParallelJobOptions options) {
  PlanMesh pm = resolve_for_world(plan);
  DeviceMesh mesh(pm.shape, pm.names);
  Parallelized par = parallelize(model, plan, mesh, options.device);
  std::string input = options.input_module;
  if (input.empty()) {
    bool found = false;
    input = outermost_input_module(par.ir(), found);
  } else {
    par.input_placements(input);  // an unknown module is an error now, not at the first step
  }
  GradReducer reducer(model, mesh, std::move(options.reducer));
  return ParallelJob(model, std::move(plan), std::move(pm), std::move(mesh), std::move(par), std::move(reducer),
                     std::move(input));
}

ParallelJob parallelize_from_file(Module& model, const std::string& plan_path, ParallelJobOptions options) {
  return parallelize_job(model, load_plan(plan_path), std::move(options));
}

}  // namespace mt
