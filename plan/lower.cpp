// Plan -> HookIR: resolve every entry's regexes against the model's module paths and parameter
// names, merge what the entries say per tensor and mesh dim (later entries win), check what can be
// checked without running (parameters: split dims in range, no Partial storage, every mesh
// coordinate's local layout valid), and emit the records in a valid order.
#include "plan/lower.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "kernels/registry.h"
#include "mesh/shard_layout.h"
#include "plan/path_regex.h"
#include "plan/pipeline.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/moe.h"

namespace mt {

namespace {

std::string shown(const std::string& path) { return path.empty() ? "(root)" : path; }

// The `n` names closest to `pattern` (backslashes removed, so "model\.norm" compares as
// "model.norm"), nearest first.
std::string nearest(const std::string& pattern, const std::vector<std::string>& names, size_t n = 5) {
  std::string plain;
  for (char c : pattern)
    if (c != '\\') plain += c;
  std::vector<std::pair<size_t, size_t>> scored;  // (distance, index)
  for (size_t i = 0; i < names.size(); ++i) scored.emplace_back(edit_distance(plain, names[i]), i);
  std::stable_sort(scored.begin(), scored.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::string s;
  for (size_t i = 0; i < std::min(n, scored.size()); ++i) { s += i ? ", " : ""; s += shown(names[scored[i].second]); }
  return s.empty() ? "(none)" : s;
}

// Per mesh dim, the last entry's placement (nullopt: no entry named the dim).
using DimSlots = std::vector<std::optional<DimPlacement>>;

void merge(DimSlots& slots, const How& how, const PlanMesh& mesh) {
  for (const auto& d : how) slots[mesh.dim_index(d.dim)] = d;
}

struct ParamState {
  std::string path, module, name;
  Shape shape;
  DimSlots init, run;
  std::vector<PlanLoc> from;
};

struct IoState {
  DimSlots annotate, src, dst, grad_src, grad_dst;
  bool has_annotate = false, has_src = false, has_dst = false, has_grad = false;
  std::vector<PlanLoc> from, grad_from;
};

struct ModuleState {
  std::string path;
  std::vector<size_t> params;                   // indices into params
  std::map<std::pair<int, int>, IoState> io;    // (is_output, index)
  std::map<std::string, std::pair<DimSlots, std::vector<PlanLoc>>> factories;
  const DimPlacement* dispatch = nullptr;  // the last dispatch entry for this module
  std::vector<PlanLoc> dispatch_from;
};

Placements resolve(const DimSlots& slots) {
  Placements ps(slots.size());
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i]) ps[i] = slots[i]->placement;
  return ps;
}

// Parameter placements: owner(k) resolved, Partial rejected, split dims in range.
Placements resolve_param(const DimSlots& slots, const ParamState& p, const PlanMesh& mesh, const char* phase) {
  Placements ps(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i]) continue;
    const DimPlacement& d = *slots[i];
    if (d.owner >= 0) {
      MT_CHECK(d.owner < mesh.shape[i], "{}: {} of parameter {}: mesh dim '{}' has {} coordinates; expected "
               "owner(K) with K < {}",
               d.loc.str(), d.str(), p.path, d.dim, mesh.shape[i], mesh.shape[i]);
      MT_CHECK(d.owner_dim < p.shape.size(), "{}: {} needs tensor dim {} but parameter {} has shape {}", d.loc.str(),
               d.str(), d.owner_dim, p.path, p.shape);
      std::vector<int64_t> units(static_cast<size_t>(mesh.shape[i]), 0);
      units[static_cast<size_t>(d.owner)] = 1;
      ps[i] = Placement::ragged_shard(d.owner_dim, units, std::max<int64_t>(p.shape[d.owner_dim], 1));
      continue;
    }
    const Placement& pl = d.placement;
    MT_CHECK(!pl.is_partial(), "{}: {} ({}) of parameter {}: a parameter cannot be Partial; expected R or a "
             "shard (S, IS, RS)",
             d.loc.str(), d.str(), phase, p.path);
    MT_CHECK(!pl.splits() || pl.dim() < static_cast<int>(p.shape.size()),
             "{}: {} ({}) does not fit parameter {} of shape {}: tensor dim {} is out of range; expected a dim "
             "in 0..{}",
             d.loc.str(), d.str(), phase, p.path, p.shape, pl.dim(), static_cast<int>(p.shape.size()) - 1);
    ps[i] = pl;
  }
  // Every coordinate's layout (IS groups must divide, RS units must sum, ...). With Replicate and
  // Shard only, the layout cannot fail at one coordinate and not at another (chunk semantics give
  // any coordinate a range, maybe empty): coordinate 0 decides, which keeps a 10,000-rank mesh fast.
  bool uniform = true;
  for (const Placement& pl : ps) uniform = uniform && (pl.is_replicate() || pl.is_shard());
  Shape coord(std::vector<int64_t>(mesh.shape.size(), 0));
  while (true) {
    try {
      (void)local_layout(p.shape, ps, mesh.shape, coord);
    } catch (const Error& e) {
      PlanLoc blame = p.from.empty() ? PlanLoc{} : p.from.back();
      for (const auto& s : slots)
        if (s && (s->owner >= 0 || s->placement.splits())) blame = s->loc;
      MT_FAIL("{}: placements {} ({}) do not fit parameter {} of shape {} on mesh {} at coordinate {}: {}",
              blame.str(), placements_on(ps, mesh), phase, p.path, p.shape, mesh.str(), coord, e.what());
    }
    if (uniform) break;
    size_t k = coord.size();
    while (k > 0 && ++coord[k - 1] == mesh.shape[k - 1]) coord[--k] = 0;
    if (k == 0) break;
  }
  return ps;
}

