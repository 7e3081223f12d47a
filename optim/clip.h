// Gradient clipping by global L2 norm, with torch.nn.utils.clip_grad_norm_ semantics: the norm of
// all gradients together, computed in double in a fixed order (so the same on any thread count),
// and a scale max_norm / (norm + 1e-6) applied in place when it is below 1.
#pragma once

#include <vector>

#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace mt {

// Returns the total L2 norm of the gradients of `params` (parameters without a gradient are
// skipped). Scales every gradient by max_norm / (norm + 1e-6) when that is < 1. max_norm <= 0
// disables the scaling (the norm is still returned); a non-finite norm (inf/nan gradients) is
// returned without scaling anything, so the caller can skip the step.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
double clip_grad_norm(const NamedTensors& params, double max_norm);

// The sum of squares of one tensor's values, accumulated in double in a fixed order.
double l2_norm_sq(const Tensor& t);

}  // namespace mt
