// Optimizer: the base of SGD and AdamW. It owns the parameter groups (each with its own weight
// decay and learning-rate scale), the per-parameter state (momentum, Adam moments, step counts),
// and the state_dict that lets a checkpoint resume training bit for bit. Subclasses implement
// the update of one parameter; the base does the bookkeeping, skips parameters without a
// gradient and runs every update under NoGradGuard, in place. Formulas and key names:
// docs/optim.md.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace mt {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct ParamGroup {
  NamedTensors params;     // names key the optimizer state ("exp_avg.<name>")
  double weight_decay = 0;
  double lr_scale = 1;     // the group's lr is Optimizer::lr() * lr_scale
};

// The usual split for transformers: group 0 holds the tensors with dim >= 2 (matmul weights and
// embeddings) and decays with `weight_decay`; group 1 holds the rest (norm gains, biases) and
// does not decay. Tensors that do not require grad (frozen) are left out. Both groups are always
// returned, possibly empty, so that group indices are stable.
std::vector<ParamGroup> make_param_groups(const NamedTensors& named_params, double weight_decay);

class Optimizer {
 public:
  Optimizer(std::vector<ParamGroup> groups, double lr, std::vector<std::string> state_kinds,
            const char* name);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (the others, and their state, are left
  // untouched). Increments step_count() even when no parameter had a gradient.
  virtual void step();
  void zero_grad();  // sets every parameter's grad undefined

  void set_lr(double lr);
  double lr() const { return lr_; }
  int64_t step_count() const { return step_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  // "step" (0-d i64: step_count()), then for each state kind ("exp_avg", ...) and each parameter
  // in group order "<kind>.<param name>", then "step.<param name>" (0-d i64: how many updates the
  // parameter has had, which the bias correction and first-momentum step use). The tensors are
  // the live state, not copies: serialize (or clone) them before stepping again.
  virtual NamedTensors state_dict() const;
  // Copies a state_dict() into this optimizer (converting dtype). Missing or unexpected keys and
  // shape mismatches throw one error listing them all; nothing is modified when it throws.
  virtual void load_state_dict(const NamedTensors& state);

 protected:
  struct Slot {
    std::string name;
    Tensor param;
    size_t group = 0;
    int64_t steps = 0;          // updates applied to this parameter so far
    std::vector<Tensor> state;  // one per state kind, like param (zeros at start)
  };
  // Updates slot.param in place from grad (same shape as the parameter); slot.steps has already
  // been incremented. lr and weight_decay are the group's.
  virtual void update(Slot& slot, const Tensor& grad, double lr, double weight_decay) = 0;
  // Called once after the update() calls of a step: an optimizer that queued work in update()
  // (AdamW's multi-tensor kernel) runs it here, or drops it (apply = false) when step() throws.
  virtual void finish_step(bool apply) { (void)apply; }
  // May `grad` (a defined gradient of `param`) be given to update()? By default only a gradient of
  // the parameter's dtype; AdamW also takes 16-bit gradients of f32 (master) parameters.
  virtual bool accepts_grad(const Tensor& param, const Tensor& grad) const { return grad.dtype() == param.dtype(); }
  const char* name() const { return name_; }
  // For optimizers that keep their own state (shapes or dtypes other than the parameter's: 8-bit
  // AdamW's codes, Muon's per-parameter kinds): `own` (key, live tensor) inserted after "step" in
  // Optimizer::state_dict()'s order, and loaded by copying the given tensor of each key of `own`
  // (shapes checked; missing, duplicate or malformed keys listed in one error) after
  // Optimizer::load_state_dict has taken the rest (step counts; it reports unexpected keys).
  // Nothing is modified when it throws.
  NamedTensors state_dict_with(const NamedTensors& own) const;
  void load_state_dict_with(const NamedTensors& state, const NamedTensors& own);

 private:
  std::vector<ParamGroup> groups_;
  std::vector<std::string> kinds_;
  std::vector<Slot> slots_;
  double lr_ = 0;
  int64_t step_ = 0;
  const char* name_;
};

namespace detail {
// True when t and all of others are contiguous f32 or f64 CPU tensors of t's dtype and shape: the
// optimizers then run fused host loops over data_ptr instead of a chain of tensor ops.
bool fused_host_ok(const Tensor& t, const std::vector<Tensor>& others);
// The same on the CPU or one CUDA device (every tensor on t's device): what the fused optimizer
// kernels (kernels/registry.h, `adamw`) take.
bool fused_ok(const Tensor& t, const std::vector<Tensor>& others);
}  // namespace detail

}  // namespace mt
