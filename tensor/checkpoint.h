// Activation recomputation (gradient checkpointing): run a function without keeping its
// intermediate activations and recompute them in backward. Memory for the saved activations of
// `fn` drops to its inputs; the price is a second forward of `fn` during backward. Random ops
// inside `fn` (dropout) draw the same numbers both times because the default generator's offset
// is restored for the recomputation. See docs/modules.md.
#pragma once

#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace mt {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Runs fn(inputs) without recording autograd, saving only `inputs` and the default generator
// state. When grad mode is on, the floating outputs get one node whose backward restores the
// generator, recomputes fn with grad on detached copies of the inputs, backpropagates the output
// grads through it (accumulating into parameters used inside fn) and returns the inputs' grads.
// The outputs are differentiable even when no input requires grad, because fn may use
// parameters. Inputs must not be modified in place before backward (checked).
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

// The recomputed forward running on this thread now (the innermost one, when a recomputation's
// backward recomputes a nested checkpoint): a number unique to it, or 0 outside any. Something
// that caches tensors per forward pass (an FSDP unit's gathered views) tells the passes apart
// with it.
uint64_t current_recompute();

}  // namespace mt
