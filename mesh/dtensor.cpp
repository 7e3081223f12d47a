#include "mesh/dtensor.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "kernels/cost.h"
#include "mesh/dispatch.h"
#include "mesh/redistribute.h"
#include "mesh/shard_layout.h"
#include "mesh/world.h"
#include "runtime/error.h"
#include "tensor/autograd.h"

namespace mt {

namespace {


std::string spec_key(const DeviceMesh& mesh, const Placements& placements, const Shape& shape) {
  std::string key = mesh.str();
  key += '|';
  key += mesh.world_ranks_key();
  key += '|';
  key += placements_str(placements);
  key += fmt::format("|{}", shape);
  // A simulated mesh (plan checks) is one rank of a world that is not running: its specs (local
  // shapes, no communicators) are its own, per coordinate.
  if (mesh.is_simulated()) key += fmt::format("|simulated at {}", mesh.coordinate_shape());
  return key;
}

// A DTensor over `local`'s storage (a fresh impl: `local` itself stays plain).
Tensor wrap(const Tensor& local, std::shared_ptr<const DTensorSpec> spec) {
  Tensor out = local.detach();
  out.impl()->dist = std::move(spec);
  return out;
}

// The placements a gradient of a DTensor with `ps` is brought to: Partial becomes Replicate (the
// gradient of every term of a sum is the gradient of the sum), the others stay.
Placements grad_placements(const Placements& ps) {
  Placements g = ps;
  for (auto& p : g)
    if (p.is_partial()) p = Placement::replicate();
  return g;
}

// The local tensor of gradient `g` for a DTensor of `spec`, under placements `want`. A gradient
// without a spec (a zero fill, or an op that does not know DTensors) is taken as being `want`.
Tensor grad_local(const Tensor& g, const DTensorSpec& spec, const Placements& want) {
  const DistSpec* ds = g.dist_spec();
  if (!ds) return g;
  const auto* gs = dynamic_cast<const DTensorSpec*>(ds);
  MT_ASSERT(gs, "gradient carries a foreign DistSpec {}", ds->str());
  MT_CHECK(gs->global_shape() == spec.global_shape(),
           "DTensor gradient: global shape {} does not match {}", gs->global_shape(), spec.global_shape());
  if (gs->placements() == want) return local_view(g.detach());
  return redistribute_local(local_view(g.detach()), spec.global_shape(), gs->placements(), want, spec.mesh());
}

// The gradient of a local term of P(avg|max|min) is not the gradient of the reduction (1/k, or a
// mask): from_local / to_local do not differentiate through those yet.
void check_local_grad(const Placements& ps, const char* op) {
  for (const auto& p : ps)
    MT_CHECK(!p.is_partial() || p.reduce_op() == PartialOp::kSum,
             "{}: gradient through the local term of {} is not supported (placements {}); "
             "redistribute to Replicate first", op, p.str(), placements_str(ps));
}

}  // namespace

Shape DTensorSpec::local_shape() const {
  return local_layout(global_shape_, placements_, mesh_.shape(), mesh_.coordinate_shape()).local_shape;
}

std::string DTensorSpec::placements_str() const { return mt::placements_str(placements_); }

bool DTensorSpec::is_replicated() const {
  for (const auto& p : placements_)
    if (!p.is_replicate()) return false;
  return true;
}

bool DTensorSpec::has_partial() const {
  for (const auto& p : placements_)
    if (p.is_partial()) return true;
  return false;
}

std::shared_ptr<const DistSpec> DTensorSpec::grad_spec() const {
  if (grad_) return grad_;
  return shared_from_this();
}

std::string DTensorSpec::str() const {
  return fmt::format("DTensorSpec({}, {}, {})", mesh_.str(), mt::placements_str(placements_), global_shape_);
}

namespace {

// A spec that fits some ranks' shards but not others' (an interleaved or ragged split of a dim an
// earlier split left uneven) would be refused by some ranks only, and the others would wait in the
// next collective until its timeout: the layout is checked at every coordinate, with no
// communication (this rank's first, so its error names its own shard). Meshes of more than 1024
// ranks (estimates' simulated meshes of thousands) are checked at this rank and the mesh's corners,
// where chunk sizes change.
void validate_everywhere(const DeviceMesh& mesh, const Placements& placements, const Shape& global_shape) {
  const Shape shape = mesh.shape();
  (void)local_layout(global_shape, placements, shape, mesh.coordinate_shape());
  const int nd = shape.size();
  const int64_t n = mesh.size();
  const bool all = n <= 1024;
  const int64_t count = all ? n : (int64_t{1} << std::min(nd, 20));
  Shape coord = shape;
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i;
    for (int d = nd - 1; d >= 0; --d) {
      if (all) {
        coord[d] = rest % shape[d];
        rest /= shape[d];
      } else {
        coord[d] = (rest & 1) ? shape[d] - 1 : 0;
        rest >>= 1;
      }
    }
    (void)local_layout(global_shape, placements, shape, coord);
  }
}

// The interned specs, held weakly: a spec lives while a tensor, another spec (a Partial one's
// gradient spec) or a propagation cache entry holds it. Expired entries are swept when the table
// has doubled since the last sweep, so it stays within twice the live specs (or kSweepFloor).
struct SpecTable {
  static constexpr size_t kSweepFloor = 1024;
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<const DTensorSpec>> specs;
  size_t sweep_at = kSweepFloor;
  uint64_t next_id = 1;
};
SpecTable& spec_table() {
  static auto* t = new SpecTable;  // never destroyed: specs may be released during static destruction
  return *t;
}

}  // namespace

