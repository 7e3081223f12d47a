// Optimizer bookkeeping shared by SGD and AdamW: groups, per-parameter state, step counts and the
// state_dict round trip (see optimizer.h and docs/optim.md).
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <unordered_map>
#include <unordered_set>

#include "runtime/error.h"
#include "tensor/autograd.h"

namespace mt {

namespace {

// "a, b, c" with at most kMax names, then "... (N more)": an error message stays readable even
// when a whole model's worth of keys is missing.
std::string list_names(const std::vector<std::string>& names) {
  constexpr size_t kMax = 12;
  std::string s;
  for (size_t i = 0; i < names.size() && i < kMax; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > kMax) s += fmt::format(", ... ({} more)", names.size() - kMax);
  return s;
}

}  // namespace

std::vector<ParamGroup> make_param_groups(const NamedTensors& named_params, double weight_decay) {
  std::vector<ParamGroup> groups(2);
  groups[0].weight_decay = weight_decay;
  groups[1].weight_decay = 0;
  for (const auto& [name, t] : named_params) {
    MT_CHECK(t.defined(), "make_param_groups: parameter '{}' is an undefined tensor", name);
    if (!t.requires_grad()) continue;
    groups[t.dim() >= 2 ? 0 : 1].params.emplace_back(name, t);
  }
  return groups;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, std::vector<std::string> state_kinds,
                     const char* name)
    : groups_(std::move(groups)), kinds_(std::move(state_kinds)), name_(name) {
  set_lr(lr);
  std::unordered_set<std::string> names;
  std::unordered_map<const TensorImpl*, std::string> impls;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    MT_CHECK(std::isfinite(g.weight_decay) && g.weight_decay >= 0,
             "{}: param group {} has weight_decay {}; it must be finite and >= 0", name_, gi,
             g.weight_decay);
    MT_CHECK(std::isfinite(g.lr_scale) && g.lr_scale >= 0,
             "{}: param group {} has lr_scale {}; it must be finite and >= 0", name_, gi, g.lr_scale);
    for (const auto& [pname, p] : g.params) {
      MT_CHECK(!pname.empty(), "{}: param group {} has a parameter with an empty name", name_, gi);
      MT_CHECK(p.defined(), "{}: parameter '{}' is an undefined tensor", name_, pname);
      MT_CHECK(names.insert(pname).second, "{}: parameter name '{}' appears twice", name_, pname);
      auto [it, fresh] = impls.emplace(p.impl(), pname);
      MT_CHECK(fresh, "{}: parameters '{}' and '{}' are the same tensor; list it once", name_,
               it->second, pname);
      MT_CHECK(!p.is_meta(), "{}: parameter '{}' ({}) is on the meta device; materialize the model first",
               name_, pname, p.desc());
      MT_CHECK(is_floating(p.dtype()), "{}: parameter '{}' is {}; only floating tensors can be optimized",
               name_, pname, p.desc());
      Slot slot;
      slot.name = pname;
      slot.param = p;
      slot.group = gi;
      for (size_t k = 0; k < kinds_.size(); ++k) slot.state.push_back(zeros_like(p));
      slots_.push_back(std::move(slot));
    }
  }
}

