// AdamW (Loshchilov & Hutter) with PyTorch's torch.optim.AdamW semantics: decoupled weight decay
// p -= lr * wd * p applied before the Adam update, bias-corrected moments, eps added to the
// corrected sqrt of the second moment. Weight decay comes from each ParamGroup. State:
// "exp_avg.<name>", "exp_avg_sq.<name>" (formulas in docs/optim.md).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/params.h"
#include "optim/optimizer.h"

namespace mt {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& opts);
  const AdamWOptions& options() const { return opts_; }

  // Mixed precision in one pass (the trainer's bf16 path, docs/optim.md): the next step() scales
  // every gradient by `scale` (clipping's coefficient) as it reads it; reset to 1 after the step.
  void set_grad_scale(double scale);
  // Compute copies of the parameters: after each update of the parameter named `name`, its new
  // value is also stored into `copy` (bf16/f16, same shape: the model's weights behind f32 masters).
  void set_param_copies(const NamedTensors& copies);

 protected:
  void update(Slot& slot, const Tensor& grad, double lr, double weight_decay) override;
  void finish_step(bool apply) override;
  bool accepts_grad(const Tensor& param, const Tensor& grad) const override;

 private:
  AdamWOptions opts_;
  // Updates that the fused kernel runs at the end of the step, per device, with their tensors
  // (kept alive, versions bumped once run).
  struct Queued {
    AdamWParams params;
    Tensor p, grad, m, v, copy;
  };
  std::vector<Queued> queued_;
  double grad_scale_ = 1;
  std::unordered_map<std::string, Tensor> copies_;
};

}  // namespace mt
