// Module: registration, dotted-path traversal and lookup, state dicts, train/eval, forward and
// backward hooks, recomputation, and deferred (meta) parameter init.
//
// Backward hooks follow PyTorch's BackwardHook: when a module has backward(-pre) hooks and grad
// mode is on, the inputs that require grad pass through one multi-output identity node before
// forward, and the outputs through another after the forward hooks. In backward the outputs node
// (a node pre-hook) sees the gradients w.r.t. the outputs first, fires the backward-pre hooks and
// saves them; the inputs node then fires the backward hooks with the input gradients.
#include "tensor/module.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "runtime/error.h"
#include "runtime/profiler.h"
#include "tensor/autograd.h"
#include "tensor/checkpoint.h"
#include "tensor/random.h"

namespace mt {

// ---- deferred init ----------------------------------------------------------------------------

namespace {
thread_local Device g_init_device = Device::cpu();
}  // namespace

Device init_device() { return g_init_device; }
InitDeviceGuard::InitDeviceGuard(Device device) : prev_(g_init_device) { g_init_device = device; }
InitDeviceGuard::~InitDeviceGuard() { g_init_device = prev_; }

void InitRecord::fill(Tensor& local, int64_t global_base, const Shape& global_strides) const {
  MT_CHECK(local.dtype() == dtype, "InitRecord::fill: local tensor {} must have the recorded dtype {}",
           local.desc(), dtype);
  MT_CHECK(global_strides.size() == local.dim(),
           "InitRecord::fill: global strides {} do not match local tensor {}", global_strides, local.desc());
  NoGradGuard no_grad;  // parameters require grad; filling them is not a differentiable op
  if (kind == Kind::kConstant)
    local.fill_(value);
  else
    fill_random(local, dist, a, b, seed, offset, global_base, global_strides);
}

namespace {

// Gives `t` the storage of `real` (same local shape): a meta tensor its real values, or a tensor
// its copy on another device (Module::to). The TensorImpl is kept (a DTensor keeps its spec), so
// every handle to it sees the new storage.
void adopt_storage(const Tensor& t, const Tensor& real) {
  MT_ASSERT(t.local_shape() == real.local_shape(), "adopt {} from {}", t.desc(), real.desc());
  TensorImpl* p = t.impl();
  p->storage = real.impl()->storage;
  p->strides = real.strides();
  p->offset = real.offset();
  p->device = real.device();
  p->dtype = real.dtype();
}

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string join_names(const std::vector<std::string>& names) {
  if (names.empty()) return "(none)";
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// "; did you mean 'weight'?" when a name is close to `want`, else "".
std::string suggestion(const std::string& want, const std::vector<std::string>& names) {
  const std::string* best = nullptr;
  size_t best_d = 0;
  for (const auto& n : names) {
    size_t d = edit_distance(want, n);
    if (!best || d < best_d) best = &n, best_d = d;
  }
  if (!best || best_d > std::max<size_t>(2, want.size() / 3)) return "";
  return fmt::format("; did you mean '{}'?", *best);
}

// ---- backward hooks ----

struct BackwardHookState {
  Module* module = nullptr;
  std::shared_ptr<Module> keep;  // keeps the module alive while its graph exists (if shared)
  size_t n_inputs = 0, n_outputs = 0;
  std::vector<size_t> input_idx, output_idx;  // which inputs / outputs pass through the nodes
  std::vector<Tensor> grad_outputs;           // saved by the outputs node for the inputs node
};

// Hooks may replace the gradients of routed tensors, but not change their shapes.
void check_hook_grads(const std::vector<Tensor>& grads, const std::vector<size_t>& routed,
                      const std::vector<Shape>& shapes, const Module& m, const char* what) {
  for (size_t j = 0; j < routed.size(); ++j) {
    size_t k = routed[j];
    MT_CHECK(!grads[k].defined() || grads[k].shape() == shapes[j],
             "backward hook of {}: {} {} was replaced by a gradient of shape {}, expected {}",
             m.path().empty() ? std::string("the root module") : "module '" + m.path() + "'", what, k,
             grads[k].shape(), shapes[j]);
  }
}

// Identity over the inputs that require grad; fires the module's backward hooks.
class ModuleInputsBackward : public Node {
 public:
  explicit ModuleInputsBackward(std::shared_ptr<BackwardHookState> st) : st_(std::move(st)) {}
  std::string name() const override { return "ModuleInputsBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    std::vector<Tensor> full(st_->n_inputs);
    std::vector<Shape> shapes;
    for (size_t j = 0; j < st_->input_idx.size(); ++j) {
      full[st_->input_idx[j]] = grads[j];
      shapes.push_back(outputs[j].dist ? outputs[j].dist->global_shape() : outputs[j].shape);  // logical shape
    }
    st_->module->fire_backward_hooks(full, st_->grad_outputs);
    check_hook_grads(full, st_->input_idx, shapes, *st_->module, "grad_input");
    std::vector<Tensor> out;
    for (size_t idx : st_->input_idx) out.push_back(full[idx]);
    return out;
  }

 private:
  std::shared_ptr<BackwardHookState> st_;
};

// Identity over the outputs that require grad; its pre-hook fires the backward-pre hooks.
class ModuleOutputsBackward : public Node {
 public:
  std::string name() const override { return "ModuleOutputsBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override { return grads; }
};

// Routes the selected tensors of `ts` through `node` (replacing them by its outputs); returns
// the indices routed.
std::vector<size_t> route_through(const std::shared_ptr<Node>& node, std::vector<Tensor>& ts) {
  std::vector<size_t> idx;
  std::vector<Tensor> srcs;
  std::vector<Tensor*> outs;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined() || !ts[i].requires_grad()) continue;
    idx.push_back(i);
    srcs.push_back(ts[i]);
    ts[i] = ts[i].detach();
    outs.push_back(&ts[i]);
  }
  if (!idx.empty()) set_history(node, srcs, outs);
  return idx;
}

}  // namespace

// ---- forward and hooks ------------------------------------------------------------------------

std::vector<Tensor> Module::operator()(std::vector<Tensor> inputs) {
  if (error_note_.empty()) return call(std::move(inputs));
  try {
    return call(std::move(inputs));
  } catch (const ModuleError&) {
    throw;  // an inner module (or hook) already said where
  } catch (const Error& e) {
    throw ModuleError(fmt::format("{}; in {}: {}", e.what(), where(), error_note_));
  }
}

std::vector<Tensor> Module::call(std::vector<Tensor> inputs) {
  // Profiling (runtime/profiler.h): the call is a span, and the module of the ops inside it.
  std::optional<ProfileScope> profiled;
  if (kernel_hooks_armed() && Profiler::current())
    profiled.emplace(ProfileEvent::Kind::kModule, path_.empty() ? std::string("(root)") : path_);
  for (auto& hook : forward_pre_hooks_.snapshot()) hook(*this, inputs);

  std::shared_ptr<BackwardHookState> st;
  if (GradMode::enabled() && (!backward_hooks_.empty() || !backward_pre_hooks_.empty())) {
    st = std::make_shared<BackwardHookState>();
    st->module = this;
    st->keep = weak_from_this().lock();
    st->n_inputs = inputs.size();
    st->input_idx = route_through(std::make_shared<ModuleInputsBackward>(st), inputs);
  }

  std::vector<Tensor> outputs;
  if (recompute_ == Recompute::kYes)
    outputs = checkpoint([this](const std::vector<Tensor>& in) { return forward(in); }, inputs);
  else
    outputs = forward(inputs);

  for (auto& hook : forward_hooks_.snapshot()) hook(*this, inputs, outputs);

  if (st) {
    st->n_outputs = outputs.size();
    auto node = std::make_shared<ModuleOutputsBackward>();
    std::vector<Shape> shapes;
    for (const Tensor& o : outputs)
      if (o.defined() && o.requires_grad()) shapes.push_back(o.shape());
    node->pre_hooks.add([st, shapes](std::vector<Tensor>& grads) {
      BackwardHookState* s = st.get();
      std::vector<Tensor> full(s->n_outputs);
      for (size_t j = 0; j < s->output_idx.size(); ++j) full[s->output_idx[j]] = grads[j];
      s->module->fire_backward_pre_hooks(full);
      check_hook_grads(full, s->output_idx, shapes, *s->module, "grad_output");
      for (size_t j = 0; j < s->output_idx.size(); ++j) grads[j] = full[s->output_idx[j]];
      s->grad_outputs = full;
      if (s->input_idx.empty()) {  // no input needs grad: the backward hooks fire here
        std::vector<Tensor> none(s->n_inputs);
        s->module->fire_backward_hooks(none, s->grad_outputs);
      }
    });
    st->output_idx = route_through(node, outputs);
  }
  return outputs;
}

Tensor Module::operator()(const Tensor& x) {
  std::vector<Tensor> out = (*this)(std::vector<Tensor>{x});
  MT_CHECK(out.size() == 1, "{} returned {} outputs; call it with a vector of inputs to get them all",
           where(), out.size());
  return out[0];
}

void Module::fire_backward_pre_hooks(std::vector<Tensor>& grad_outputs) {
  for (auto& hook : backward_pre_hooks_.snapshot()) hook(*this, grad_outputs);
}

void Module::fire_backward_hooks(std::vector<Tensor>& grad_inputs, const std::vector<Tensor>& grad_outputs) {
  for (auto& hook : backward_hooks_.snapshot()) hook(*this, grad_inputs, grad_outputs);
}

// ---- registration -----------------------------------------------------------------------------

std::string Module::where() const {
  return path_.empty() ? std::string("the root module") : fmt::format("module '{}'", path_);
}

void Module::check_name(const std::string& name, const char* what) const {
  MT_CHECK(!name.empty(), "register_{}: empty name in {}", what, where());
  MT_CHECK(name.find('.') == std::string::npos,
           "register_{}: name '{}' in {} must not contain '.' (dots separate path components)", what,
           name, where());
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  auto taken_slot = [&](const std::deque<Slot>& list) {
    return std::any_of(list.begin(), list.end(), [&](const Slot& s) { return s.name == name; });
  };
  const char* kind = taken_slot(params_) ? "parameter" : taken_slot(buffers_) ? "buffer"
                     : taken(children_)  ? "submodule"
                                         : nullptr;
  MT_CHECK(kind == nullptr, "register_{}: '{}' already names a {} of {}", what, name, kind ? kind : "",
           where());
}

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  check_name(name, "parameter");
  MT_CHECK(t.defined(), "register_parameter: '{}' in {} is an undefined tensor", name, where());
  MT_CHECK(t.is_leaf(), "register_parameter: '{}' in {} is {} with autograd history; pass t.detach()",
           name, where(), t.desc());
  if (is_floating(t.dtype()) && !t.requires_grad()) t.requires_grad_();
  params_.push_back({name, std::move(t), std::nullopt});
  return params_.back().value;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  check_name(name, "buffer");
  MT_CHECK(t.defined(), "register_buffer: '{}' in {} is an undefined tensor", name, where());
  buffers_.push_back({name, std::move(t), std::nullopt});
  return buffers_.back().value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name(name, "module");
  MT_CHECK(m != nullptr, "register_module: '{}' in {} is a null module", name, where());
  std::vector<const Module*> stack{m.get()};
  while (!stack.empty()) {  // a module may not contain itself
    const Module* cur = stack.back();
    stack.pop_back();
    MT_CHECK(cur != this, "register_module: '{}' in {} would make the module its own descendant", name,
             where());
    for (const auto& c : cur->children_) stack.push_back(c.second.get());
  }
  children_.emplace_back(name, m);
  m->set_path(join_path(path_, name));
}

