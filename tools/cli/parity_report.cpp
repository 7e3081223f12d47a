// The measurements, tables and verdict of `meshtrain parity` (see parity_report.h).
#include "tools/cli/parity_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "mesh/communicator.h"
#include "mesh/dtensor.h"
#include "plan/lower.h"
#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt::cli {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Row-major coordinates of flat index `flat` in `shape`.
Shape unravel(int64_t flat, const Shape& shape) {
  Shape idx = Shape::filled(shape.size(), 0);
  for (int d = shape.size() - 1; d >= 0; --d) {
    if (shape[d] == 0) break;
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

std::string fmt_rel(double x) { return std::isinf(x) ? "inf" : fmt::format("{:.2e}", x); }

nlohmann::json diff_json(const TensorDiff& d) {
  return {{"max_abs", std::isfinite(d.max_abs) ? nlohmann::json(d.max_abs) : nlohmann::json("inf")},
          {"ref_max_abs", d.ref_max},
          {"rel", std::isfinite(d.rel()) ? nlohmann::json(d.rel()) : nlohmann::json("inf")},
          {"rank", d.rank},
          {"local_index", d.local_index.vec()}};
}

nlohmann::json number_or_null(const std::optional<double>& x) {
  if (!x) return nullptr;
  return std::isfinite(*x) ? nlohmann::json(*x) : nlohmann::json("inf");
}

}  // namespace

double relative_diff(double abs_diff, double scale) {
  if (std::isnan(abs_diff) || std::isnan(scale)) return kInf;
  if (abs_diff == 0) return 0;
  return scale > 0 ? abs_diff / scale : kInf;
}

double element_diff(double a, double b) {
  if (a == b) return 0;
  return std::isfinite(a) && std::isfinite(b) ? std::fabs(a - b) : kInf;
}

double scale_floor(const std::vector<double>& ref_max) {
  double top = 0;
  for (double m : ref_max) top = std::max(top, m);
  return kScaleFloor * top;
}

double StepRow::loss_rel() const {
  return ref_loss ? relative_diff(std::fabs(loss - *ref_loss), std::fabs(*ref_loss)) : 0;
}

double StepRow::grad_norm_rel() const {
  return ref_grad_norm ? relative_diff(std::fabs(grad_norm - *ref_grad_norm), std::fabs(*ref_grad_norm)) : 0;
}

std::vector<std::string> one_sided_gradients(const NamedTensors& parallel, const NamedTensors& reference,
                                             const PlanContext& ctx) {
  std::map<std::string, Tensor> refs(reference.begin(), reference.end());
  std::vector<double> has(parallel.size(), 0.0);
  for (size_t i = 0; i < parallel.size(); ++i) has[i] = parallel[i].second.grad().defined() ? 1 : 0;
  if (ctx.world > 1 && !has.empty()) {
    Tensor t = from_vector<double>(has, Shape{static_cast<int64_t>(has.size())});
    ctx.mesh->comm().all_reduce(t, CommReduceOp::kMax);
    has = t.to_vector<double>();
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < parallel.size(); ++i) {
    const std::string& name = parallel[i].first;
    auto it = refs.find(name);
    if (it == refs.end()) continue;
    const bool par = has[i] > 0, ref = it->second.grad().defined();
    if (par != ref)
      out.push_back(fmt::format("{} has a gradient {} only", name, par ? "under the plan" : "in the reference"));
  }
  return out;
}

NamedTensors gradients_of(const NamedTensors& params) {
  NamedTensors out;
  for (const auto& [name, p] : params) {
    Tensor g = p.grad().defined() ? p.grad().detach() : zeros_like(p.detach());
    // 16-bit gradients widened (exactly) to f32: with f32 accumulation a rank whose shard got
    // gradients holds them in f32 and one whose shard is empty (an expert it does not own) in
    // bf16, and gathering the two failed (pp x ep, --precision bf16 --accum 2; until 2026-12-08).
    if (g.dtype() == DType::kBF16 || g.dtype() == DType::kF16) g = g.to(DType::kF32);
    out.emplace_back(name, g);
  }
  return out;
}

std::vector<TensorDiff> compare_tensors(const NamedTensors& parallel, const NamedTensors& reference,
                                        const PlanContext& ctx, const std::string& source) {
  std::map<std::string, Tensor> refs(reference.begin(), reference.end());
  std::vector<TensorDiff> out;
  // Per tensor and rank: this rank's max |diff| and the flat local index of it (the other ranks'
  // slots zero), summed over the mesh so that every rank sees every rank's figures.
  const int64_t n = static_cast<int64_t>(parallel.size()), world = ctx.world;
  std::vector<double> slots(static_cast<size_t>(n * world * 2), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const auto& [name, p] = parallel[static_cast<size_t>(i)];
    auto it = refs.find(name);
    MT_CHECK(it != refs.end(), "reference {} has no tensor '{}' (is it of another model?)", source, name);
    Tensor ref = it->second.detach().to(DType::kF64);
    TensorDiff d;
    d.name = name;
    Tensor local, ref_local;
    if (p.is_distributed()) {
      const DTensorSpec& spec = dtensor_spec(p, "parity");
      d.shape = spec.global_shape();
      MT_CHECK(ref.shape() == d.shape, "reference {}: tensor '{}' has shape {}, the model's has shape {}", source,
               name, ref.shape(), d.shape);
      d.placement = placements_on(spec.placements(), ctx.plan_mesh);
      local = to_local(p.detach());
      ref_local = to_local(distribute_tensor(ref, spec.mesh(), spec.placements()));
    } else {
      d.shape = p.shape();
      MT_CHECK(ref.shape() == d.shape, "reference {}: tensor '{}' has shape {}, the model's has shape {}", source,
               name, ref.shape(), d.shape);
      d.placement.assign(1, 'R');  // (not = "R": GCC 12 -Wrestrict false positive)
      local = p.detach();
      ref_local = ref;
    }
    const std::vector<double> a = local.to_vector<double>(), b = ref_local.to_vector<double>();
    double worst = 0;
    int64_t at = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      const double diff = element_diff(a[k], b[k]);
      if (diff > worst) worst = diff, at = static_cast<int64_t>(k);
    }
    // The scale: the reference's largest finite magnitude (element_diff).
    for (double v : ref.to_vector<double>())
      if (std::isfinite(v)) d.ref_max = std::max(d.ref_max, std::fabs(v));
    const size_t slot = static_cast<size_t>((i * world + ctx.rank) * 2);
    slots[slot] = std::isinf(worst) ? std::numeric_limits<double>::max() : worst;
    slots[slot + 1] = static_cast<double>(at);
    d.local_index = local.shape();  // for unravel below (this rank's local shape)
    out.push_back(std::move(d));
  }
  // Local shapes differ per rank (uneven shards): send them too, so the worst rank's coordinates
  // can be named. Up to kMaxDims dims per tensor.
  std::vector<double> shapes(static_cast<size_t>(n * world * kMaxDims), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const Shape& ls = out[static_cast<size_t>(i)].local_index;
    for (int d = 0; d < ls.size(); ++d)
      shapes[static_cast<size_t>((i * world + ctx.rank) * kMaxDims + d)] = static_cast<double>(ls[d]);
  }
  if (world > 1 && n > 0) {
    Tensor t = from_vector<double>(slots, Shape{static_cast<int64_t>(slots.size())});
    Tensor s = from_vector<double>(shapes, Shape{static_cast<int64_t>(shapes.size())});
    // Pipeline plans: the whole world (the stage mesh holds only this stage's ranks).
    Communicator comm = world_comm(ctx);
    comm.all_reduce(t);
    comm.all_reduce(s);
    slots = t.to_vector<double>();
    shapes = s.to_vector<double>();
  }
  for (int64_t i = 0; i < n; ++i) {
    TensorDiff& d = out[static_cast<size_t>(i)];
    int best = 0;
    for (int r = 1; r < world; ++r)
      if (slots[static_cast<size_t>((i * world + r) * 2)] > slots[static_cast<size_t>((i * world + best) * 2)]) best = r;
    const size_t slot = static_cast<size_t>((i * world + best) * 2);
    d.max_abs = slots[slot] == std::numeric_limits<double>::max() ? kInf : slots[slot];
    d.rank = best;
    Shape local_shape = Shape::filled(d.local_index.size(), 0);
    for (int k = 0; k < local_shape.size(); ++k)
      local_shape[k] = static_cast<int64_t>(shapes[static_cast<size_t>((i * world + best) * kMaxDims + k)]);
    d.local_index = unravel(static_cast<int64_t>(slots[slot + 1]), local_shape);
  }
  std::vector<double> ref_max;
  for (const TensorDiff& d : out) ref_max.push_back(d.ref_max);
  const double floor = scale_floor(ref_max);
  for (TensorDiff& d : out) d.floor = floor;
  return out;
}

