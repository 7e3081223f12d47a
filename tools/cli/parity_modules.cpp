// `meshtrain parity --per-module` (see parity_modules.h).
#include "tools/cli/parity_modules.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>

#include "mesh/communicator.h"
#include "mesh/dtensor.h"
#include "tensor/autograd.h"
#include "tensor/random.h"
#include "tools/cli/parity_report.h"

namespace mt::cli {
namespace {

// The first output and the input gradient of every module, in forward order.
struct Recorder {
  std::vector<std::string> order;
  std::map<std::string, Tensor> outputs, input_grads;
  std::vector<HookHandle> handles;

  void attach(Module& root) {
    for (auto& [path, m] : root.named_modules()) {
      const std::string name = path.empty() ? "(model)" : path;
      handles.push_back(m->register_forward_hook([this, name](Module&, const std::vector<Tensor>&,
                                                              std::vector<Tensor>& out) {
        if (outputs.count(name) || out.empty() || !out[0].defined()) return;
        order.push_back(name);
        outputs[name] = out[0].detach();
      }));
      handles.push_back(m->register_backward_hook([this, name](Module&, std::vector<Tensor>& grad_in,
                                                               const std::vector<Tensor>&) {
        if (input_grads.count(name) || grad_in.empty() || !grad_in[0].defined()) return;
        input_grads[name] = grad_in[0].detach();
      }));
    }
  }
  void detach() {
    for (auto& h : handles) h.remove();
  }
};

// What one rank knows of one recorded tensor: comparable here, max |diff|, a checksum of the
// parallel values (equal on every rank when the plain tensor is replicated), max |reference|.
struct Local {
  double comparable = 0, diff = 0, checksum = 0, scale = 0;
};
constexpr size_t kSlot = 5;  // per (module, kind, rank): held, then Local's four

// Whether this rank holds the whole module `name`: always, except under a pipeline plan, where a
// rank holds the modules of its stage's units (every chunk's under interleaving) and the
// containers that span stages (the root, `model`) are whole on none.
std::function<bool(const std::string&)> held_here(const PlanContext& ctx) {
  if (!ctx.is_pipeline()) return [](const std::string&) { return true; };
  std::vector<std::string> units;
  for (int64_t v = 0; v < ctx.pipeline->virtual_stages; ++v) {
    const PipelineStage& c = ctx.pipeline->chunk(ctx.stage, v);
    for (int64_t u = c.first; u < c.last; ++u) units.push_back(ctx.pipeline->units[static_cast<size_t>(u)].path);
  }
  return [units](const std::string& name) {
    for (const std::string& u : units)
      if (name == u || name.rfind(u + ".", 0) == 0) return true;
    return false;
  };
}

Local measure(const Tensor& par, const Tensor& ref) {
  Local l;
  if (!par.defined() || !ref.defined() || !is_floating(ref.dtype())) return l;
  Tensor p = par.is_distributed() ? full_tensor(par) : par;  // collective for a DTensor
  if (p.shape() != ref.shape()) return l;
  const std::vector<double> a = p.to_vector<double>(), b = ref.to_vector<double>();
  l.comparable = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) d = 1e300;
    l.diff = std::max(l.diff, d);
    l.checksum += a[i] * static_cast<double>(i % 7 + 1);
    l.scale = std::max(l.scale, std::fabs(b[i]));
  }
  if (par.is_distributed()) l.checksum = 0;  // gathered: the same everywhere by construction
  return l;
}

}  // namespace