void Module::set_path(const std::string& path) {
  path_ = path;
  for (auto& [name, child] : children_) child->set_path(join_path(path, name));
}

// ---- traversal --------------------------------------------------------------------------------

template <class Self, class Fn>
void Module::visit_slots(Self& self, const std::string& prefix, Slots which, Fn&& fn) {
  if (which != Slots::kBuffers)
    for (auto& s : self.params_) fn(join_path(prefix, s.name), s);
  if (which != Slots::kParams)
    for (auto& s : self.buffers_) fn(join_path(prefix, s.name), s);
  for (auto& [name, child] : self.children_) {
    Self& c = *child;
    visit_slots(c, join_path(prefix, name), which, fn);
  }
}

void Module::declare_shared_use(const std::string& param) {
  (void)get_parameter(param);  // names a parameter below this module, or throws naming it
  shared_uses_.push_back(param);
}

void Module::declare_shard_unit(const std::string& param, int dim, int64_t size, std::string what) {
  MT_CHECK(size > 0 && dim >= 0, "declare_shard_unit({}, dim {}, size {}) on {}: dim must be >= 0 and size > 0",
           param, dim, size, where());
  shard_units_.push_back({param, dim, size, std::move(what)});
}

std::vector<Module::ShardUnit> Module::shard_units() const {
  std::vector<ShardUnit> out = shard_units_;
  for (const auto& [name, child] : children_)
    for (ShardUnit u : child->shard_units()) {
      u.param = name + "." + u.param;
      out.push_back(std::move(u));
    }
  return out;
}

