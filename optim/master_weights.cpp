// f32 master weights for 16-bit training, and in-place dtype conversion of a module's parameters.
#include "optim/master_weights.h"

#include <unordered_map>
#include <unordered_set>

#include "runtime/error.h"
#include "tensor/autograd.h"

namespace mt {

MasterWeights::MasterWeights(const NamedTensors& model_params) {
  NoGradGuard no_grad;
  for (const auto& [name, p] : model_params) {
    MT_CHECK(p.defined(), "MasterWeights: parameter '{}' is an undefined tensor", name);
    MT_CHECK(!p.is_meta(), "MasterWeights: parameter '{}' ({}) is on the meta device; materialize first",
             name, p.desc());
    MT_CHECK(is_floating(p.dtype()), "MasterWeights: parameter '{}' is {}; only floating tensors",
             name, p.desc());
    Entry e;
    e.model = p;
    if (p.dtype() == DType::kBF16 || p.dtype() == DType::kF16) {
      e.copy = true;
      e.master = p.detach().to(DType::kF32).contiguous();
      e.master.requires_grad_(p.requires_grad());
    } else {
      e.master = p;
    }
    masters_.emplace_back(name, e.master);
    entries_.push_back(std::move(e));
  }
}

bool MasterWeights::pass_through() const {
  for (const Entry& e : entries_)
    if (e.copy) return false;
  return true;
}

void MasterWeights::grads_to_master() {
  NoGradGuard no_grad;
  for (Entry& e : entries_) {
    if (!e.copy) continue;
    Tensor g = e.model.grad();
    if (!g.defined()) {
      e.master.set_grad(Tensor());
      continue;
    }
    Tensor mg = e.master.grad();
    if (mg.defined() && mg.dtype() == DType::kF32 && mg.device() == g.device() && mg.is_contiguous())
      mg.copy_(g);  // reuse the buffer a previous step left
    else
      e.master.set_grad(g.to(DType::kF32).contiguous());
  }
}

void MasterWeights::attach_model_grads() {
  for (Entry& e : entries_)
    if (e.copy) e.master.set_grad(e.model.grad());
}

NamedTensors MasterWeights::model_copies() const {
  NamedTensors out;
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].copy) out.emplace_back(masters_[i].first, entries_[i].model);
  return out;
}

void MasterWeights::master_to_model() {
  NoGradGuard no_grad;
  for (Entry& e : entries_)
    if (e.copy) e.model.copy_(e.master);
}

NamedTensors MasterWeights::state_dict() const {
  NamedTensors out;
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].copy) out.emplace_back(masters_[i].first, entries_[i].master);
  return out;
}

void MasterWeights::load_state_dict(const NamedTensors& state) {
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [key, t] : state) {
    MT_CHECK(given.emplace(key, &t).second, "MasterWeights.load_state_dict: key '{}' appears twice", key);
    MT_CHECK(t.defined(), "MasterWeights.load_state_dict: '{}' is an undefined tensor", key);
  }
  std::vector<std::string> errors;
  std::unordered_set<std::string> expected;
  std::string missing;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].copy) continue;
    const std::string& name = masters_[i].first;
    expected.insert(name);
    auto it = given.find(name);
    if (it == given.end())
      missing += (missing.empty() ? "" : ", ") + name;
    else if (it->second->shape() != entries_[i].master.shape())
      errors.push_back(fmt::format("shape mismatch for '{}': the state has {} but the master is {}", name,
                                   it->second->desc(), entries_[i].master.desc()));
  }
  if (!missing.empty()) errors.insert(errors.begin(), "missing keys: " + missing);
  std::string unexpected;
  for (const auto& [key, t] : state)
    if (!expected.count(key)) unexpected += (unexpected.empty() ? "" : ", ") + key;
  if (!unexpected.empty()) errors.push_back("unexpected keys: " + unexpected);
  std::string msg;
  for (const auto& e : errors) msg += (msg.empty() ? "" : "; ") + e;
  MT_CHECK(msg.empty(), "MasterWeights.load_state_dict: {}", msg);
  NoGradGuard no_grad;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].copy) continue;
    const Tensor& src = *given.at(masters_[i].first);
    Tensor& dst = entries_[i].master;
    dst.copy_(src.device() == dst.device() ? src : src.to(dst.device()));
  }
}

void cast_tensor_in_place(const Tensor& t, DType dtype) {
  MT_CHECK(t.defined(), "cast_tensor_in_place: undefined tensor");
  MT_CHECK(!t.is_meta(), "cast_tensor_in_place: {} is on the meta device; materialize it first", t.desc());
  if (t.dtype() == dtype) return;
  Tensor real;
  {
    NoGradGuard no_grad;
    real = t.detach().to(dtype).contiguous();
  }
  // Same technique as Module::materialize: keep the TensorImpl, swap in the new storage.
  TensorImpl* p = t.impl();
  p->storage = real.impl()->storage;
  p->strides = real.strides();
  p->offset = real.offset();
  p->dtype = real.dtype();
  t.set_grad(Tensor());
}

void cast_parameters(Module& module, DType dtype) {
  MT_CHECK(is_floating(dtype), "cast_parameters: target dtype {} is not floating", dtype);
  for (const auto& [name, p] : module.named_parameters()) {
    if (!is_floating(p.dtype())) continue;
    MT_CHECK(!p.is_meta(), "cast_parameters: parameter '{}' ({}) is on the meta device; materialize first",
             name, p.desc());
    cast_tensor_in_place(p, dtype);
  }
}

}  // namespace mt