std::vector<std::string> ParityReport::failures() const {
  std::vector<std::string> f;
  for (const StepRow& s : steps) {
    if (!(s.loss_rel() <= tol)) f.push_back(fmt::format("step {} loss: rel {} > {}", s.step, fmt_rel(s.loss_rel()), tol));
    const double limit = s.step == 1 ? tol : drift_tol;
    if (!(s.grad_norm_rel() <= limit))
      f.push_back(fmt::format("step {} grad norm: rel {} > {}", s.step, fmt_rel(s.grad_norm_rel()), limit));
  }
  for (const auto& o : one_sided) f.push_back(o + " (the optimizer steps it on that side only)");
  auto check = [&](const std::vector<TensorDiff>& diffs, const char* what, double limit) {
    for (const TensorDiff& d : diffs)
      if (!(d.rel() <= limit))
        f.push_back(fmt::format("{} {}: rel {} > {} (rank {}, {})", what, d.name, fmt_rel(d.rel()), limit, d.rank,
                                d.placement));
  };
  check(first_grads, "step-1 gradient", tol);
  check(weights, "weight", drift_tol);
  check(grads, "last-step gradient", drift_tol);
  if (per_module.is_object() && per_module.contains("first_difference") && !per_module["first_difference"].is_null())
    f.push_back(fmt::format("module {}: first to differ beyond the tolerance (--per-module)",
                            per_module["first_difference"]["module"].get<std::string>()));
  return f;
}

