// AdamW (Loshchilov & Hutter) with PyTorch's torch.optim.AdamW semantics: decoupled weight decay
// p -= lr * wd * p applied before the Adam update, bias-corrected moments, eps added to the
// corrected sqrt of the second moment. Weight decay comes from each ParamGroup. State:
// "exp_avg.<name>", "exp_avg_sq.<name>" (formulas in docs/optim.md).
#pragma once

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

 private:
  AdamWOptions opts_;
};

}  // namespace mt