Module::NamedTensors Module::named_parameters() const {
  NamedTensors out;
  std::unordered_set<const TensorImpl*> seen;
  visit_slots(*this, "", Slots::kParams, [&](const std::string& path, const Slot& s) {
    if (seen.insert(s.value.impl()).second) out.emplace_back(path, s.value);
  });
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [path, t] : named_parameters()) out.push_back(t);
  return out;
}

Module::NamedTensors Module::named_buffers() const {
  NamedTensors out;
  std::unordered_set<const TensorImpl*> seen;
  visit_slots(*this, "", Slots::kBuffers, [&](const std::string& path, const Slot& s) {
    if (seen.insert(s.value.impl()).second) out.emplace_back(path, s.value);
  });
  return out;
}

std::shared_ptr<Module> Module::self_ptr() {
  if (auto p = weak_from_this().lock()) return p;
  return std::shared_ptr<Module>(std::shared_ptr<Module>(), this);  // not owned by a shared_ptr
}

Module::NamedModules Module::named_modules() {
  NamedModules out;
  std::unordered_set<const Module*> seen;
  std::function<void(const std::string&, const std::shared_ptr<Module>&)> walk =
      [&](const std::string& prefix, const std::shared_ptr<Module>& m) {
        if (!seen.insert(m.get()).second) return;
        out.emplace_back(prefix, m);
        for (const auto& [name, child] : m->children_) walk(join_path(prefix, name), child);
      };
  walk("", self_ptr());
  return out;
}

