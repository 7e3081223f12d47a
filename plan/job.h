// ParallelJob: the common case of embedding meshtrain in a trainer in one call (docs/embedding.md).
//
//   auto job = mt::parallelize_from_file(*model, "plans/llama_tp.plan");
//
// does nothing the pieces do not; it is, step by step (each piece stays public in the job):
//   Plan plan = load_plan(path);                               // job.plan       (plan/plan.h)
//   PlanMesh pm = plan.resolve_mesh(world().size());           // job.plan_mesh  (the mpirun world)
//   DeviceMesh mesh(pm.shape, pm.names);                       // job.mesh       (mesh/device_mesh.h)
//   Parallelized par = parallelize(model, plan, mesh, device); // job.parallelized (hooks + shards)
//   GradReducer reducer(model, mesh, options.reducer);         // job.reducer    (plan/grad_reducer.h)
// and then, in the step loop:
//   job.place_input(ids)   = distribute_tensor(ids, mesh, par.input_placements(job.input_module))
//   job.reducer.finish()   after backward, before the optimizer step
//   job.full_state()       = full_tensors(model.named_parameters()) (collective), for saving
// A process started without mpirun is a world of one: the same code runs on one device.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mesh/device_mesh.h"
#include "plan/grad_reducer.h"
#include "plan/parallelize.h"
#include "plan/plan.h"
#include "runtime/device.h"
#include "tensor/module.h"
#include "tensor/tensor.h"

namespace mt {

struct ParallelJobOptions {
  Device device = Device::cpu();  // where the local shards live
  GradReducerOptions reducer;
  // The module whose input 0 the trainer's data feeds (ids and targets are placed alike). Empty:
  // the outermost module the plan places an input of ("model" for the LLaMA plans); Replicate when
  // the plan places none.
  std::string input_module;
};

class ParallelJob {
 public:
  using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

  Plan plan;
  PlanMesh plan_mesh;
  DeviceMesh mesh;
  Parallelized parallelized;  // owns the hooks: the model is parallel while the job lives
  GradReducer reducer;
  std::string input_module;   // resolved (see ParallelJobOptions)

  ParallelJob(ParallelJob&&) = default;
  ParallelJob& operator=(ParallelJob&&) = delete;  // `model_` is a reference to one model
  ParallelJob(const ParallelJob&) = delete;

  int rank() const;        // this process in the mpirun world
  int world_size() const;  // ranks in the world (1 without mpirun)
  bool is_root() const { return rank() == 0; }
  // The placements the plan gives the model's input (input_module's input 0).
  Placements input_placements() const;
  // A global tensor (the same on every rank: ids or targets of the whole batch) as the DTensor the
  // plan's input placements make of it: each rank keeps its part. No communication.
  Tensor place_input(const Tensor& global) const;
  // The model's parameters as full plain tensors, in named_parameters() order. Collective: every
  // rank calls it (rank 0 then writes).
  NamedTensors full_state() const;

  // The pieces, made by parallelize_job (use that).
  ParallelJob(Module& model, Plan plan, PlanMesh plan_mesh, DeviceMesh mesh, Parallelized par, GradReducer reducer,
              std::string input_module);

 private:
  Module* model_;
};

// Reads the plan file, resolves its mesh for the mpirun world (errors name the file and the world
// size), parallelizes `model` (built on meta, or loaded whole: see parallelize()) and hooks a
// GradReducer. `model` must outlive the job.
[[nodiscard]] ParallelJob parallelize_from_file(Module& model, const std::string& plan_path,
                                                ParallelJobOptions options = {});
// The same from a plan built in C++ (or parsed already).
[[nodiscard]] ParallelJob parallelize_job(Module& model, Plan plan, ParallelJobOptions options = {});

}  // namespace mt
