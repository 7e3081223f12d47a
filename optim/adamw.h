// AdamW (Loshchilov & Hutter) with PyTorch's torch.optim.AdamW semantics: decoupled weight decay
// p -= lr * wd * p applied before the Adam update, bias-corrected moments, eps added to the
// corrected sqrt of the second moment. Weight decay comes from each ParamGroup. State:
// "exp_avg.<name>", "exp_avg_sq.<name>" (formulas in docs/optim.md).
#pragma once

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

 protected:
  void update(Slot& slot, const Tensor& grad, double lr, double weight_decay) override;
  void finish_step(bool apply) override;

 private:
  AdamWOptions opts_;
  // Updates that the fused kernel runs at the end of the step, per device, with their tensors
  // (kept alive, versions bumped once run).
  struct Queued {
    AdamWParams params;
    Tensor p, grad, m, v;
  };
  std::vector<Queued> queued_;
};

}  // namespace mt