Module::NamedModules Module::named_children() const { return children_; }

const Module* Module::find_module(const std::string& path, const char* api) const {
  const Module* cur = this;
  std::string walked;
  size_t pos = 0;
  while (!path.empty() && pos <= path.size()) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const Module* next = nullptr;
    std::vector<std::string> names;
    for (const auto& [name, child] : cur->children_) {
      names.push_back(name);
      if (name == part) next = child.get();
    }
    MT_CHECK(next != nullptr, "{}: no submodule '{}' in {} while looking up '{}'{}; its submodules: {}", api,
             part, walked.empty() ? std::string("the root module") : "'" + walked + "'", path,
             suggestion(part, names), join_names(names));
    walked = join_path(walked, part);
    cur = next;
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

const Module::Slot* Module::find_slot(const std::string& path, Slots which, const char* api) const {
  size_t dot = path.rfind('.');
  std::string prefix = dot == std::string::npos ? "" : path.substr(0, dot);
  std::string name = dot == std::string::npos ? path : path.substr(dot + 1);
  const Module* m = find_module(prefix, api);
  const std::deque<Slot>& slots = which == Slots::kParams ? m->params_ : m->buffers_;
  std::vector<std::string> names;
  for (const Slot& s : slots) {
    if (s.name == name) return &s;
    names.push_back(s.name);
  }
  const char* kind = which == Slots::kParams ? "parameter" : "buffer";
  std::string other;
  for (const auto& c : m->children_)
    if (c.first == name) other = " ('" + name + "' is a submodule)";
  for (const Slot& s : which == Slots::kParams ? m->buffers_ : m->params_)
    if (s.name == name) other = fmt::format(" ('{}' is a {})", name, which == Slots::kParams ? "buffer" : "parameter");
  MT_FAIL("{}: no {} '{}' in {} while looking up '{}'{}{}; its {}s: {}", api, kind, name,
          prefix.empty() ? std::string("the root module") : "'" + prefix + "'", path, other,
          suggestion(name, names), kind, join_names(names));
}

Tensor Module::get_parameter(const std::string& path) const {
  return find_slot(path, Slots::kParams, "get_parameter")->value;
}

Tensor& Module::parameter_slot(const std::string& path) {
  return const_cast<Slot*>(find_slot(path, Slots::kParams, "parameter_slot"))->value;
}

Tensor Module::get_buffer(const std::string& path) const {
  return find_slot(path, Slots::kBuffers, "get_buffer")->value;
}

std::shared_ptr<Module> Module::get_module(const std::string& path) {
  Module* m = const_cast<Module*>(find_module(path, "get_module"));
  return m->self_ptr();
}

std::shared_ptr<Module> Module::replace_module(const std::string& path, std::shared_ptr<Module> m) {
  MT_CHECK(!path.empty(), "replace_module: the root module cannot be replaced");
  MT_CHECK(m != nullptr, "replace_module: '{}' in {}: null module", path, where());
  const size_t dot = path.rfind('.');
  Module* parent = dot == std::string::npos ? this : const_cast<Module*>(find_module(path.substr(0, dot), "replace_module"));
  const std::string name = dot == std::string::npos ? path : path.substr(dot + 1);
  for (auto& [child_name, child] : parent->children_) {
    if (child_name != name) continue;
    std::shared_ptr<Module> old = child;
    child = std::move(m);
    child->set_path(join_path(parent->path_, name));
    return old;
  }
  MT_FAIL("replace_module: {} has no module '{}'", where(), path);
}

// ---- state ------------------------------------------------------------------------------------

Module::NamedTensors Module::state_dict() const {
  NamedTensors out;
  visit_slots(*this, "", Slots::kAll, [&](const std::string& path, const Slot& s) { out.emplace_back(path, s.value); });
  return out;
}

LoadResult Module::load_state_dict(const NamedTensors& state, Strict strict) {
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [key, t] : state) {
    MT_CHECK(given.emplace(key, &t).second, "load_state_dict into {}: key '{}' appears twice in the state",
             where(), key);
    MT_CHECK(t.defined(), "load_state_dict into {}: '{}' is an undefined tensor", where(), key);
  }
  std::vector<std::pair<Tensor, const Tensor*>> copies;  // (destination, source)
  std::unordered_set<std::string> own;
  LoadResult result;
  std::vector<std::string> errors;
  visit_slots(*this, "", Slots::kAll, [&](const std::string& path, Slot& s) {
    own.insert(path);
    auto it = given.find(path);
    if (it == given.end()) {
      result.missing_keys.push_back(path);
      return;
    }
    const Tensor& src = *it->second;
    if (src.shape() != s.value.shape())
      errors.push_back(fmt::format("shape mismatch for '{}': the state has {} but the model has {}", path,
                                   src.shape(), s.value.shape()));
    copies.emplace_back(s.value, it->second);
  });
  for (const auto& [key, t] : state)
    if (!own.count(key)) result.unexpected_keys.push_back(key);
  if (strict == Strict::kYes) {
    if (!result.missing_keys.empty())
      errors.push_back(fmt::format("missing keys: {}", join_names(result.missing_keys)));
    if (!result.unexpected_keys.empty())
      errors.push_back(fmt::format("unexpected keys: {}", join_names(result.unexpected_keys)));
  }
  if (!errors.empty()) {
    std::string msg;
    for (const auto& e : errors) msg += (msg.empty() ? "" : "; ") + e;
    MT_FAIL("load_state_dict into {}: {}", where(), msg);
  }
  NoGradGuard no_grad;
  for (auto& [dst, src] : copies) {
    if (dst.is_meta()) {
      Tensor real = empty(dst.shape(), TensorOptions(dst.dtype()).with_device(src->device()));
      real.copy_(*src);
      adopt_storage(dst, real);
    } else {
      dst.copy_(src->device() == dst.device() ? *src : src->to(dst.device()));
    }
  }
  return result;
}