std::string redist_on(const Placements& src, const Placements& dst, const PlanMesh& mesh) {
  std::string s;
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i] != dst[i]) s += fmt::format("{}{}->{}@{}", s.empty() ? "" : ",", src[i].str(), dst[i].str(), mesh.names[i]);
  return s;
}

// `fsdp` entries, after every other entry (the placements on the other mesh dims apply first, the
// ragged split runs over the local shards): each matched module is a unit; a parameter belongs to
// the last entry that claims it, and within one entry to the deepest matched module. Its storage
// on the unit's dim becomes the planner's RaggedShard over tensor dim 0, its compute placement
// there Replicate.
using FsdpEntries = std::vector<std::pair<const PlanEntry*, std::vector<size_t>>>;  // entry, matched modules

// `stage_pruned`: the model is one pipeline stage's (prune_to_stage): an entry whose units hold no
// parameter here holds them on another stage (parallelize_run checks the entry against the whole
// model before pruning), so it makes no unit here instead of failing.
std::vector<FsdpUnit> lower_fsdp(const FsdpEntries& entries, const std::vector<ModuleState>& modules,
                                 std::vector<ParamState>& params, const PlanMesh& mesh, bool stage_pruned) {
  struct Claim {
    const PlanEntry* entry = nullptr;
    size_t unit = 0;  // module index
  };
  std::vector<Claim> claims(params.size());
  auto depth = [](const std::string& path) { return path.empty() ? 0 : 1 + std::count(path.begin(), path.end(), '.'); };
  for (const auto& [e, matched] : entries) {
    const DimPlacement& d = e->how[0];
    MT_CHECK(mesh.dim_index(d.dim) >= 0, "{}: mesh dim '{}' is not in mesh {}", d.loc.str(), d.dim, mesh.str());
    PathRegex tre(e->tensor, e->tensor_loc, "a regex over parameter paths in the unit");
    std::vector<size_t> units = matched;
    std::stable_sort(units.begin(), units.end(),
                     [&](size_t a, size_t b) { return depth(modules[a].path) < depth(modules[b].path); });
    size_t hits = 0;
    for (size_t mi : units) {
      const std::string& u = modules[mi].path;
      for (size_t pi = 0; pi < params.size(); ++pi) {
        const std::string& path = params[pi].path;
        if (!u.empty() && path.rfind(u + ".", 0) != 0) continue;
        if (!tre.full_match(u.empty() ? path : path.substr(u.size() + 1))) continue;
        claims[pi] = {e, mi};
        ++hits;
      }
    }
    MT_CHECK(hits > 0 || stage_pruned, "{}: parameter regex '{}' matches no parameter path inside the units matched by '{}' (paths "
             "are relative to the unit, e.g. 'mlp\\.down_proj\\.weight' or '.*')",
             e->tensor_loc.str(), e->tensor, e->module_re);
  }
  std::vector<FsdpUnit> units;
  std::map<std::pair<size_t, int>, size_t> unit_index;  // (module, dim) -> units
  std::map<std::pair<size_t, std::string>, std::optional<PlanLoc>> option_from;  // (unit, option) -> entry
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const Claim& c = claims[pi];
    if (!c.entry) continue;
    const DimPlacement& how = c.entry->how[0];
    const int dim = mesh.dim_index(how.dim);
    ParamState& p = params[pi];
    for (const auto* slot : {&p.init[static_cast<size_t>(dim)], &p.run[static_cast<size_t>(dim)]})
      MT_CHECK(!*slot, "{}: parameter {} is in an FSDP unit over mesh dim '{}', but {} also places it on '{}'; "
               "expected one of the two",
               how.loc.str(), p.path, how.dim, (*slot)->loc.str(), how.dim);
    MT_CHECK(!p.shape.empty(), "{}: parameter {} is a scalar; FSDP splits tensor dim 0 (leave scalars out of the "
             "unit's parameter regex)",
             how.loc.str(), p.path);
    // The local shard the ragged split divides: the placements on every other dim, which must
    // split evenly (one layout for every coordinate; checked first: when they do not, their order
    // in the mesh is not the fix) and come before this one in the mesh.
    Placements ps = resolve_param(p.init, p, mesh, "INIT");
    std::vector<int64_t> corner;
    for (int i = 0; i < mesh.shape.size(); ++i) corner.push_back(mesh.shape[i] - 1);
    const Shape first(std::vector<int64_t>(mesh.shape.size(), 0)), last(corner);
    const Shape local = local_layout(p.shape, ps, mesh.shape, first).local_shape;
    MT_CHECK(local == local_layout(p.shape, ps, mesh.shape, last).local_shape,
             "{}: parameter {} of shape {} has different local shapes under {} on mesh {}; an FSDP unit needs "
             "even splits on the other mesh dims (a split that gives some ranks whole tensors and others none, as "
             "dispatch's experts, cannot be in one)",
             how.loc.str(), p.path, p.shape, placements_on(ps, mesh), mesh.str());
    for (int j = 0; j < mesh.ndim(); ++j)
      MT_CHECK(!ps[static_cast<size_t>(j)].splits() || j < dim,
               "{}: parameter {} is split on mesh dim '{}' ({}), which comes after the FSDP dim '{}' in the mesh; the "
               "ragged split runs over the local shards, so list '{}' after '{}' in the mesh line",
               how.loc.str(), p.path, mesh.names[static_cast<size_t>(j)], ps[static_cast<size_t>(j)].str(), how.dim,
               how.dim, mesh.names[static_cast<size_t>(j)]);
    const int64_t rows = local[0];
    const int64_t block = how.fsdp_rows == DimPlacement::kFsdpWhole ? rows : how.fsdp_rows;
    MT_CHECK(rows > 0 && rows % block == 0,
             "{}: granularity {} does not fit parameter {}: its local shard {} has {} rows along tensor dim 0; "
             "expected a number of rows that divides {}",
             how.loc.str(), how.str(), p.path, local, rows, rows);
    auto [it, fresh] = unit_index.emplace(std::pair(c.unit, dim), units.size());
    if (fresh) {
      FsdpUnit u;
      u.module = modules[c.unit].path;
      u.mesh_dim = dim;
      units.push_back(std::move(u));
    }
    FsdpUnit& u = units[it->second];
    u.params.push_back(p.path);
    u.tensors.push_back({p.path, rows, local.numel() / rows, block});
    if (std::find_if(u.from.begin(), u.from.end(), [&](const PlanLoc& l) { return l.str() == c.entry->loc.str(); }) ==
        u.from.end())
      u.from.push_back(c.entry->loc);
  }
  // A unit's options come from every entry that matches its module, whether or not the entry owns
  // one of its parameters (a later entry that changes some parameters' granularity keeps them):
  // every entry that gives one must agree, the first to give it is kept. Until 2026-12-07 only the
  // owning entries' counted, so an entry whose parameters a later one took all lost its options
  // without a word.
  for (const auto& [e, matched] : entries) {
    const int dim = mesh.dim_index(e->how[0].dim);
    for (size_t mi : matched) {
      auto it = unit_index.find({mi, dim});
      if (it == unit_index.end()) continue;  // no unit there: nothing to reshard or prefetch
      FsdpUnit& u = units[it->second];
      for (auto [given, field, key] : {std::tuple{e->fsdp_reshard, &u.reshard_after_forward, "reshard"},
                                       std::tuple{e->fsdp_prefetch, &u.prefetch, "prefetch"}}) {
        if (given < 0) continue;
        auto& from = option_from[{it->second, key}];
        MT_CHECK(!from || (given == 1) == *field,
                 "{}: FSDP unit {} gets {}={} here but {}={} at {}; expected one value per unit", e->loc.str(),
                 u.module.empty() ? "(root)" : u.module, key, given ? "yes" : "no", key, *field ? "yes" : "no",
                 from->str());
        *field = given == 1;
        if (!from) from = e->loc;
      }
    }
  }
  std::map<std::string, size_t> param_index;
  for (size_t pi = 0; pi < params.size(); ++pi) param_index[params[pi].path] = pi;
  for (FsdpUnit& u : units) {
    LayoutOptions opt;
    opt.group = mesh.shape[static_cast<size_t>(u.mesh_dim)];
    opt.order = TensorOrder::kGiven;  // parameter order: the buffer reads like the module
    u.layout = plan_fsdp_layout(u.tensors, opt);
    for (const PlacedTensor& t : u.layout.tensors) {
      ParamState& p = params[param_index.at(u.params[static_cast<size_t>(t.index)])];
      const LayoutTensor& lt = u.tensors[static_cast<size_t>(t.index)];
      DimPlacement init, run;
      init.dim = run.dim = mesh.names[static_cast<size_t>(u.mesh_dim)];
      init.placement = Placement::ragged_shard(0, t.ragged_units(opt.group), lt.block_rows);
      init.loc = run.loc = u.from.back();
      p.init[static_cast<size_t>(u.mesh_dim)] = init;
      p.run[static_cast<size_t>(u.mesh_dim)] = run;
      for (const PlanLoc& l : u.from) p.from.push_back(l);
    }
  }
  // In module order (pre-order: the root first, layers by index).
  std::vector<std::pair<size_t, size_t>> order;  // (module index, unit)
  for (const auto& [key, i] : unit_index) order.emplace_back(key.first, i);
  std::sort(order.begin(), order.end());
  std::vector<FsdpUnit> sorted;
  for (const auto& [module, i] : order) sorted.push_back(std::move(units[i]));
  return sorted;
}
}  // namespace

