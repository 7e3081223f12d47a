// check_plan_forward: parallelize + one forward on meta tensors over a simulated mesh (check.h).
#include "plan/check.h"

#include "kernels/registry.h"
#include "mesh/device_mesh.h"
#include "plan/lower.h"
#include "plan/parallelize.h"
#include "runtime/error.h"
#include "tensor/autograd.h"

namespace mt {

void check_plan_forward(const Plan& plan, const PlanMesh& mesh,
                        const std::function<std::shared_ptr<Module>()>& build_meta_model,
                        const std::vector<Tensor>& example_inputs, const AfterForward& after_forward) {
  // The coordinates to run: all of a small mesh, else the first and the last (uneven shards put
  // the short ones last).
  std::vector<std::vector<int64_t>> coords;
  const int64_t n = mesh.size();
  for (int64_t r = 0; r < n; ++r) {
    if (n > 8 && r != 0 && r != n - 1) continue;
    coords.push_back(mesh.coordinate_of(r));
  }
  for (const auto& c : coords) {
    DeviceMesh sim = DeviceMesh::simulated(mesh.shape, mesh.names, c);
    std::shared_ptr<Module> model = build_meta_model();
    MT_CHECK(model != nullptr, "check_plan_forward: the model builder returned null");
    model->eval();
    MetaKernelsGuard meta;
    NoGradGuard no_grad;
    try {
      Parallelized par = parallelize(*model, plan, sim, Device::meta());
      const std::vector<Tensor> out = (*model)(example_inputs);
      if (after_forward) after_forward(out, par, sim);
    } catch (const Error& e) {
      MT_FAIL("{}: a forward under the plan on mesh {} at coordinate {} fails: {}", plan.source(), mesh.str(),
              sim.coordinate_shape(), e.what());
    }
  }
}

}  // namespace mt
