// Module: the unit a model is built from (PyTorch-like). A module owns named parameters, buffers
// and child modules in registration order, so every tensor has a stable dotted path
// ("layers.0.attn.wq.weight") that plans, checkpoints and optimizers key on. Modules carry forward
// and backward hooks (the attachment points for parallelization), can recompute their activations
// in backward (tensor/checkpoint.h), and can create parameters on the meta device with a recorded
// Philox stream position so that materializing them later, possibly only a shard, yields exactly
// the weights a direct CPU build would have. See docs/modules.md.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/params.h"
#include "runtime/error.h"
#include "tensor/hooks.h"
#include "tensor/tensor.h"

namespace mt {

// ---- deferred init ----------------------------------------------------------------------------

// The device parameter helpers (Module::param_*) create tensors on; thread-local, CPU by default.
Device init_device();
// `InitDeviceGuard guard(Device::meta());` builds a model without allocating its weights.
class InitDeviceGuard {
 public:
  explicit InitDeviceGuard(Device device);
  ~InitDeviceGuard();
  InitDeviceGuard(const InitDeviceGuard&) = delete;
  InitDeviceGuard& operator=(const InitDeviceGuard&) = delete;

 private:
  Device prev_;
};

// How a parameter was (or will be) initialized: enough to regenerate any part of it later.
struct InitRecord {
  enum class Kind { kRandom, kConstant };
  Kind kind = Kind::kConstant;
  RandomDist dist = RandomDist::kUniform;  // kRandom: distribution and its parameters a, b
  double a = 0, b = 0;
  uint64_t seed = 0, offset = 0;  // kRandom: Philox stream position reserved at creation
  double value = 0;               // kConstant
  Shape shape;                    // the global (unsharded) shape
  DType dtype = DType::kF32;

  // Fills `local`, whose element at local index i is element global_base + sum_d i_d *
  // global_strides[d] of the global tensor (row-major), with exactly the values the whole tensor
  // has there. A whole tensor is fill(t, 0, t.shape().contiguous_strides()).
  void fill(Tensor& local, int64_t global_base, const Shape& global_strides) const;
};

// ---- Module -----------------------------------------------------------------------------------

enum class Recompute { kNo, kYes };  // recompute activations in backward (checkpointing)
enum class Strict { kNo, kYes };     // load_state_dict: unknown or missing keys are errors

struct LoadResult {
  std::vector<std::string> missing_keys;     // in the model, not in the state
  std::vector<std::string> unexpected_keys;  // in the state, not in the model
};

// An error that already carries a module's note (Module::set_error_note): modules further out
// pass it on unchanged, so the innermost note is the one a message shows.
class ModuleError : public Error {
 public:
  using Error::Error;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  using ForwardPreHook = std::function<void(Module&, std::vector<Tensor>& inputs)>;
  using ForwardHook =
      std::function<void(Module&, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs)>;
  using BackwardPreHook = std::function<void(Module&, std::vector<Tensor>& grad_outputs)>;
  using BackwardHook = std::function<void(Module&, std::vector<Tensor>& grad_inputs,
                                          const std::vector<Tensor>& grad_outputs)>;
  using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
  using NamedModules = std::vector<std::pair<std::string, std::shared_ptr<Module>>>;

  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual std::vector<Tensor> forward(const std::vector<Tensor>& inputs) = 0;
  // Forward with hooks (and recomputation if set): forward-pre hooks, forward, forward hooks.
  std::vector<Tensor> operator()(std::vector<Tensor> inputs);
  Tensor operator()(const Tensor& x);  // one input, one output

  // ---- registration (names: non-empty, no '.', unique among parameters, buffers, children) ----
  // Floating parameters are made to require grad. The reference stays valid for the module's life.
  Tensor& register_parameter(const std::string& name, Tensor t);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    static_assert(std::is_base_of_v<Module, M>, "register_module needs a Module");
    add_child(name, m);
    return m;
  }