const char* hook_point_name(HookPoint h) {
  switch (h) {
    case HookPoint::kParamInit: return "param_init";
    case HookPoint::kForwardPre: return "forward_pre";
    case HookPoint::kForward: return "forward";
    case HookPoint::kBackwardPre: return "backward_pre";
    case HookPoint::kBackward: return "backward";
  }
  return "?";
}

std::string placements_on(const Placements& ps, const PlanMesh& mesh) {
  std::string s;
  for (size_t i = 0; i < ps.size(); ++i)
    if (!ps[i].is_replicate()) s += fmt::format("{}{}@{}", s.empty() ? "" : ",", ps[i].str(), mesh.names[i]);
  return s.empty() ? "R" : s;
}

std::string HookRecord::action_str(const PlanMesh& mesh) const {
  switch (action) {
    case HookAction::kInit: return "init(" + placements_on(*dst, mesh) + ")";
    case HookAction::kGather: return "redist(" + redist_on(*src, *dst, mesh) + ")";
    case HookAction::kRelease: return "release";
    case HookAction::kGrad: return "grad(" + redist_on(*src, *dst, mesh) + ")";
    case HookAction::kFactory: return "factory(" + placements_on(*dst, mesh) + ")";
    case HookAction::kDispatch: return "dispatch(" + dispatch + "@" + mesh.names[static_cast<size_t>(mesh_dim)] + ")";
    case HookAction::kActivation: {
      std::string s;
      if (annotate) s = "annotate(" + placements_on(*annotate, mesh) + ")";
      const Placements* from = annotate ? &*annotate : src ? &*src : nullptr;
      if (dst) {
        std::string part = from ? (*from == *dst ? "" : "redist(" + redist_on(*from, *dst, mesh) + ")")
                                : "to(" + placements_on(*dst, mesh) + ")";
        if (!part.empty()) { s += s.empty() ? "" : ","; s += part; }
      }
      return s;
    }
  }
  return "?";
}

