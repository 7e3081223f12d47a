#include "plan/grad_sync.h"

#include <algorithm>

#include "mesh/dtensor.h"
#include "tensor/autograd.h"

namespace mt {

namespace {

// The mesh dims over which `g` (a DTensor gradient) is Partial, as bits.
uint32_t partial_mask(const Tensor& g) {
  if (!g.defined() || !g.is_distributed()) return 0;
  const Placements& ps = dtensor_spec(g, "sync_gradients").placements();
  uint32_t m = 0;
  for (size_t d = 0; d < ps.size(); ++d)
    if (ps[d].is_partial()) m |= 1u << d;
  return m;
}

}  // namespace

int sync_gradients(Module& model) {
  NoGradGuard ng;
  std::vector<std::pair<std::string, Tensor>> params;
  for (auto& [name, p] : model.named_parameters())
    if (p.is_distributed()) params.emplace_back(name, p);
  if (params.empty()) return 0;
  const DeviceMesh& mesh = dtensor_spec(params.front().second, "sync_gradients").mesh();
  for (const auto& [name, p] : params)
    MT_CHECK(dtensor_spec(p, "sync_gradients").mesh().str() == mesh.str(),
             "sync_gradients: parameter '{}' lives on {}, the others on {}: one mesh per call", name,
             dtensor_spec(p, "sync_gradients").mesh().str(), mesh.str());
  // Which parameters got a gradient on some rank, and over which mesh dims some rank's is Partial:
  // under expert parallelism a rank whose tokens skipped an expert has no gradient for it while
  // others hold a Partial one, and every rank must take part in the same collectives (one small
  // all_reduce(max) on the host; the GradReducer agrees the same way).
  const auto n = static_cast<int64_t>(params.size());
  const int64_t w = 1 + mesh.ndim();
  Tensor flags = zeros({n, w}, DType::kI64);
  int64_t* f = flags.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const Tensor g = params[static_cast<size_t>(i)].second.grad();
    f[i * w] = g.defined() ? 1 : 0;
    const uint32_t m = partial_mask(g);
    for (int d = 0; d < mesh.ndim(); ++d) f[i * w + 1 + d] = (m >> d) & 1;
  }
  mesh.comm().all_reduce(flags, CommReduceOp::kMax);
  int reduced = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto& [name, p] = params[static_cast<size_t>(i)];
    if (f[i * w] == 0) continue;  // no gradient anywhere (an expert no token picked): none, as on one device
    const DTensorSpec& ps = dtensor_spec(p, "sync_gradients");
    uint32_t agreed = 0;
    for (int d = 0; d < mesh.ndim(); ++d)
      if (f[i * w + 1 + d]) agreed |= 1u << d;
    Tensor g = p.grad();
    if (!g.defined()) {
      // Zeros where the others hold Partial terms: this rank's term of the sum.
      Placements src = ps.placements();
      for (int d = 0; d < mesh.ndim(); ++d)
        if ((agreed >> d) & 1) src[static_cast<size_t>(d)] = Placement::partial();
      g = from_local(zeros(intern_spec(mesh, src, ps.global_shape())->local_shape(), p.options()), mesh, src,
                     ps.global_shape());
    } else if (!g.is_distributed()) {
      g = from_local(g, mesh, ps.placements(), ps.global_shape());
    }
    MT_CHECK(partial_mask(g) == agreed,
             "sync_gradients: the gradient of '{}' is {} on this rank, but Partial over other mesh dims elsewhere "
             "(parameter {})", name, dtensor_spec(g, "sync_gradients").placements_str(), ps.placements_str());
    if (g.dist_spec() == p.dist_spec()) continue;
    p.set_grad(redistribute(g, ps.placements()));
    ++reduced;
  }
  return reduced;
}

}  // namespace mt