std::shared_ptr<const DTensorSpec> intern_spec(const DeviceMesh& mesh, const Placements& placements,
                                               const Shape& global_shape) {
  SpecTable& t = spec_table();
  std::string key = spec_key(mesh, placements, global_shape);
  {
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.specs.find(key);
    if (it != t.specs.end())
      if (auto live = it->second.lock()) return live;
  }
  MT_CHECK(static_cast<int>(placements.size()) == mesh.ndim(),
           "DTensor: {} placements {} for mesh {}", placements.size(), placements_str(placements), mesh.str());
  validate_everywhere(mesh, placements, global_shape);
  auto spec = std::make_shared<DTensorSpec>(mesh, placements, global_shape);
  if (spec->has_partial()) spec->grad_ = intern_spec(mesh, grad_placements(placements), global_shape);
  install_dist_dispatch();
  std::lock_guard<std::mutex> lock(t.mu);
  std::weak_ptr<const DTensorSpec>& slot = t.specs[std::move(key)];
  if (auto live = slot.lock()) return live;  // another thread interned it meanwhile
  spec->id_ = t.next_id++;
  slot = spec;
  if (t.specs.size() >= t.sweep_at) {
    std::erase_if(t.specs, [](const auto& kv) { return kv.second.expired(); });
    t.sweep_at = std::max(SpecTable::kSweepFloor, 2 * t.specs.size());
  }
  return spec;
}

size_t live_spec_count() {
  SpecTable& t = spec_table();
  std::lock_guard<std::mutex> lock(t.mu);
  return static_cast<size_t>(
      std::count_if(t.specs.begin(), t.specs.end(), [](const auto& kv) { return !kv.second.expired(); }));
}

const DTensorSpec& dtensor_spec(const Tensor& t, const char* op) {
  MT_CHECK(t.defined(), "{}: undefined tensor", op);
  const DistSpec* ds = t.dist_spec();
  MT_CHECK(ds, "{}: expected a DTensor, got a local tensor of shape {}", op, t.shape());
  const auto* s = dynamic_cast<const DTensorSpec*>(ds);
  MT_CHECK(s, "{}: unknown distributed spec {}", op, ds->str());
  return *s;
}

namespace {

// intern_spec for an API call: its errors (a placement the shape or the mesh cannot take) start
// with the call, not with the layout check inside (they read "local_layout: ..." until 2026-12-07).
std::shared_ptr<const DTensorSpec> spec_for(const std::string& call, const DeviceMesh& mesh, const Placements& placements,
                                            const Shape& global_shape) {
  try {
    return intern_spec(mesh, placements, global_shape);
  } catch (const Error& e) {
    MT_FAIL("{}: {}", call, e.what());
  }
}

}  // namespace

Tensor distribute_tensor(const Tensor& global, const DeviceMesh& mesh, const Placements& placements) {
  MT_CHECK(global.defined(), "distribute_tensor: undefined tensor");
  MT_CHECK(!global.is_distributed(), "distribute_tensor: input is already a DTensor ({})",
           global.dist_spec()->str());
  auto spec = spec_for(fmt::format("distribute_tensor(global shape {}, {})", global.shape(), placements_str(placements)),
                       mesh, placements, global.shape());
  NoGradGuard ng;
  Tensor local = local_shard(global.detach(), placements, mesh.shape(), mesh.coordinate_shape());
  return wrap(local, std::move(spec));
}