std::string HookRecord::str(const PlanMesh& mesh) const {
  std::string where = module.empty() ? hook_point_name(hook) : module + "." + hook_point_name(hook);
  return fmt::format("{}:{}:{}", where, tensor, action_str(mesh));
}

std::string HookIR::str() const {
  std::string s;
  for (const auto& r : records) s += r.str(mesh) + "\n";
  return s;
}

std::string FsdpUnit::str(const PlanMesh& mesh) const {
  return fmt::format("unit {} over {} ({}{}{}): ", module.empty() ? "(root)" : module,
                     mesh.names[static_cast<size_t>(mesh_dim)], [&] {
                       std::string l;
                       for (const PlanLoc& f : from) { l += l.empty() ? "" : ", "; l += f.str(); }
                       return l;
                     }(), reshard_after_forward ? "" : "; reshard=no", prefetch ? "" : "; prefetch=no") +
         describe_fsdp_layout(tensors, layout);
}

const Placements& HookIR::init_placements(const std::string& path) const {
  for (const auto& r : records)
    if (r.action == HookAction::kInit && (r.module.empty() ? r.tensor : r.module + "." + r.tensor) == path)
      return *r.dst;
  MT_FAIL("HookIR: no param_init record for '{}'", path);
}

HookIR lower(const Plan& plan, Module& model, const DeviceMesh& mesh) {
  PlanMesh pm = plan.resolve_mesh(mesh.size());
  MT_CHECK(pm.names == mesh.names() && pm.shape == mesh.shape(),
           "lower: plan {} declares mesh {} for {} ranks, but the given mesh is {}", plan.source(), pm.str(),
           mesh.size(), mesh.str());
  return lower(plan, model, pm);
}

