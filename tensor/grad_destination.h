// Zero-copy gradients (FSDP's DBuffer, plan/fsdp_buffer.h, docs/fsdp.md).
//
// A buffer of parameters (an FSDP unit's gathered buffer) can say where the gradients of the
// tensors that view it go: a backward formula that computes the whole gradient of such a weight
// (linear, rms_norm, embedding) asks grad_destination(weight) and, when it gets a tensor (the
// weight's shape, contiguous, its dtype and device), writes the gradient into it and returns it
// instead of a fresh tensor. Each destination is handed out at most once per backward of its unit
// (a second use of the weight gets a fresh tensor and the engine adds the two), never while a
// backward records a graph (create_graph), and only for the registered storage.
//
// A gradient buffer can also lend its views as leaves' .grad: AccumulateGrad takes a gradient
// that views a lending storage as the leaf's .grad without cloning it (the FSDP unit's shard of
// gradients, whose disjoint views are the parameters' gradients). The lender promises not to
// write that storage again while a .grad views it.
#pragma once

#include <functional>

#include "tensor/tensor.h"

namespace mt {

using GradDestinationFn = std::function<Tensor(const Tensor& weight)>;

// Registers (or, with an empty fn, removes) the destination finder of `storage`'s viewers.
void set_grad_destination(const Storage* storage, GradDestinationFn fn);
// Where `weight`'s gradient should be written, or undefined (compute a fresh one).
Tensor grad_destination(const Tensor& weight);

// `storage` lends views of itself as .grad (on = false removes it).
void set_grad_lender(const Storage* storage, bool on);
bool lends_grad_views(const Storage* storage);

}  // namespace mt