  // ---- parameters created from the default generator (deferred on the meta init device) ----
  // Each reserves its Philox blocks at creation whatever the device, so creation order alone
  // decides the values; on meta the tensor has no storage until materialize().
  Tensor& param_normal(const std::string& name, const Shape& shape, double mean, double std,
                       DType dtype = DType::kF32);
  Tensor& param_uniform(const std::string& name, const Shape& shape, double lo, double hi,
                        DType dtype = DType::kF32);
  Tensor& param_const(const std::string& name, const Shape& shape, double value,
                      DType dtype = DType::kF32);
  // The record of a parameter created by param_*; nullptr for one registered directly.
  const InitRecord* init_record(const std::string& path) const;
  // Gives every meta parameter (recursively) storage on `device`, filled from its InitRecord.
  // The TensorImpl is kept, so handles to the parameter held anywhere see the real tensor.
  void materialize(Device device = Device::cpu());
  // Moves every parameter and buffer (recursively; tied tensors once) to `device` in place: each
  // keeps its TensorImpl, as materialize() does, so handles held anywhere (optimizers, plans, hooks)
  // see the moved tensor. Values are copied exactly; gradients are cleared. Meta tensors are an
  // error (materialize or load first). Returns *this.
  Module& to(Device device);

  // ---- shard units: what a plan may not split (declared by models, checked by parallelize()) ----
  // Along `dim`, parameter `param` (a path below this module, e.g. "q_proj.weight") is made of
  // units of `size` elements that one op needs whole on one rank, e.g. the rows of one attention
  // head: a placement that splits that dim must give every rank whole units. `what` names a unit
  // for errors ("attention head"). Nothing here knows of meshes.
  struct ShardUnit {
    std::string param;  // path from the module shard_units() was called on
    int dim = 0;
    int64_t size = 1;
    std::string what;
  };
  void declare_shard_unit(const std::string& param, int dim, int64_t size, std::string what);
  std::vector<ShardUnit> shard_units() const;  // this module's and its children's, recursively

  // ---- parameters read outside their module (declared by models, honoured by parallelize) ----
  // This module's own forward reads `param` (a parameter path below it) after the module that
  // owns it has returned: tied weights, e.g. a causal LM's head reading its embedding's weight.
  // A plan that gathers that parameter for compute keeps it gathered until this module's
  // forward ends instead of its owner's.
  void declare_shared_use(const std::string& param);
  const std::vector<std::string>& shared_uses() const { return shared_uses_; }

  // ---- traversal: dotted paths, registration order, pre-order (own tensors, then children) ----
  // Parameters and modules reachable twice (tied weights) are listed once, under the first path.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  NamedModules named_modules();  // the root is ""
  NamedModules named_children() const;
  Tensor get_parameter(const std::string& path) const;
  // The slot that holds parameter `path` (what the owning module's forward reads). For
  // parallelize() (plan/parallelize.h), which swaps in the compute-time (RUN) placement of a
  // parameter for the forward and puts the stored one back after.
  Tensor& parameter_slot(const std::string& path);
  Tensor get_buffer(const std::string& path) const;
  std::shared_ptr<Module> get_module(const std::string& path);
  // Puts `m` where the descendant at `path` (not the root) was, under the same name and path;
  // returns the module it replaces. Pipeline stages use it to drop the other stages' modules
  // (plan/pipeline.h). A ModuleList's at() keeps returning the old module.
  std::shared_ptr<Module> replace_module(const std::string& path, std::shared_ptr<Module> m);
  // Where this module was last registered, from its root ("" for a root).
  const std::string& path() const { return path_; }

  // ---- state ----
  // Parameters then buffers of each module, pre-order; tied tensors appear under every path.
  NamedTensors state_dict() const;
  // Copies values in place (converting dtype); shape mismatches always throw, naming the key and
  // both shapes. With Strict::kYes missing or unexpected keys throw, listing them; nothing is
  // modified when anything throws. Meta tensors receive storage on the source's device.
  LoadResult load_state_dict(const NamedTensors& state, Strict strict = Strict::kYes);