nlohmann::json per_module_check(CausalLM& model, Trainer& trainer, CausalLM& ref_model, Trainer& ref_trainer,
                                const std::function<TokenBatch()>& next, const std::function<TokenBatch()>& ref_next,
                                int64_t step, const PlanContext& ctx, double tol) {
  {
    // The reference's weights into the parallel model (each rank its shards), so that what
    // differs below comes from this one pass, not from earlier steps.
    NoGradGuard no_grad;
    NamedTensors full;
    for (const auto& [name, p] : ref_trainer.master().master_params()) full.emplace_back(name, p.detach());
    NamedTensors sharded = shard_like(full, trainer.master().master_params());
    std::map<std::string, Tensor> by_name(sharded.begin(), sharded.end());
    for (const auto& [name, p] : trainer.master().master_params()) {
      const Tensor& src = by_name.at(name);
      Tensor dst = p.is_distributed() ? to_local(p.detach()) : p.detach();
      dst.copy_(src.is_distributed() ? to_local(src) : src);
    }
    trainer.master().master_to_model();
    model.zero_grad();
    ref_model.zero_grad();
  }
  Recorder par_rec, ref_rec;
  par_rec.attach(model);
  ref_rec.attach(ref_model);
  const uint64_t offset = default_generator().offset();
  trainer.gradients(step, next);
  default_generator().set_offset(offset);
  ref_trainer.gradients(step, ref_next);
  par_rec.detach();
  ref_rec.detach();

  // Per module: output and input gradient, each rank's Local summed over the mesh by slots. Under
  // a pipeline plan only the ranks of the stage that holds a module measure it (their gathers run
  // over that stage's mesh), and the slots are summed over the whole world.
  const size_t n = ref_rec.order.size(), world = static_cast<size_t>(ctx.world);
  const auto held = held_here(ctx);
  std::vector<double> slots(n * 2 * world * kSlot, 0.0);
  auto slot = [&](size_t i, size_t kind, size_t rank) { return ((i * 2 + kind) * world + rank) * kSlot; };
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = ref_rec.order[i];
    if (!held(name)) continue;
    const Tensor none;
    for (size_t kind = 0; kind < 2; ++kind) {
      auto& pm = kind == 0 ? par_rec.outputs : par_rec.input_grads;
      auto& rm = kind == 0 ? ref_rec.outputs : ref_rec.input_grads;
      const Tensor& p = pm.count(name) ? pm.at(name) : none;
      const Tensor& r = rm.count(name) ? rm.at(name) : none;
      Local l = measure(p, r);
      const size_t s = slot(i, kind, static_cast<size_t>(ctx.rank));
      slots[s] = 1, slots[s + 1] = l.comparable, slots[s + 2] = l.diff, slots[s + 3] = l.checksum, slots[s + 4] = l.scale;
    }
  }
  if (world > 1 && n > 0) {
    Tensor t = from_vector<double>(slots, Shape{static_cast<int64_t>(slots.size())});
    world_comm(ctx).all_reduce(t);
    slots = t.to_vector<double>();
  }
  // rel for (module i, kind) over the ranks that hold the module, or null when none does, one
  // could not compare it, or the plain values differ between them (a shard or a partial sum).
  auto rel = [&](size_t i, size_t kind) -> nlohmann::json {
    double diff = 0, scale = 0;
    const size_t none = world;
    size_t first = none;
    for (size_t r = 0; r < world; ++r) {
      const size_t s = slot(i, kind, r);
      if (slots[s] != 1) continue;
      if (first == none) first = r;
      if (slots[s + 1] != 1 || slots[s + 3] != slots[slot(i, kind, first) + 3]) return nullptr;
      diff = std::max(diff, slots[s + 2]);
      scale = std::max(scale, slots[s + 4]);
    }
    if (first == none) return nullptr;
    const double x = relative_diff(diff, scale);
    return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(1e300);
  };
  nlohmann::json out = {{"modules", nlohmann::json::array()}, {"first_difference", nullptr}};
  std::vector<nlohmann::json> grads(n);
  for (size_t i = 0; i < n; ++i) {
    nlohmann::json o = rel(i, 0);
    grads[i] = rel(i, 1);
    out["modules"].push_back({{"module", ref_rec.order[i]}, {"output_rel", o}, {"input_grad_rel", grads[i]}});
    if (out["first_difference"].is_null() && o.is_number() && o.get<double>() > tol)
      out["first_difference"] = {{"module", ref_rec.order[i]}, {"what", fmt::format("output rel {:.2e}", o.get<double>())}};
  }
  for (size_t k = n; k-- > 0 && out["first_difference"].is_null();)
    if (grads[k].is_number() && grads[k].get<double>() > tol)
      out["first_difference"] = {{"module", ref_rec.order[k]},
                                 {"what", fmt::format("input gradient rel {:.2e}", grads[k].get<double>())}};
  return out;
}

}  // namespace mt::cli
