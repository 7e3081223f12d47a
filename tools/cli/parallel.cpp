// --plan helpers for the meshtrain subcommands (see parallel.h).
#include "tools/cli/parallel.h"

#include <cstdio>
#include <map>

#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "runtime/error.h"

namespace mt::cli {

PlanContext load_plan_context(const std::string& path) {
  PlanContext ctx;
  ctx.path = path;
  ctx.rank = world().rank();
  ctx.world = world().size();
  ctx.plan = load_plan(path);
  try {
    ctx.plan_mesh = ctx.plan.resolve_mesh(ctx.world);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.find(path) != std::string::npos) throw;
    MT_FAIL("{}: {} (mpirun -np {})", path, what, ctx.world);
  }
  ctx.mesh = std::make_shared<DeviceMesh>(ctx.plan_mesh.shape, ctx.plan_mesh.names);
  return ctx;
}

void quiet_non_root(const PlanContext& ctx) {
  if (ctx.is_root()) return;
  std::fflush(stdout);
  if (!std::freopen("/dev/null", "w", stdout)) MT_FAIL("cannot redirect stdout of rank {}", ctx.rank);
}

Tensor place_input(const Tensor& global, const Parallelized& par, const PlanContext& ctx) {
  return distribute_tensor(global, *ctx.mesh, par.input_placements("model"));
}

NamedTensors full_tensors(const NamedTensors& tensors) { return mt::full_tensors(tensors); }

NamedTensors shard_like(const NamedTensors& full, const NamedTensors& live) {
  std::map<std::string, Tensor> by_name(full.begin(), full.end());
  NamedTensors out;
  for (const auto& [name, l] : live) {
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;
    if (!l.is_distributed()) {
      out.emplace_back(name, it->second);
      continue;
    }
    const DTensorSpec& spec = dtensor_spec(l, "--resume");
    MT_CHECK(it->second.shape() == spec.global_shape(), "--resume: checkpoint tensor {} has shape {}, expected {}",
             name, it->second.shape(), spec.global_shape());
    out.emplace_back(name, distribute_tensor(it->second.to(l.dtype()), spec.mesh(), spec.placements()));
  }
  return out;
}

double scalar_value(const Tensor& t) { return full_item(t); }

}  // namespace mt::cli