  Module& train();  // recursive
  Module& eval();   // recursive
  bool is_training() const { return training_; }
  void zero_grad();  // sets every parameter's grad undefined

  void set_recompute(Recompute r) { recompute_ = r; }
  Recompute recompute() const { return recompute_; }

  // ---- error context ----
  // A note added to errors (mt::Error) that escape this module's call, its hooks and its
  // submodules included: "WHAT; in module 'a.b': NOTE". Set by the layer that installs the hooks
  // (plan/parallelize.cpp: the plan entries in effect), so that an op failing deep inside a
  // forward names the module and the plan lines. The innermost module with a note adds it, once.
  void set_error_note(std::string note) { error_note_ = std::move(note); }
  const std::string& error_note() const { return error_note_; }

  // ---- hooks (firing order in docs/modules.md) ----
  HookHandle register_forward_pre_hook(ForwardPreHook hook) { return forward_pre_hooks_.add(std::move(hook)); }
  HookHandle register_forward_hook(ForwardHook hook) { return forward_hooks_.add(std::move(hook)); }
  // Fires when the gradients w.r.t. the module outputs are ready; may modify them.
  HookHandle register_backward_pre_hook(BackwardPreHook hook) {
    return backward_pre_hooks_.add(std::move(hook));
  }
  // Fires when the gradients w.r.t. the module inputs are computed; may modify grad_inputs
  // (undefined entries for inputs that need no grad).
  HookHandle register_backward_hook(BackwardHook hook) { return backward_hooks_.add(std::move(hook)); }

  // Used by the backward-hook nodes.
  void fire_backward_pre_hooks(std::vector<Tensor>& grad_outputs);
  void fire_backward_hooks(std::vector<Tensor>& grad_inputs, const std::vector<Tensor>& grad_outputs);

 private:
  struct Slot {
    std::string name;
    Tensor value;
    std::optional<InitRecord> init;
  };
  void check_name(const std::string& name, const char* what) const;
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void set_path(const std::string& path);
  std::string where() const;  // "module 'a.b'" or "the root module"
  std::vector<Tensor> call(std::vector<Tensor> inputs);  // operator() without the error note
  Tensor& add_init_param(const std::string& name, InitRecord rec);
  enum class Slots { kParams, kBuffers, kAll };
  // Visits (path, slot) pre-order: each module's parameters, then its buffers, then children;
  // no deduplication.
  template <class Self, class Fn>
  static void visit_slots(Self& self, const std::string& prefix, Slots which, Fn&& fn);
  const Module* find_module(const std::string& path, const char* api) const;
  const Slot* find_slot(const std::string& path, Slots which, const char* api) const;
  std::shared_ptr<Module> self_ptr();

  std::deque<Slot> params_;  // deque: references returned by register_* stay valid
  std::deque<Slot> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<ShardUnit> shard_units_;
  std::vector<std::string> shared_uses_;
  std::string path_;
  bool training_ = true;
  Recompute recompute_ = Recompute::kNo;
  std::string error_note_;
  HookList<ForwardPreHook> forward_pre_hooks_;
  HookList<ForwardHook> forward_hooks_;
  HookList<BackwardPreHook> backward_pre_hooks_;
  HookList<BackwardHook> backward_hooks_;
};

// An ordered list of child modules named "0", "1", ...; a container only (no forward).
class ModuleList : public Module {
 public:
  ModuleList() = default;
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    items_.push_back(register_module(std::to_string(items_.size()), m));
    return m;
  }
  size_t size() const { return items_.size(); }
  const std::shared_ptr<Module>& at(size_t i) const;
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto p = std::dynamic_pointer_cast<M>(at(i));
    check_cast(i, p != nullptr);
    return p;
  }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  void check_cast(size_t i, bool ok) const;
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace mt