void print_report(const ParityReport& r) {
  fmt::print("parity: plan {} on {} ranks against the single-device reference ({}), tolerance {} (losses; "
             "step 1's grad norm and gradients) and {} (later grad norms; weights and gradients after the last step)\n",
             r.plan, r.world, r.reference, r.tol, r.drift_tol);
  fmt::print("\n{:>5} | {:>12} {:>12} {:>9} | {:>12} {:>12} {:>9}\n", "step", "loss", "ref loss", "rel diff",
             "grad norm", "ref norm", "rel diff");
  auto opt = [](const std::optional<double>& x) { return x ? fmt::format("{:.7f}", *x) : std::string("-"); };
  for (const StepRow& s : r.steps)
    fmt::print("{:>5} | {:>12.7f} {:>12} {:>9} | {:>12.7f} {:>12} {:>9}\n", s.step, s.loss, opt(s.ref_loss),
               s.ref_loss ? fmt_rel(s.loss_rel()) : "-", s.grad_norm, opt(s.ref_grad_norm),
               s.ref_grad_norm ? fmt_rel(s.grad_norm_rel()) : "-");
  auto table = [](const char* title, const std::vector<TensorDiff>& diffs) {
    if (diffs.empty()) return;
    size_t w = 9;
    for (const auto& d : diffs) w = std::max(w, d.name.size());
    fmt::print("\n{}\n{:<{}} | {:>9} {:>9} | {:>4} {:<16} {}\n", title, "parameter", w, "max abs",
               "rel diff", "rank", "placement", "worst element (local)");
    for (const auto& d : diffs)
      fmt::print("{:<{}} | {:>9} {:>9} | {:>4} {:<16} {}\n", d.name, w, fmt_rel(d.max_abs), fmt_rel(d.rel()), d.rank,
                 d.placement, d.local_index);
  };
  table("gradients of step 1 (before clipping)", r.first_grads);
  table("weights after the last step", r.weights);
  table("gradients of the last step (before clipping)", r.grads);
  if (r.per_module.is_object()) {
    fmt::print("\nper module (one forward/backward from the reference's weights):\n");
    auto rel = [](const nlohmann::json& x) {
      return x.is_number() ? fmt_rel(x.get<double>()) : std::string("not compared");
    };
    fmt::print("  {:<44} {:>12} {:>12}\n", "module (in the order their forward ends)", "output rel", "in-grad rel");
    for (const auto& m : r.per_module["modules"])
      fmt::print("  {:<44} {:>12} {:>12}\n", m["module"].get<std::string>(), rel(m["output_rel"]),
                 rel(m["input_grad_rel"]));
    if (r.per_module["first_difference"].is_null())
      fmt::print("no module differs beyond the tolerance\n");
    else
      fmt::print("first module to differ: {} ({})\n", r.per_module["first_difference"]["module"].get<std::string>(),
                 r.per_module["first_difference"]["what"].get<std::string>());
  }
  if (!r.one_sided.empty()) {
    fmt::print("\nparameters with a gradient on one side only ({}):\n", r.one_sided.size());
    for (const auto& o : r.one_sided) fmt::print("  {}\n", o);
  }
  const auto f = r.failures();
  double worst = 0;
  std::string worst_what = "nothing compared";
  auto consider = [&](double rel, const std::string& what) {
    if (rel >= worst || worst_what == "nothing compared") worst = std::max(worst, rel), worst_what = what;
  };
  for (const auto& s : r.steps) {
    if (s.ref_loss) consider(s.loss_rel(), fmt::format("step {} loss", s.step));
    if (s.ref_grad_norm && s.step == 1) consider(s.grad_norm_rel(), "step 1 grad norm");
  }
  for (const auto& d : r.first_grads) consider(d.rel(), "step-1 gradient " + d.name);
  const double worst_tight = worst;
  const std::string worst_tight_what = worst_what;
  worst = 0, worst_what = "nothing compared";
  for (const auto& s : r.steps)
    if (s.ref_grad_norm && s.step > 1) consider(s.grad_norm_rel(), fmt::format("step {} grad norm", s.step));
  for (const auto& d : r.weights) consider(d.rel(), "weight " + d.name);
  for (const auto& d : r.grads) consider(d.rel(), "last-step gradient " + d.name);
  if (f.empty()) {
    fmt::print("\nPASS: losses, step 1's grad norm and gradients within {} (worst: {} at rel {}); later grad "
               "norms, weights and gradients after the last step within {} (worst: {} at rel {})\n", r.tol, worst_tight_what,
               fmt_rel(worst_tight), r.drift_tol, worst_what, fmt_rel(worst));
  } else {
    fmt::print("\nFAIL: {} check(s) failed (--tol {}, --drift-tol {}):\n", f.size(), r.tol, r.drift_tol);
    for (size_t i = 0; i < f.size() && i < 20; ++i) fmt::print("  {}\n", f[i]);
    if (f.size() > 20) fmt::print("  ... and {} more (--json has them all)\n", f.size() - 20);
  }
}