Module& Module::train() {
  training_ = true;
  for (auto& c : children_) c.second->train();
  return *this;
}

Module& Module::eval() {
  training_ = false;
  for (auto& c : children_) c.second->eval();
  return *this;
}

void Module::zero_grad() {
  for (auto& [path, p] : named_parameters()) p.set_grad(Tensor());
}

// ---- deferred init ----------------------------------------------------------------------------

Tensor& Module::add_init_param(const std::string& name, InitRecord rec) {
  Device dev = init_device();
  Tensor t = empty(rec.shape, TensorOptions(rec.dtype).with_device(dev));
  if (!dev.is_meta()) rec.fill(t, 0, rec.shape.contiguous_strides());
  Tensor& ref = register_parameter(name, std::move(t));
  params_.back().init = std::move(rec);
  return ref;
}

namespace {
InitRecord random_record(RandomDist dist, double a, double b, const Shape& shape, DType dtype) {
  InitRecord rec;
  rec.kind = InitRecord::Kind::kRandom;
  rec.dist = dist;
  rec.a = a;
  rec.b = b;
  rec.shape = shape;
  rec.dtype = dtype;
  Generator& gen = default_generator();
  rec.seed = gen.seed();
  rec.offset = gen.reserve(random_blocks(dist, dtype, shape.numel(), a, b));
  return rec;
}
}  // namespace

