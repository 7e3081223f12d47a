// SGD with momentum, dampening, Nesterov and coupled (L2) weight decay, with PyTorch's
// torch.optim.SGD semantics (formulas in docs/optim.md). Weight decay comes from each
// ParamGroup; a momentum buffer ("momentum_buffer.<name>") exists only when momentum != 0.
#pragma once

#include "optim/optimizer.h"

namespace mt {

enum class Nesterov { kNo, kYes };

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  Nesterov nesterov = Nesterov::kNo;  // needs momentum > 0 and dampening == 0
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, const SGDOptions& opts);
  const SGDOptions& options() const { return opts_; }

 protected:
  void update(Slot& slot, const Tensor& grad, double lr, double weight_decay) override;

 private:
  SGDOptions opts_;
};

}  // namespace mt