nlohmann::json report_json(const ParityReport& r) {
  nlohmann::json j = {{"plan", r.plan}, {"world", r.world}, {"tol", r.tol}, {"drift_tol", r.drift_tol},
                      {"reference", r.reference}};
  j["steps"] = nlohmann::json::array();
  for (const auto& s : r.steps) {
    j["steps"].push_back({{"step", s.step},
                          {"loss", s.loss},
                          {"ref_loss", number_or_null(s.ref_loss)},
                          {"loss_rel", s.ref_loss ? number_or_null(s.loss_rel()) : nlohmann::json(nullptr)},
                          {"grad_norm", s.grad_norm},
                          {"ref_grad_norm", number_or_null(s.ref_grad_norm)},
                          {"grad_norm_rel", s.ref_grad_norm ? number_or_null(s.grad_norm_rel()) : nlohmann::json(nullptr)}});
  }
  std::map<std::string, nlohmann::json> params;
  std::vector<std::string> order;
  auto add = [&](const std::vector<TensorDiff>& diffs, const char* key) {
    for (const auto& d : diffs) {
      if (!params.count(d.name)) {
        order.push_back(d.name);
        params[d.name] = {{"name", d.name}, {"shape", d.shape.vec()}, {"placement", d.placement}};
      }
      params[d.name][key] = diff_json(d);
    }
  };
  add(r.first_grads, "grad_step1");
  add(r.weights, "weight");
  add(r.grads, "grad");
  j["parameters"] = nlohmann::json::array();
  for (const auto& name : order) j["parameters"].push_back(params[name]);
  j["per_module"] = r.per_module;
  j["one_sided_gradients"] = r.one_sided;
  const auto f = r.failures();
  j["failures"] = f;
  j["verdict"] = f.empty() ? "pass" : "fail";
  return j;
}

}  // namespace mt::cli