Tensor& Module::param_normal(const std::string& name, const Shape& shape, double mean, double std,
                             DType dtype) {
  check_name(name, "parameter");  // before reserving, so a failed call consumes nothing
  MT_CHECK(is_floating(dtype), "param_normal: '{}' in {} needs a floating dtype, not {}", name, where(), dtype);
  MT_CHECK(std >= 0, "param_normal: '{}' in {} has negative std {}", name, where(), std);
  return add_init_param(name, random_record(RandomDist::kNormal, mean, std, shape, dtype));
}

Tensor& Module::param_uniform(const std::string& name, const Shape& shape, double lo, double hi,
                              DType dtype) {
  check_name(name, "parameter");
  MT_CHECK(is_floating(dtype), "param_uniform: '{}' in {} needs a floating dtype, not {}", name, where(), dtype);
  MT_CHECK(lo <= hi, "param_uniform: '{}' in {} has lo {} > hi {}", name, where(), lo, hi);
  return add_init_param(name, random_record(RandomDist::kUniform, lo, hi, shape, dtype));
}

Tensor& Module::param_const(const std::string& name, const Shape& shape, double value, DType dtype) {
  check_name(name, "parameter");
  InitRecord rec;
  rec.kind = InitRecord::Kind::kConstant;
  rec.value = value;
  rec.shape = shape;
  rec.dtype = dtype;
  return add_init_param(name, std::move(rec));
}

const InitRecord* Module::init_record(const std::string& path) const {
  const Slot* s = find_slot(path, Slots::kParams, "init_record");
  return s->init ? &*s->init : nullptr;
}

void Module::materialize(Device device) {
  MT_CHECK(!device.is_meta(), "materialize: target device must hold storage, not meta");
  std::vector<std::pair<Tensor, const InitRecord*>> to_fill;
  std::vector<std::string> orphans;
  std::unordered_set<const TensorImpl*> seen;
  visit_slots(*this, "", Slots::kAll, [&](const std::string& path, Slot& s) {
    if (!s.value.is_meta() || !seen.insert(s.value.impl()).second) return;
    if (s.init)
      to_fill.emplace_back(s.value, &*s.init);
    else
      orphans.push_back(path);
  });
  MT_CHECK(orphans.empty(),
           "materialize {}: meta tensors without an init record (not created by param_normal/"
           "param_uniform/param_const): {}; load them with load_state_dict instead",
           where(), join_names(orphans));
  for (auto& [t, rec] : to_fill) {
    Tensor real = empty(rec->shape, TensorOptions(rec->dtype).with_device(device));
    rec->fill(real, 0, rec->shape.contiguous_strides());
    adopt_storage(t, real);
  }
}

Module& Module::to(Device device) {
  MT_CHECK(!device.is_meta(), "{}.to({}): the target device must hold storage, not meta", where(), device.str());
  std::unordered_set<const TensorImpl*> seen;
  std::vector<std::pair<std::string, Tensor>> moves;
  visit_slots(*this, "", Slots::kAll, [&](const std::string& path, Slot& s) {
    if (!s.value.defined() || !seen.insert(s.value.impl()).second) return;
    MT_CHECK(!s.value.is_meta(), "{}.to({}): '{}' ({}) is on the meta device; materialize or load it first", where(),
             device.str(), path, s.value.desc());
    if (s.value.device() != device) moves.emplace_back(path, s.value);
  });
  for (auto& [path, t] : moves) {
    Tensor real;
    {
      NoGradGuard no_grad;
      real = local_view(t).to(device);  // a DTensor moves its local shard; its spec stays
    }
    adopt_storage(t, real);
    t.set_grad(Tensor());
  }
  return *this;
}

// ---- ModuleList -------------------------------------------------------------------------------

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

std::vector<Tensor> ModuleList::forward(const std::vector<Tensor>&) {
  MT_FAIL("ModuleList {} is a container and has no forward(); call its elements (at(i)) instead",
          path().empty() ? std::string("(root)") : "'" + path() + "'");
}

const std::shared_ptr<Module>& ModuleList::at(size_t i) const {
  MT_CHECK(i < items_.size(), "ModuleList {}: index {} out of range for {} modules",
           path().empty() ? std::string("(root)") : "'" + path() + "'", i, items_.size());
  return items_[i];
}

void ModuleList::check_cast(size_t i, bool ok) const {
  MT_CHECK(ok, "ModuleList {}: element {} is not of the requested module type",
           path().empty() ? std::string("(root)") : "'" + path() + "'", i);
}

}  // namespace mt