void Optimizer::set_lr(double lr) {
  MT_CHECK(std::isfinite(lr) && lr >= 0, "{}: learning rate {} must be finite and >= 0", name_, lr);
  lr_ = lr;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  // Every gradient is checked before anything changes: a bad one throws with the step count, the
  // per-parameter counts and every parameter as they were (some updates, Muon's and 8-bit AdamW's,
  // apply at once rather than in finish_step()).
  for (const Slot& slot : slots_) {
    const Tensor g = slot.param.grad();
    if (!g.defined()) continue;
    MT_CHECK(accepts_grad(slot.param, g) && g.device() == slot.param.device(),
             "{}.step: parameter '{}' is {} but its gradient is {}", name_, slot.name,
             slot.param.desc(), g.desc());
    // A DTensor parameter is updated shard by shard: its gradient must have its placements
    // (Partial gradients are reduced first: plan/grad_reducer.h or redistribute).
    MT_CHECK(!(slot.param.is_distributed() || g.is_distributed()) || g.dist_spec() == slot.param.dist_spec(),
             "{}.step: parameter '{}' is {} but its gradient is {}: reduce or redistribute the gradient to "
             "the parameter's placements before step()",
             name_, slot.name, slot.param.desc(), g.desc());
  }
  ++step_;
  struct Finish {  // runs the queued updates, or drops them when an update throws
    Optimizer* o;
    ~Finish() noexcept(false) { o->finish_step(std::uncaught_exceptions() == 0); }
  } finish{this};
  for (Slot& slot : slots_) {
    Tensor g = slot.param.grad();
    if (!g.defined()) continue;
    ++slot.steps;
    const ParamGroup& group = groups_[slot.group];
    if (slot.param.is_distributed() || g.is_distributed()) {
      Slot local = slot;
      local.param = local_view(slot.param);
      for (Tensor& s : local.state) s = local_view(s);
      update(local, local_view(g), lr_ * group.lr_scale, group.weight_decay);
      continue;
    }
    update(slot, g, lr_ * group.lr_scale, group.weight_decay);
  }
}

void Optimizer::zero_grad() {
  for (Slot& slot : slots_) slot.param.set_grad(Tensor());
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  out.reserve(1 + slots_.size() * (kinds_.size() + 1));
  out.emplace_back("step", scalar_tensor(static_cast<double>(step_), DType::kI64));
  for (size_t k = 0; k < kinds_.size(); ++k)
    for (const Slot& slot : slots_) out.emplace_back(kinds_[k] + "." + slot.name, slot.state[k]);
  for (const Slot& slot : slots_)
    out.emplace_back("step." + slot.name, scalar_tensor(static_cast<double>(slot.steps), DType::kI64));
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& state) {
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [key, t] : state) {
    MT_CHECK(given.emplace(key, &t).second, "{}.load_state_dict: key '{}' appears twice", name_, key);
    MT_CHECK(t.defined(), "{}.load_state_dict: '{}' is an undefined tensor", name_, key);
  }
  std::vector<std::string> missing, bad;
  std::unordered_set<std::string> expected;
  // A step counter: one integral-valued element >= 0.
  auto find_count = [&](const std::string& key) -> const Tensor* {
    expected.insert(key);
    auto it = given.find(key);
    if (it == given.end()) {
      missing.push_back(key);
      return nullptr;
    }
    const Tensor& t = *it->second;
    if (t.numel() != 1 || t.is_meta()) {
      bad.push_back(fmt::format("'{}' must be a one-element step count but is {}", key, t.desc()));
      return nullptr;
    }
    double v = t.item();
    if (!(v >= 0) || v != std::floor(v)) {
      bad.push_back(fmt::format("'{}' holds {}, not a step count", key, v));
      return nullptr;
    }
    return &t;
  };
  const Tensor* step = find_count("step");
  std::vector<const Tensor*> slot_steps;
  std::vector<std::vector<const Tensor*>> slot_state(slots_.size());
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    slot_steps.push_back(find_count("step." + slot.name));
    for (size_t k = 0; k < kinds_.size(); ++k) {
      std::string key = kinds_[k] + "." + slot.name;
      expected.insert(key);
      auto it = given.find(key);
      const Tensor* src = nullptr;
      if (it == given.end()) {
        missing.push_back(key);
      } else if (it->second->shape() != slot.param.shape() || it->second->is_meta()) {
        bad.push_back(fmt::format("shape mismatch for '{}': the state has {} but the parameter is {}",
                                  key, it->second->desc(), slot.param.desc()));
      } else {
        src = it->second;
      }
      slot_state[s].push_back(src);
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [key, t] : state)
    if (!expected.count(key)) unexpected.push_back(key);

  std::string msg;
  auto add = [&msg](const std::string& part) { msg += (msg.empty() ? "" : "; ") + part; };
  if (!missing.empty()) add(fmt::format("missing keys: {}", list_names(missing)));
  if (!unexpected.empty()) add(fmt::format("unexpected keys: {}", list_names(unexpected)));
  for (const auto& b : bad) add(b);
  MT_CHECK(msg.empty(), "{}.load_state_dict: {}", name_, msg);

  NoGradGuard no_grad;
  step_ = static_cast<int64_t>(step->item());
  for (size_t s = 0; s < slots_.size(); ++s) {
    Slot& slot = slots_[s];
    slot.steps = static_cast<int64_t>(slot_steps[s]->item());
    for (size_t k = 0; k < kinds_.size(); ++k) {
      const Tensor& src = *slot_state[s][k];
      slot.state[k].copy_(src.device() == slot.state[k].device() ? src : src.to(slot.state[k].device()));
    }
  }
}