HookIR lower(const Plan& plan, Module& model, const PlanMesh& mesh) {
  const size_t nd = mesh.names.size();
  // ---- the model: modules in pre-order, parameters (deduplicated) by owning module ----
  std::vector<ModuleState> modules;
  std::map<std::string, size_t> module_index;
  std::vector<std::string> module_paths;
  for (auto& [path, m] : model.named_modules()) {
    module_index[path] = modules.size();
    modules.push_back({path, {}, {}, {}, nullptr, {}});
    module_paths.push_back(path);
  }
  std::vector<ParamState> params;
  for (auto& [path, t] : model.named_parameters()) {
    MT_CHECK(!t.is_distributed(), "lower: parameter {} is already a DTensor ({}); parallelize a model once",
             path, t.dist_spec()->str());
    size_t dot = path.rfind('.');
    ParamState p;
    p.path = path;
    p.module = dot == std::string::npos ? "" : path.substr(0, dot);
    p.name = dot == std::string::npos ? path : path.substr(dot + 1);
    p.shape = t.shape();
    p.init.assign(nd, std::nullopt);
    p.run.assign(nd, std::nullopt);
    modules[module_index.at(p.module)].params.push_back(params.size());
    params.push_back(std::move(p));
  }

  // ---- entries ----
  FsdpEntries fsdp_entries;  // lowered after the others
  const bool stage_pruned = is_stage_pruned(model);
  for (const PlanEntry& e : plan.entries()) {
    PathRegex mre(e.module_re, e.module_loc, "a regex over module paths");
    std::vector<size_t> matched;
    for (size_t i = 0; i < modules.size(); ++i)
      if (mre.full_match(modules[i].path)) matched.push_back(i);
    // An entry of a pipeline stage may name only another stage's modules: that stage applies it
    // (callers lower the plan on the whole model before pruning it, which finds an entry that
    // matches nothing anywhere: tools/cli/parallel.cpp, plan/estimate.cpp).
    if (matched.empty() && stage_pruned) continue;
    MT_CHECK(!matched.empty(), "{}: module regex '{}' matches no module path of the model; nearest module paths: "
             "{}",
             e.module_loc.str(), e.module_re, nearest(e.module_re, module_paths));
    IoRef io = parse_io_ref(e.tensor);
    if (e.kind == PlanEntryKind::kFsdp) {
      fsdp_entries.emplace_back(&e, matched);
      continue;
    }
    if (e.kind == PlanEntryKind::kDispatch) {
      for (size_t mi : matched) {
        auto* moe = dynamic_cast<MoeModule*>(model.get_module(modules[mi].path).get());
        MT_CHECK(moe, "{}: dispatch applies to mixture-of-experts layers (e.g. Mixtral's block_sparse_moe), but "
                 "module {} is not one",
                 e.module_loc.str(), shown(modules[mi].path));
        MT_CHECK(mesh.dim_index(e.how[0].dim) >= 0, "{}: mesh dim '{}' is not in mesh {}", e.how[0].loc.str(),
                 e.how[0].dim, mesh.str());
        modules[mi].dispatch = &e.how[0];
        modules[mi].dispatch_from.push_back(e.loc);
        // The experts' parameters: whole on an owner along the dim, experts spread in contiguous
        // blocks (expert e on coordinate e * size / E); later entries may place them otherwise.
        const std::vector<Module*> experts = moe->expert_modules();
        const auto E = static_cast<int64_t>(experts.size());
        const int64_t P = mesh.shape[static_cast<size_t>(mesh.dim_index(e.how[0].dim))];
        for (int64_t x = 0; x < E; ++x) {
          DimPlacement owner = e.how[0];
          owner.dispatch.clear();
          owner.owner = x * P / E;
          for (auto& [rel, sub] : experts[static_cast<size_t>(x)]->named_modules()) {
            const std::string path = experts[static_cast<size_t>(x)]->path() + (rel.empty() ? "" : "." + rel);
            for (size_t pi : modules[module_index.at(path)].params) {
              merge(params[pi].init, {owner}, mesh);
              merge(params[pi].run, {owner}, mesh);
              params[pi].from.push_back(e.loc);
            }
          }
        }
      }
      continue;
    }
    if (e.kind == PlanEntryKind::kFactory) {
      for (size_t mi : matched) {
        auto& [slots, from] = modules[mi].factories[e.tensor];
        if (slots.empty()) slots.assign(nd, std::nullopt);
        merge(slots, e.how, mesh);
        from.push_back(e.loc);
      }
      continue;
    }
    if (io.valid()) {
      for (size_t mi : matched) {
        IoState& s = modules[mi].io[{io.is_input ? 0 : 1, io.index}];
        for (auto* d : {&s.annotate, &s.src, &s.dst, &s.grad_src, &s.grad_dst})
          if (d->empty()) d->assign(nd, std::nullopt);
        s.from.push_back(e.loc);
        switch (e.kind) {
          case PlanEntryKind::kPlace: merge(s.dst, e.how, mesh), s.has_dst = true; break;
          case PlanEntryKind::kAnnotate: merge(s.annotate, e.how, mesh), s.has_annotate = true; break;
          case PlanEntryKind::kRedistribute:
            merge(s.src, e.src, mesh), merge(s.dst, e.how, mesh);
            s.has_src = s.has_dst = true;
            if (!e.grad_src.empty()) {
              merge(s.grad_src, e.grad_src, mesh), merge(s.grad_dst, e.grad_dst, mesh);
              s.has_grad = true;
              s.grad_from.push_back(e.loc);
            }
            break;
          case PlanEntryKind::kFactory:
          case PlanEntryKind::kDispatch:
          case PlanEntryKind::kFsdp: break;
        }
      }
      continue;
    }
    // Parameters.
    PathRegex tre(e.tensor, e.tensor_loc, "a parameter name");
    size_t hits = 0;
    std::vector<std::string> names;
    for (size_t mi : matched)
      for (size_t pi : modules[mi].params) {
        ParamState& p = params[pi];
        if (std::find(names.begin(), names.end(), p.name) == names.end()) names.push_back(p.name);
        if (!tre.full_match(p.name)) continue;
        ++hits;
        if (e.phase != PlanPhase::kRun) merge(p.init, e.how, mesh);
        if (e.phase != PlanPhase::kInit) merge(p.run, e.how, mesh);
        p.from.push_back(e.loc);
      }
    // A pipeline stage holds a placeholder (no parameters) for another stage's unit, e.g. lm_head
    // on stage 0: an entry for that unit's parameters is lowered on the stage that holds them.
    const bool other_stage = stage_pruned && std::all_of(matched.begin(), matched.end(), [&](size_t mi) {
      return is_other_stage_module(*model.get_module(modules[mi].path));
    });
    if (hits == 0 && other_stage) continue;
    if (hits == 0) {
      std::string mods;
      for (size_t i = 0; i < std::min<size_t>(3, matched.size()); ++i) { mods += i ? ", " : ""; mods += shown(modules[matched[i]].path); }
      if (matched.size() > 3) mods += fmt::format(", ... ({} modules)", matched.size());
      MT_FAIL("{}: parameter regex '{}' matches no parameter of the modules matched by '{}' ({}); their "
              "parameters: {}; expected a parameter name, <in>:K or <out>:K",
              e.tensor_loc.str(), e.tensor, e.module_re, mods, names.empty() ? "(none)" : nearest(e.tensor, names, 20));
    }
  }

  std::vector<FsdpUnit> fsdp_units = lower_fsdp(fsdp_entries, modules, params, mesh, stage_pruned);

  // ---- records ----
  HookIR ir;
  ir.mesh = mesh;
  ir.fsdp_units = std::move(fsdp_units);
  std::vector<Placements> init_ps(params.size()), run_ps(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ParamState& p = params[i];
    DimSlots run = p.run;
    for (size_t d = 0; d < nd; ++d)
      if (!run[d]) run[d] = p.init[d];  // RUN defaults to INIT per mesh dim
    init_ps[i] = resolve_param(p.init, p, mesh, "INIT");
    run_ps[i] = resolve_param(run, p, mesh, "RUN");
    HookRecord r;
    r.module = p.module;
    r.hook = HookPoint::kParamInit;
    r.tensor = p.name;
    r.action = HookAction::kInit;
    r.dst = init_ps[i];
    r.global_shape = p.shape;
    r.from = p.from;
    ir.records.push_back(std::move(r));
  }
  for (const ModuleState& m : modules) {
    auto param_record = [&](size_t pi, HookPoint hook, HookAction action) {
      HookRecord r;
      r.module = m.path;
      r.hook = hook;
      r.tensor = params[pi].name;
      r.action = action;
      r.src = action == HookAction::kGather ? init_ps[pi] : run_ps[pi];
      r.dst = action == HookAction::kGather ? run_ps[pi] : init_ps[pi];
      r.global_shape = params[pi].shape;
      r.from = params[pi].from;
      return r;
    };
    auto io_record = [&](const std::pair<int, int>& key, const IoState& s, HookPoint hook, bool grad) {
      HookRecord r;
      r.module = m.path;
      r.hook = hook;
      r.io_input = key.first == 0;
      r.io_index = key.second;
      r.tensor = fmt::format("{}:{}", r.io_input ? "<in>" : "<out>", key.second);
      if (grad) {
        r.action = HookAction::kGrad;
        r.src = resolve(s.grad_src);
        r.dst = resolve(s.grad_dst);
        r.from = s.grad_from;
      } else {
        r.action = HookAction::kActivation;
        if (s.has_annotate) r.annotate = resolve(s.annotate);
        if (s.has_src) r.src = resolve(s.src);
        if (s.has_dst) r.dst = resolve(s.dst);
        r.from = s.from;
        if (r.annotate && r.src && *r.annotate != *r.src)
          MT_FAIL("{}: {} of {}: annotate says {} but redistribute expects {} (entries at {}); expected one "
                  "source placement",
                  s.from.back().str(), r.tensor, shown(m.path), placements_on(*r.annotate, mesh),
                  placements_on(*r.src, mesh), [&] {
                    std::string l;
                    for (auto& f : s.from) { l += l.empty() ? "" : ", "; l += f.str(); }
                    return l;
                  }());
      }
      return r;
    };
    auto keep = [](const HookRecord& r) {
      if (r.action == HookAction::kGrad) return *r.src != *r.dst;
      if (r.action == HookAction::kActivation) {
        const auto& from = r.annotate ? r.annotate : r.src;
        return r.annotate.has_value() || (r.dst && (!from || *from != *r.dst));
      }
      return true;
    };
    auto emit = [&](HookRecord r) {
      if (keep(r)) ir.records.push_back(std::move(r));
    };
    // forward_pre: parameters gathered for compute, factories, inputs.
    for (size_t pi : m.params)
      if (init_ps[pi] != run_ps[pi]) emit(param_record(pi, HookPoint::kForwardPre, HookAction::kGather));
    for (const auto& [label, f] : m.factories) {
      HookRecord r;
      r.module = m.path;
      r.hook = HookPoint::kForwardPre;
      r.tensor = label;
      r.action = HookAction::kFactory;
      r.dst = resolve(f.first);
      r.from = f.second;
      emit(std::move(r));
    }
    for (const auto& [key, s] : m.io)
      if (key.first == 0) emit(io_record(key, s, HookPoint::kForwardPre, false));
    if (m.dispatch) {
      HookRecord r;
      r.module = m.path;
      r.hook = HookPoint::kForwardPre;
      r.tensor = "experts";
      r.action = HookAction::kDispatch;
      r.mesh_dim = mesh.dim_index(m.dispatch->dim);
      r.dispatch = m.dispatch->dispatch;
      r.from = m.dispatch_from;
      emit(std::move(r));
    }
    // forward: outputs, then parameters released.
    for (const auto& [key, s] : m.io)
      if (key.first == 1) emit(io_record(key, s, HookPoint::kForward, false));
    for (size_t pi : m.params)
      if (init_ps[pi] != run_ps[pi]) emit(param_record(pi, HookPoint::kForward, HookAction::kRelease));
    // backward_pre: gradients of outputs; backward: gradients of inputs.
    for (const auto& [key, s] : m.io)
      if (key.first == 1 && s.has_grad) emit(io_record(key, s, HookPoint::kBackwardPre, true));
    for (const auto& [key, s] : m.io)
      if (key.first == 0 && s.has_grad) emit(io_record(key, s, HookPoint::kBackward, true));
  }
  return ir;
}