Tensor from_local(const Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                  const Shape& global_shape) {
  MT_CHECK(local.defined(), "from_local: undefined tensor");
  MT_CHECK(!local.is_distributed(), "from_local: input is already a DTensor ({})", local.dist_spec()->str());
  auto spec = spec_for(fmt::format("from_local(global shape {}, {})", global_shape, placements_str(placements)), mesh,
                       placements, global_shape);
  Shape want = spec->local_shape();
  MT_CHECK(local.shape() == want,
           "from_local: rank {} (mesh coordinates {}) expected local shape {} for global shape {} "
           "under {}, got {}",
           world().rank(), mesh.coordinate_shape(), want, global_shape, placements_str(placements), local.shape());
  Tensor out = wrap(local, spec);
  if (needs_grad(local)) {
    check_local_grad(placements, "from_local");
    record("FromLocalBackward", {local}, out, [spec](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{grad_local(g[0], *spec, grad_placements(spec->placements()))};
    });
  }
  return out;
}

Tensor to_local(const Tensor& dt) { return to_local(dt, {}); }

Tensor to_local(const Tensor& dt, const Placements& grad_placements_in) {
  const DTensorSpec& s = dtensor_spec(dt, "to_local");
  Tensor out = dt.detach();
  out.impl()->dist = nullptr;
  if (needs_grad(dt)) {
    check_local_grad(s.placements(), "to_local");
    // The plain local gradient of the shard is a DTensor gradient with the input's placements,
    // Partial mapped to Replicate (the gradient of each term is the gradient of the reduction),
    // unless the caller says otherwise.
    Placements gp = grad_placements_in.empty() ? grad_placements(s.placements()) : grad_placements_in;
    MT_CHECK(gp.size() == s.placements().size(), "to_local: {} gradient placements {} for a DTensor on a {}-D mesh",
             gp.size(), placements_str(gp), s.placements().size());
    for (size_t d = 0; d < gp.size(); ++d)
      MT_CHECK(gp[d].is_partial() ? !s.placements()[d].splits() : gp[d] == grad_placements({s.placements()[d]})[0],
               "to_local: gradient placements {} do not fit the DTensor's {} (mesh dim {}: only a replicated "
               "dim may take a Partial gradient)",
               placements_str(gp), placements_str(s.placements()), d);
    auto spec = intern_spec(s.mesh(), gp, s.global_shape());
    record("ToLocalBackward", {dt}, out, [spec](const std::vector<Tensor>& g) {
      if (g[0].is_distributed()) return std::vector<Tensor>{g[0]};
      return std::vector<Tensor>{wrap(g[0], spec)};
    });
  }
  return out;
}

Tensor redistribute(const Tensor& dt, const Placements& dst) {
  count_host_call(HostCall::kRedistribute);  // the estimate's per-call host cost (kernels/cost.h)
  const DTensorSpec& s = dtensor_spec(dt, "redistribute");
  MT_CHECK(dst.size() == s.placements().size(), "redistribute: {} destination placements {} for mesh {}",
           dst.size(), placements_str(dst), s.mesh().str());
  auto src_spec = intern_spec(s.mesh(), s.placements(), s.global_shape());
  auto dst_spec = spec_for(fmt::format("redistribute({} -> {}, global shape {})", placements_str(s.placements()),
                                       placements_str(dst), s.global_shape()),
                           s.mesh(), dst, s.global_shape());
  Tensor local = dt.detach();
  local.impl()->dist = nullptr;
  Tensor out_local = redistribute_local(local, s.global_shape(), s.placements(), dst, s.mesh());
  Tensor out = wrap(out_local, dst_spec);
  if (needs_grad(dt)) {
    auto gdst_spec = intern_spec(s.mesh(), grad_placements(dst), s.global_shape());
    record("RedistributeBackward", {dt}, out, [src_spec, gdst_spec](const std::vector<Tensor>& g) {
      // The gradient arrives as a DTensor (a plain one is taken as grad_placements(dst)) and goes back
      // to the source placements with Partial mapped to Replicate. Not differentiable (wrap detaches):
      // double backward through DTensors is not supported (docs/dtensor.md).
      const Placements want = grad_placements(src_spec->placements());
      Tensor gd = g[0].is_distributed() ? g[0] : wrap(g[0], gdst_spec);
      return std::vector<Tensor>{redistribute(gd, want)};
    });
  }
  return out;
}

Tensor full_tensor(const Tensor& dt) {
  const DTensorSpec& s = dtensor_spec(dt, "full_tensor");
  return to_local(redistribute(dt, Placements(s.placements().size(), Placement::replicate())));
}

std::vector<std::pair<std::string, Tensor>> full_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.emplace_back(name, t.is_distributed() ? full_tensor(t.detach()) : t);
  return out;
}

double full_item(const Tensor& t) { return t.is_distributed() ? full_tensor(t.detach()).item() : t.item(); }

}  // namespace mt
