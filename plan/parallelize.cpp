// parallelize(): parameters become shard-only DTensors (the TensorImpl is reused so that module
// members, optimizers and state dicts see them), and the IR's records become module hooks, one
// closure per module and hook point (the fused records of that module). See parallelize.h for
// what each record does at run time.
#include "plan/parallelize.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "mesh/dispatch.h"
#include "mesh/dtensor.h"
#include "mesh/redistribute.h"
#include "mesh/shard_layout.h"
#include "plan/expert_dispatch.h"
#include "plan/fsdp_buffer.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/moe.h"

namespace mt {

namespace {

// Factory scopes in effect on this thread, each with the Parallelized that pushed it (an id): a
// forward that throws skips the forward hook that pops its scopes, so a hook drops its own stale
// scopes before pushing again, and remove() drops all of its handle's.
struct OwnedScope {
  const void* owner;
  FactoryScope scope;
  bool used = false;  // current_factory() returned it during the module's forward
};
thread_local std::vector<OwnedScope> g_factories;

// parallelize() results whose hooks are installed, and whether there ever was one: DTensor op
// errors while none is alive get a note (a dropped result removes the hooks; see parallelize.h).
std::atomic<int> g_live_results{0};
std::atomic<bool> g_ever_parallelized{false};

std::string dropped_result_note() {
  if (!g_ever_parallelized.load() || g_live_results.load() > 0) return {};
  return " (note: no parallelize() result is alive, so no plan hooks run: if this model was parallelized, keep "
         "the returned Parallelized or ParallelJob alive while it trains)";
}

std::string where(const HookRecord& r, const PlanMesh& pm) {
  std::string from;
  for (const auto& f : r.from) { from += from.empty() ? "" : ", "; from += f.str(); }
  return fmt::format("{} (plan {})", r.str(pm), from.empty() ? "?" : from);
}

// Runs one record's action; an error names the record and its plan lines. ModuleError: the
// modules around the hook leave the message as it is (tensor/module.h).
template <class Fn>
void run_record(const HookRecord& r, const PlanMesh& pm, Fn&& fn) {
  try {
    fn();
  } catch (const ModuleError&) {
    throw;
  } catch (const Error& e) {
    throw ModuleError(fmt::format("{}; in plan hook {}", e.what(), where(r, pm)));
  }
}

// Per module path, the plan entries whose records concern it or its submodules (parameters
// placed, inputs/outputs, factories), as "file:line:col `entry`", in plan order; "" when none.
// These become the modules' error notes: an op that fails inside a forward names them.
std::map<std::string, std::string> error_notes(const HookIR& ir, const Plan& plan, Module& model) {
  std::map<std::string, std::string> text;  // loc -> entry in file syntax
  std::map<std::string, size_t> order;
  for (size_t i = 0; i < plan.entries().size(); ++i) {
    const PlanEntry& e = plan.entries()[i];
    text[e.loc.str()] = e.str();
    order[e.loc.str()] = i;
  }
  // Each record's entries go to its module and every ancestor ("a.b.c", "a.b", "a", ""): one pass
  // over the records (per module over all records was quadratic: seconds for a 127-layer model).
  std::unordered_map<std::string, std::vector<std::string>> by_path;
  for (const HookRecord& r : ir.records) {
    std::string p = r.module;
    while (true) {
      std::vector<std::string>& v = by_path[p];
      for (const PlanLoc& f : r.from) {
        std::string loc = f.str();
        if (std::find(v.begin(), v.end(), loc) == v.end()) v.push_back(std::move(loc));
      }
      if (p.empty()) break;
      const size_t dot = p.rfind('.');
      p = dot == std::string::npos ? std::string() : p.substr(0, dot);
    }
  }
  auto entries_of = [&](const std::string& path, size_t shown) {
    std::vector<std::string> locs = by_path[path];
    std::stable_sort(locs.begin(), locs.end(), [&](const std::string& a, const std::string& b) {
      return order.count(a) && order.count(b) ? order[a] < order[b] : a < b;
    });
    std::string out;
    for (size_t i = 0; i < std::min(shown, locs.size()); ++i) {
      out += i ? "; " : "";
      out += text.count(locs[i]) ? fmt::format("{} `{}`", locs[i], text[locs[i]]) : locs[i];
    }
    if (locs.size() > shown) out += fmt::format("; ... ({} more)", locs.size() - shown);
    return out;
  };
  auto parent_of = [](const std::string& p) {
    const size_t dot = p.rfind('.');
    return dot == std::string::npos ? std::string() : p.substr(0, dot);
  };
  // Children in registration order (roughly the forward's), per parent path.
  std::unordered_map<std::string, std::vector<std::string>> children;
  const auto modules = model.named_modules();
  for (const auto& [path, m] : modules)
    if (!path.empty()) children[parent_of(path)].push_back(path);
  // The nearest module before `path` in the model that has plan entries: a preceding sibling of it
  // or of one of its ancestors, nearest first. A module often fails on an input whose placement
  // an earlier module's entry made (an embedding's S(1) meeting a norm): until 2026-11-28 the note
  // named only the failing module's own entries, which were not at fault.
  auto before = [&](const std::string& path) -> std::string {
    for (std::string a = path; !a.empty(); a = parent_of(a)) {
      const std::vector<std::string>& sib = children[parent_of(a)];
      auto it = std::find(sib.begin(), sib.end(), a);
      while (it != sib.begin()) {
        --it;
        auto f = by_path.find(*it);
        if (f != by_path.end() && !f->second.empty()) return *it;
      }
    }
    return "";
  };
  std::map<std::string, std::string> notes;
  for (const auto& [path, m] : modules) {
    auto found = by_path.find(path);
    if (found == by_path.end() || found->second.empty()) continue;
    std::string note = "plan entries for it and its submodules: " + entries_of(path, 6);
    const std::string prev = before(path);
    if (!prev.empty())
      note += fmt::format("; before it in the model, '{}' (its outputs may be this module's inputs): {}", prev,
                          entries_of(prev, 3));
    notes[path] = std::move(note);
  }
  return notes;
}

thread_local bool t_skip_shard_init = false;

// The parameter `p` becomes a DTensor of `ps` whose storage is this rank's shard.
void shard_parameter(const std::string& path, const Tensor& p, const InitRecord* rec, const DeviceMesh& mesh,
                     const Placements& ps, Device device) {
  auto spec = intern_spec(mesh, ps, p.shape());
  LocalLayout lay = local_layout(p.shape(), ps, mesh.shape(), mesh.coordinate_shape());
  Tensor local;
  if (p.is_meta()) {
    MT_CHECK(rec != nullptr,
             "parallelize: parameter {} is on the meta device but has no init record (registered directly); "
             "materialize or load it before parallelize",
             path);
    local = empty(lay.local_shape, TensorOptions(p.dtype()).with_device(device));
    if (!t_skip_shard_init)
      for (const ShardPiece& piece : lay.pieces) {
        Tensor v = block_view(local, piece.local_offset, piece.sizes);
        rec->fill(v, piece.global_base, lay.global_strides);
      }
  } else {
    NoGradGuard ng;
    local = local_shard(p.detach(), ps, mesh.shape(), mesh.coordinate_shape()).to(device);
  }
  MT_CHECK(!p.grad_fn(), "parallelize: parameter {} has autograd history", path);
  if (p.grad().defined()) p.set_grad(Tensor());
  TensorImpl* impl = p.impl();
  impl->storage = local.impl()->storage;
  impl->sizes = local.shape();
  impl->strides = local.strides();
  impl->offset = local.offset();
  impl->device = local.device();
  impl->dtype = local.dtype();
  impl->dist = std::move(spec);
}

// The model's shard units (Module::declare_shard_unit, e.g. whole attention heads) against the
// placements each parameter is computed with (RUN if the plan gathers it, else INIT): checked for
// every parameter before any is sharded, so that a plan that cannot work at this world size fails
// here, naming the plan line, rather than inside a view rule at the first forward. Even splits of
// whole units only (stricter than chunk semantics, which could leave a rank without a head).
void check_shard_units(const Module& model, const HookIR& ir, const DeviceMesh& mesh) {
  const std::vector<Module::ShardUnit> units = model.shard_units();
  if (units.empty()) return;
  std::map<std::string, const HookRecord*> compute;  // parameter path -> its compute-time record
  for (const HookRecord& r : ir.records) {
    if (r.action != HookAction::kInit && r.action != HookAction::kGather) continue;
    std::string path = r.module.empty() ? r.tensor : r.module + "." + r.tensor;
    if (r.action == HookAction::kGather || !compute.count(path)) compute[path] = &r;
  }
  for (const Module::ShardUnit& u : units) {
    auto it = compute.find(u.param);
    if (it == compute.end() || !it->second->dst) continue;
    const HookRecord& r = *it->second;
    const Shape shape = model.get_parameter(u.param).shape();  // global: not sharded yet
    if (u.dim >= shape.size()) continue;
    int64_t extent = shape[u.dim];
    for (int i = 0; i < mesh.ndim(); ++i) {
      const Placement& p = (*r.dst)[static_cast<size_t>(i)];
      if (!p.is_shard() || p.dim() != u.dim) continue;
      const int64_t k = mesh.size(i), units_here = extent / u.size;
      MT_CHECK(extent % u.size == 0 && units_here % k == 0,
               "parallelize: parameter {} {} is split {} over mesh dim '{}' of size {}, but its dim {} is {} "
               "units of {} (a unit is one {}): every rank must hold whole units, so '{}' must divide {} ({})",
               u.param, shape, p.str(), mesh.names()[static_cast<size_t>(i)], k, u.dim, units_here, u.size, u.what,
               mesh.names()[static_cast<size_t>(i)], units_here, where(r, ir.mesh));
      extent /= k;
    }
  }
}

Tensor activation(const Tensor& t, const HookRecord& r, const DeviceMesh& mesh, const PlanMesh& pm) {
  if (!t.defined()) return t;
  Tensor x = t;
  bool static_eager = false;
  auto check_is = [&](const Placements& want, const char* what) {
    const auto& have = dtensor_spec(x, "parallelize").placements();
    MT_CHECK(have == want, "{} expects {}, but the tensor is a DTensor with {}", what, placements_on(want, pm),
             placements_on(have, pm));
  };
  if (r.annotate) {
    if (x.is_distributed())
      check_is(*r.annotate, "annotate");
    else
      x = from_local(x, mesh, *r.annotate, infer_global_shape(x.shape(), *r.annotate, mesh));
  } else if (r.src) {
    if (x.is_distributed()) {
      check_is(*r.src, "redistribute");
    } else {
      x = from_local(x, mesh, *r.src, infer_global_shape(x.shape(), *r.src, mesh));
      static_eager = true;
    }
  }
  if (r.dst) {
    if (!x.is_distributed())  // a plain value is the global tensor, the same on every rank
      x = from_local(x, mesh, Placements(mesh.ndim(), Placement::replicate()), x.shape());
    if (dtensor_spec(x, "parallelize").placements() != *r.dst) x = redistribute(x, *r.dst);
  }
  return static_eager ? to_local(x) : x;
}

Tensor gradient(const Tensor& g, const HookRecord& r, const DeviceMesh& mesh) {
  if (!g.defined()) return g;
  NoGradGuard ng;
  if (g.is_distributed()) {
    const DTensorSpec& s = dtensor_spec(g, "parallelize");
    if (s.placements() == *r.dst) return g;
    Tensor out = redistribute_local(local_view(g.detach()), s.global_shape(), s.placements(), *r.dst, mesh);
    return from_local(out, mesh, *r.dst, s.global_shape());
  }
  Shape global = infer_global_shape(g.shape(), *r.src, mesh);
  return redistribute_local(g, global, *r.src, *r.dst, mesh);
}

using Records = std::vector<HookRecord>;

// Installs one hook per hook point of `m` carrying out `recs` (that module's records).
using FsdpBuffers = std::map<std::string, std::shared_ptr<FsdpUnitBuffer>>;  // parameter path -> its unit

// Slots handed back when a module's forward ends instead of their owner's: the parameters that
// module declared it reads after their owner returned (Module::declare_shared_use).
using Releases = std::vector<std::function<void()>>;
struct SharedUse {
  std::string module;                  // the declaring module's path
  std::shared_ptr<Releases> releases;  // run when its forward ends
};
using SharedUses = std::map<std::string, SharedUse>;  // parameter path -> its outermost declaring module

void install(Module& m, const Records& recs, const DeviceMesh& mesh, const PlanMesh& pm, const void* owner,
             const FsdpBuffers& fsdp, const SharedUses& shared_uses, std::vector<HookHandle>& handles) {
  Records pre, fwd, bwd_pre, bwd;
  for (const auto& r : recs) {
    switch (r.hook) {
      case HookPoint::kForwardPre: pre.push_back(r); break;
      case HookPoint::kForward: fwd.push_back(r); break;
      case HookPoint::kBackwardPre: bwd_pre.push_back(r); break;
      case HookPoint::kBackward: bwd.push_back(r); break;
      case HookPoint::kParamInit: break;
    }
  }
  // The stored (INIT) parameters, captured now: the slots hold them between forwards.
  std::map<std::string, Tensor> stored;
  // Parameters of FSDP units: their unit and their path in it.
  std::map<std::string, std::pair<std::shared_ptr<FsdpUnitBuffer>, std::string>> units;
  std::map<std::string, std::shared_ptr<Releases>> later;  // parameters another module reads later
  for (const auto& r : recs)
    if (r.action == HookAction::kGather) {
      stored[r.tensor] = m.get_parameter(r.tensor);
      std::string path = r.module.empty() ? r.tensor : r.module + "." + r.tensor;
      auto shared = shared_uses.find(path);
      if (shared != shared_uses.end()) later[r.tensor] = shared->second.releases;
      auto it = fsdp.find(path);
      if (it != fsdp.end()) units[r.tensor] = {it->second, std::move(path)};
    }
  auto check_index = [](const HookRecord& r, size_t n) {
    MT_CHECK(r.io_index >= 0 && static_cast<size_t>(r.io_index) < n, "{} names {} {} but the module has {} {}s",
             r.tensor, r.io_input ? "input" : "output", r.io_index, n, r.io_input ? "input" : "output");
  };
  size_t n_factories = 0;
  for (const auto& r : pre) n_factories += r.action == HookAction::kFactory;
  if (!pre.empty())
    handles.push_back(m.register_forward_pre_hook([pre, stored, units, mesh, pm, owner, check_index, n_factories](
                                                      Module& mod, std::vector<Tensor>& in) {
      if (n_factories > 0)  // left by a forward of this module that threw
        std::erase_if(g_factories,
                      [&](const OwnedScope& f) { return f.owner == owner && f.scope.module == pre[0].module; });
      // A module that recomputes its activations replays only its forward in backward, without
      // its own hooks: a parameter it owns would be the stored shard there, not the gathered
      // tensor. Refused, naming the module and the plan line (its children's hooks do run in the
      // replay, so marking a module above it works).
      if (mod.recompute() == Recompute::kYes)
        for (const HookRecord& r : pre)
          if (r.action == HookAction::kGather)
            run_record(r, pm, [&] {
              MT_FAIL("module '{}' recomputes its activations (set_recompute) and owns parameter '{}', which the "
                      "plan gathers before each of its forwards; the recomputation in backward runs without the "
                      "module's own hooks and would read the stored shard: mark a module that contains it instead "
                      "(its parent)",
                      mod.path().empty() ? "(root)" : mod.path(), r.tensor);
            });
      for (const HookRecord& r : pre) {
        run_record(r, pm, [&] {
          if (r.action == HookAction::kGather) {
            auto unit = units.find(r.tensor);  // an FSDP unit gathers all its parameters at once
            mod.parameter_slot(r.tensor) = unit != units.end() ? unit->second.first->gathered(unit->second.second)
                                                               : redistribute(stored.at(r.tensor), *r.dst);
          } else if (r.action == HookAction::kFactory) {
            g_factories.push_back({owner, {r.module, r.tensor, mesh, *r.dst}});
          } else {
            check_index(r, in.size());
            in[r.io_index] = activation(in[r.io_index], r, mesh, pm);
          }
        });
      }
    }));
  std::vector<HookRecord> factories;  // in the order the pre-hook pushes their scopes
  for (const auto& r : pre)
    if (r.action == HookAction::kFactory) factories.push_back(r);
  if (!fwd.empty() || n_factories > 0)
    handles.push_back(m.register_forward_hook(
        [fwd, stored, later, mesh, pm, check_index, factories, owner](Module& mod, const std::vector<Tensor>&,
                                                                      std::vector<Tensor>& out) {
          for (const HookRecord& r : fwd) {
            run_record(r, pm, [&] {
              if (r.action == HookAction::kRelease) {
                // A parameter that a module above declared it reads later keeps its compute tensor
                // until that module's forward ends: a weight used again outside its module (tied
                // embeddings: the head reads the embedding's weight) finds it gathered.
                auto shared = later.find(r.tensor);
                if (shared != later.end()) {
                  Module* owner = &mod;
                  shared->second->push_back(
                      [owner, name = r.tensor, t = stored.at(r.tensor)] { owner->parameter_slot(name) = t; });
                } else {
                  mod.parameter_slot(r.tensor) = stored.at(r.tensor);
                }
              } else {
                check_index(r, out.size());
                out[r.io_index] = activation(out[r.io_index], r, mesh, pm);
              }
            });
          }
          // A scope nothing read: the forward created its tensors plain, and dispatch took them as
          // Replicate. Harmless where the plan says R (the stock plans' `factory model rope R`:
          // the built-in models make their rotary tables plain); any other placement would be
          // silently not applied (a reviewer's `rope dp=S(1)` trained as R until 2026-12-07).
          for (size_t i = factories.size(); i-- > 0 && !g_factories.empty();) {
            OwnedScope top = std::move(g_factories.back());
            g_factories.pop_back();
            const HookRecord& r = factories[i];
            if (top.used || top.owner != owner || top.scope.module != r.module) continue;
            bool all_r = true;
            for (const Placement& p : top.scope.placements) all_r = all_r && p.is_replicate();
            if (!all_r)
              run_record(r, pm, [&] {
                MT_FAIL("the forward of '{}' created no tensor through current_factory(\"{}\"), so {} was not "
                        "applied: tensors a forward makes itself (the built-in models' rotary tables) are plain and "
                        "used as Replicate. Say R, or place the module's inputs or outputs instead",
                        r.module.empty() ? "(root)" : r.module, r.tensor, placements_str(top.scope.placements));
              });
          }
        }));
  if (!bwd_pre.empty())
    handles.push_back(m.register_backward_pre_hook([bwd_pre, mesh, pm, check_index](Module&, std::vector<Tensor>& g) {
      for (const HookRecord& r : bwd_pre)
        run_record(r, pm, [&] {
          check_index(r, g.size());
          g[r.io_index] = gradient(g[r.io_index], r, mesh);
        });
    }));
  if (!bwd.empty())
    handles.push_back(m.register_backward_hook(
        [bwd, mesh, pm, check_index](Module&, std::vector<Tensor>& g, const std::vector<Tensor>&) {
          for (const HookRecord& r : bwd)
            run_record(r, pm, [&] {
              check_index(r, g.size());
              g[r.io_index] = gradient(g[r.io_index], r, mesh);
            });
        }));
}

// dispatch records: the MoE layer's experts run through an AllToAllDispatcher (plan/expert_dispatch.h)
// built from the experts' storage placements. Removing the handle restores the local default.
void install_dispatchers(Module& model, const HookIR& ir, const DeviceMesh& mesh, std::vector<HookHandle>& handles) {
  std::map<std::string, const Placements*> init;  // parameter path -> storage placements
  std::set<std::string> gathered;                 // parameters with a different RUN placement
  bool any = false;
  for (const HookRecord& r : ir.records) {
    const std::string path = r.module.empty() ? r.tensor : r.module + "." + r.tensor;
    if (r.action == HookAction::kInit) init[path] = &*r.dst;
    if (r.action == HookAction::kGather) gathered.insert(path);
    any |= r.action == HookAction::kDispatch;
  }
  if (!any) return;
  for (const HookRecord& r : ir.records) {
    if (r.action != HookAction::kDispatch) continue;
    const std::string where = fmt::format("{}: dispatch of module '{}'", r.from.empty() ? "plan" : r.from.back().str(),
                                          r.module);
    MT_CHECK(!r.module.empty(), "{}: the root module cannot be a dispatched MoE layer", where);
    std::shared_ptr<Module> m = model.get_module(r.module);
    auto* moe = dynamic_cast<MoeModule*>(m.get());
    MT_CHECK(moe, "{}: not a mixture-of-experts layer", where);
    for (Module* expert : moe->expert_modules())
      for (const auto& [name, p] : expert->named_parameters()) {
        const std::string path = expert->path() + "." + name;
        MT_CHECK(!gathered.count(path),
                 "{}: expert parameter '{}' has a compute (run) placement other than its storage placement; "
                 "all_to_all dispatch runs each expert on its owner's stored tensors (use place, not init/run)",
                 where, path);
      }
    std::vector<int64_t> owners = expert_owners(
        *moe, mesh.shape(), mesh.coordinate_shape(), r.mesh_dim,
        [&](const std::string& path) -> const Placements& {
          auto it = init.find(path);
          MT_CHECK(it != init.end(), "{}: no storage placement for '{}'", where, path);
          return *it->second;
        },
        where);
    moe->set_dispatcher(std::make_shared<AllToAllDispatcher>(mesh, r.mesh_dim, std::move(owners)));
    std::weak_ptr<Module> weak = m;
    handles.emplace_back([weak] {
      if (auto alive = weak.lock()) dynamic_cast<MoeModule&>(*alive).set_dispatcher(nullptr);
    });
  }
}

}  // namespace

SkipShardInitGuard::SkipShardInitGuard() : prev_(t_skip_shard_init) { t_skip_shard_init = true; }
SkipShardInitGuard::~SkipShardInitGuard() { t_skip_shard_init = prev_; }

Parallelized::Parallelized(HookIR ir, std::vector<HookHandle> hooks, std::vector<std::string> module_paths)
    : ir_(std::move(ir)), hooks_(std::move(hooks)), modules_(std::move(module_paths)) {
  if (hooks_.empty()) return;
  set_dist_error_note(&dropped_result_note);
  g_ever_parallelized = true;
  ++g_live_results;
}

Parallelized& Parallelized::operator=(Parallelized&& o) noexcept {
  if (this == &o) return *this;
  remove();
  ir_ = std::move(o.ir_);
  hooks_ = std::move(o.hooks_);
  modules_ = std::move(o.modules_);
  o.hooks_.clear();
  return *this;
}

void Parallelized::remove() {
  if (hooks_.empty()) return;
  for (auto& h : hooks_) h.remove();
  hooks_.clear();
  --g_live_results;
}

Placements Parallelized::input_placements(const std::string& path, int index) const {
  std::string placed;  // the modules whose inputs the plan places, for the errors
  for (const HookRecord& r : ir_.records)
    if (r.hook == HookPoint::kForwardPre && r.io_input) {
      if (r.module == path && r.io_index == index) {
        if (r.dst) return *r.dst;
        if (r.annotate) return *r.annotate;
        if (r.src) return *r.src;
      }
      std::string m = fmt::format("'{}'", r.module);
      if (placed.find(m) == std::string::npos) placed += (placed.empty() ? "" : ", ") + m;
    }
  if (!modules_.empty()) {
    MT_CHECK(std::find(modules_.begin(), modules_.end(), path) != modules_.end(),
             "input_placements('{}'): the model has no module '{}'; the plan places inputs of {}", path, path,
             placed.empty() ? "no module (all Replicate)" : placed);
    MT_CHECK(!path.empty() || placed.empty(),
             "input_placements(''): the plan places no input of the root module, but it does of {}: ask for "
             "the module the data feeds (its placements are what the trainer's ids and targets need)",
             placed);
  }
  return Placements(ir_.mesh.shape.size(), Placement::replicate());
}

const FactoryScope* current_factory(const std::string& label) {
  for (auto it = g_factories.rbegin(); it != g_factories.rend(); ++it)
    if (it->scope.label == label || it->scope.label == "*") {
      it->used = true;
      return &it->scope;
    }
  return nullptr;
}

Shape infer_global_shape(const Shape& local_shape, const Placements& placements, const DeviceMesh& mesh) {
  MT_CHECK(static_cast<int>(placements.size()) == mesh.ndim(), "infer_global_shape: {} placements {} for mesh {}",
           placements.size(), placements_str(placements), mesh.str());
  Shape g = local_shape;
  for (int i = mesh.ndim() - 1; i >= 0; --i) {
    const Placement& p = placements[i];
    if (!p.splits()) continue;
    MT_CHECK(p.dim() < static_cast<int>(g.size()), "{} on mesh dim '{}' does not fit a tensor of local shape {}",
             p.str(), mesh.names()[i], local_shape);
    if (p.kind() == PlacementKind::kRaggedShard) {
      int64_t units = 0;
      for (int64_t u : p.units()) units += u;
      g[p.dim()] = units * p.block();
      continue;
    }
    if (mesh.size(i) == 1) continue;
    Tensor n = from_vector<int64_t>({g[p.dim()]}, Shape{1});
    mesh.comm(i).all_reduce(n);
    g[p.dim()] = n.item_int();
  }
  return g;
}

Parallelized parallelize(Module& model, const Plan& plan, const DeviceMesh& mesh, Device device,
                         const std::function<bool(const HookRecord&)>& wanted) {
  HookIR ir = lower(plan, model, mesh);
  check_shard_units(model, ir, mesh);
  std::map<std::string, Records> by_module;
  for (const HookRecord& r : ir.records) {
    if (r.action == HookAction::kInit) {
      std::string path = r.module.empty() ? r.tensor : r.module + "." + r.tensor;
      shard_parameter(path, model.get_parameter(path), model.init_record(path), mesh, *r.dst, device);
    } else if (r.action == HookAction::kDispatch) {
      continue;  // below, once every parameter is a DTensor
    } else if (!wanted || (r.action != HookAction::kActivation && r.action != HookAction::kGrad) || wanted(r)) {
      by_module[r.module].push_back(r);
    }
  }
  std::vector<HookHandle> handles;
  // FSDP units: one buffer each, gathered once per forward (docs/fsdp.md).
  FsdpBuffers fsdp;
  auto env_off = [](const char* name) {
    const char* v = std::getenv(name);
    return v && std::string(v) == "0";
  };
  const bool per_parameter = env_off("MT_FSDP_DBUFFER");  // per-parameter gathers (benchmarks)
  const bool keep_gathered = env_off("MT_FSDP_RESHARD");  // no reshard after forward (benchmarks)
  const bool prefetch = !env_off("MT_FSDP_PREFETCH");     // gathers started ahead (benchmarks: off)
  const bool zero_copy = !env_off("MT_FSDP_ZERO_COPY");   // gradients written in place (benchmarks: off)
  const bool async_reduce = !env_off("MT_FSDP_ASYNC_REDUCE");  // reductions in flight (benchmarks: off)
  const char* reduce_env = std::getenv("MT_FSDP_REDUCE");  // "ordered": rank-order gradient sums
  const bool ordered_reduce = reduce_env && std::string(reduce_env) == "ordered";
  std::map<std::string, std::shared_ptr<FsdpUnitBuffer>> unit_of_module;
  // Each forward pass of the model starts a new prefetch epoch, before any unit gathers: this
  // hook comes first (link_prefetch below fills it in).
  auto next_pass = std::make_shared<std::function<void()>>();
  if (!per_parameter && prefetch && !ir.fsdp_units.empty())
    handles.push_back(model.register_forward_pre_hook([next_pass](Module&, std::vector<Tensor>&) {
      if (*next_pass) (*next_pass)();
    }));
  // Parameters read after their module returned (tied weights): each goes back to its slot when
  // the outermost module that declared the use ends its forward (its stale releases, left by a
  // forward that threw, run as its next forward begins).
  SharedUses shared_uses;
  for (const auto& [path, m] : model.named_modules()) {  // pre-order: outer modules first
    if (m->shared_uses().empty()) continue;
    auto releases = std::make_shared<Releases>();
    auto flush = [releases] {
      Releases now;
      now.swap(*releases);
      for (auto& release : now) release();
    };
    handles.push_back(m->register_forward_pre_hook([flush](Module&, std::vector<Tensor>&) { flush(); }));
    handles.push_back(
        m->register_forward_hook([flush](Module&, const std::vector<Tensor>&, std::vector<Tensor>&) { flush(); }));
    for (const std::string& p : m->shared_uses())
      shared_uses.emplace(path.empty() ? p : path + "." + p, SharedUse{path, releases});
  }
  if (!per_parameter)
    for (const FsdpUnit& u : ir.fsdp_units) {
      auto buffer = std::make_shared<FsdpUnitBuffer>(u, ir, model, mesh);
      unit_of_module[u.module] = buffer;
      // Reshard after forward except the root unit, whose backward starts as its forward ends, and
      // a unit with a parameter that a module outside it reads after the unit's forward (a tied
      // embedding in a unit of its own: the head reads it after the unit has ended).
      const bool read_later = std::any_of(u.params.begin(), u.params.end(), [&](const std::string& p) {
        auto it = shared_uses.find(p);
        if (it == shared_uses.end()) return false;
        const std::string& reader = it->second.module;  // inside the unit: done before the unit ends
        return !u.module.empty() && reader != u.module && !reader.starts_with(u.module + ".");
      });
      buffer->set_reshard_after_forward(!u.module.empty() && !keep_gathered && u.reshard_after_forward &&
                                        !read_later);
      buffer->set_prefetch(u.prefetch);
      buffer->set_zero_copy_gradients(zero_copy);
      buffer->set_ordered_reduction(ordered_reduce);
      buffer->set_async_reduction(async_reduce);
      for (const std::string& p : u.params) fsdp[p] = buffer;
      std::shared_ptr<Module> m = u.module.empty() ? nullptr : model.get_module(u.module);
      Module& target = m ? *m : model;
      handles.push_back(target.register_forward_pre_hook(
          [buffer](Module&, std::vector<Tensor>&) { buffer->begin_forward(); }));
      handles.push_back(target.register_forward_hook(
          [buffer](Module&, const std::vector<Tensor>&, std::vector<Tensor>&) { buffer->end_forward(); }));
      handles.push_back(target.register_backward_pre_hook(
          [buffer](Module&, std::vector<Tensor>&) { buffer->begin_backward(); }));
    }
  if (!per_parameter && prefetch && !ir.fsdp_units.empty()) {
    // Forward order is the modules' order (the root first, then layer by layer).
    std::vector<std::shared_ptr<FsdpUnitBuffer>> ordered;
    for (const auto& [path, m] : model.named_modules()) {
      auto it = unit_of_module.find(path);
      if (it != unit_of_module.end()) ordered.push_back(it->second);
    }
    *next_pass = FsdpUnitBuffer::link_prefetch(ordered);
  }
  auto owner = std::make_shared<char>(0);  // identifies this call's factory scopes
  for (auto& [path, recs] : by_module) {
    std::shared_ptr<Module> m = path.empty() ? nullptr : model.get_module(path);
    install(m ? *m : model, recs, mesh, ir.mesh, owner.get(), fsdp, shared_uses, handles);
  }
  handles.emplace_back([owner] {
    std::erase_if(g_factories, [&](const OwnedScope& f) { return f.owner == owner.get(); });
  });
  install_dispatchers(model, ir, mesh, handles);
  // Error notes: an op failing inside a module's forward names the module and these plan lines.
  for (auto& [path, note] : error_notes(ir, plan, model)) {
    std::shared_ptr<Module> m = path.empty() ? nullptr : model.get_module(path);
    Module& target = m ? *m : model;
    target.set_error_note(std::move(note));
    std::weak_ptr<Module> weak = m ? std::weak_ptr<Module>(m) : model.weak_from_this();
    handles.emplace_back([weak] {
      if (auto alive = weak.lock()) alive->set_error_note("");
    });
  }
  std::vector<std::string> modules;
  for (const auto& [path, m] : model.named_modules()) modules.push_back(path);
  return Parallelized(std::move(ir), std::move(handles), std::move(modules));
}

}  // namespace mt
