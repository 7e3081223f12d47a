#include "plan/grad_sync.h"

#include "mesh/dtensor.h"
#include "tensor/autograd.h"

namespace mt {

int sync_gradients(Module& model) {
  NoGradGuard ng;
  int n = 0;
  for (auto& [name, p] : model.named_parameters()) {
    Tensor g = p.grad();
    if (!g.defined() || !p.is_distributed() || g.dist_spec() == p.dist_spec()) continue;
    const DTensorSpec& ps = dtensor_spec(p, "sync_gradients");
    Tensor gd = g.is_distributed() ? g : from_local(g, ps.mesh(), ps.placements(), ps.global_shape());
    p.set_grad(redistribute(gd, ps.placements()));
    ++n;
  }
  return n;
}

}  // namespace mt