NamedTensors Optimizer::state_dict_with(const NamedTensors& own) const {
  NamedTensors base = Optimizer::state_dict();  // "step", then "step.<name>"
  NamedTensors out;
  out.push_back(base.front());
  for (const auto& kv : own) out.push_back(kv);
  for (size_t i = 1; i < base.size(); ++i) out.push_back(base[i]);
  return out;
}

void Optimizer::load_state_dict_with(const NamedTensors& state, const NamedTensors& own) {
  std::unordered_map<std::string, const Tensor*> dst;
  for (const auto& [key, t] : own) dst.emplace(key, &t);
  std::unordered_map<std::string, const Tensor*> src;
  NamedTensors base;
  std::vector<std::string> problems;
  for (const auto& [key, t] : state) {
    auto it = dst.find(key);
    if (it == dst.end()) {
      base.emplace_back(key, t);  // "step", "step.<name>", or unexpected: the base reports it
      continue;
    }
    if (!t.defined() || t.is_meta() || t.shape() != it->second->shape())
      problems.push_back(fmt::format("'{}' is {} but the state is {}", key,
                                     t.defined() ? t.desc() : std::string("undefined"), it->second->desc()));
    else if (!src.emplace(key, &t).second)
      problems.push_back(fmt::format("key '{}' appears twice", key));
  }
  std::vector<std::string> missing;
  for (const auto& entry : own) {
    const std::string& key = entry.first;  // (a named variable: clang 14 cannot capture a binding)
    if (!src.count(key) && std::none_of(problems.begin(), problems.end(), [&](const std::string& p) {
          return p.find("'" + key + "'") != std::string::npos;
        }))
      missing.push_back(key);
  }
  if (!missing.empty()) problems.insert(problems.begin(), fmt::format("missing keys: {}", list_names(missing)));
  if (!problems.empty()) {
    std::string msg;
    for (size_t i = 0; i < problems.size() && i < 12; ++i) msg += (i ? "; " : "") + problems[i];
    if (problems.size() > 12) msg += fmt::format("; ... ({} more)", problems.size() - 12);
    MT_FAIL("{}.load_state_dict: {}", name_, msg);
  }
  Optimizer::load_state_dict(base);  // checks the step counts and unexpected keys; throws first
  NoGradGuard no_grad;
  for (const auto& [key, t] : own) {
    const Tensor& from = *src.at(key);
    Tensor to = t;
    to.copy_(from.device() == to.device() ? from : from.to(to.device()));
  }
}

namespace detail {

bool fused_host_ok(const Tensor& t, const std::vector<Tensor>& others) {
  return t.device().is_cpu() && fused_ok(t, others);
}

bool fused_ok(const Tensor& t, const std::vector<Tensor>& others) {
  if (!(t.device().is_cpu() || t.device().is_cuda()) || !t.is_contiguous()) return false;
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF64) return false;
  for (const Tensor& o : others)
    if (o.device() != t.device() || !o.is_contiguous() || o.dtype() != t.dtype() || o.shape() != t.shape())
      return false;
  return true;
}

}  // namespace detail

}  // namespace mt