void check_io_shapes(const Plan& plan, const HookIR& ir, Module& model, const std::vector<Tensor>& example_inputs) {
  // Per module path, the shapes of its inputs and outputs (nullopt: undefined) in the probe run.
  using Shapes = std::vector<std::optional<Shape>>;
  std::map<std::string, std::pair<Shapes, Shapes>> seen;
  auto shapes_of = [](const std::vector<Tensor>& ts) {
    Shapes s;
    for (const Tensor& t : ts) s.push_back(t.defined() ? std::optional<Shape>(t.shape()) : std::nullopt);
    return s;
  };
  {
    std::vector<HookHandle> probes;
    for (auto& [path, m] : model.named_modules()) {
      std::string key = path;
      probes.push_back(m->register_forward_hook(
          [&seen, key, shapes_of](Module&, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
            seen.try_emplace(key, shapes_of(in), shapes_of(out));
          }));
    }
    MetaKernelsGuard meta;
    NoGradGuard no_grad;
    try {
      (void)model(example_inputs);
    } catch (...) {
      for (auto& h : probes) h.remove();
      throw;
    }
    for (auto& h : probes) h.remove();
  }
  // The placement text and location of each entry's dims, to point at the token at fault.
  std::map<std::string, const PlanEntry*> entry_at;
  for (const PlanEntry& e : plan.entries()) entry_at[e.loc.str()] = &e;
  for (const HookRecord& r : ir.records) {
    if (r.io_index < 0) continue;
    auto it = seen.find(r.module);
    if (it == seen.end()) continue;  // not run by this forward
    const Shapes& shapes = r.io_input ? it->second.first : it->second.second;
    const char* what = r.io_input ? "input" : "output";
    PlanLoc at = r.from.empty() ? PlanLoc{plan.source(), 0, 0} : r.from.back();
    MT_CHECK(static_cast<size_t>(r.io_index) < shapes.size(),
             "{}: {} of module {}: its forward has {} {}s (indices 0..{}); expected an existing {}", at.str(),
             r.tensor, shown(r.module), shapes.size(), what, static_cast<int64_t>(shapes.size()) - 1, what);
    const std::optional<Shape>& shape = shapes[static_cast<size_t>(r.io_index)];
    if (!shape) continue;
    for (const auto* ps : {&r.annotate, &r.src, &r.dst}) {
      if (!ps->has_value()) continue;
      for (size_t d = 0; d < (*ps)->size(); ++d) {
        const Placement& p = (**ps)[d];
        if (!p.splits() || p.dim() < static_cast<int>(shape->size())) continue;
        // The entry (of this record's) that put this split on mesh dim d: its DIM=PLACEMENT token.
        PlanLoc blame = at;
        for (const PlanLoc& f : r.from) {
          auto e = entry_at.find(f.str());
          if (e == entry_at.end()) continue;
          for (const How* how : {&e->second->how, &e->second->src, &e->second->grad_src, &e->second->grad_dst})
            for (const DimPlacement& dp : *how)
              if (dp.dim == ir.mesh.names[d] && dp.placement == p) blame = dp.loc;
        }
        MT_FAIL("{}: {}@{} for {} of module {} splits tensor dim {}, but that {} is {} ({}-D) in a forward "
                "on an example batch; expected a split dim in 0..{}",
                blame.str(), p.str(), ir.mesh.names[d], r.tensor, shown(r.module), p.dim(), what, *shape,
                shape->size(), static_cast<int>(shape->size()) - 1);
      }
    }
  }
}

}  // namespace mt
