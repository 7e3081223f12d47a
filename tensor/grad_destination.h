// Zero-copy gradients (FSDP's DBuffer, plan/fsdp_buffer.h, docs/fsdp.md).
//
// A buffer of parameters (an FSDP unit's gathered buffer) can say where the gradients of the
// tensors that view it go: a backward formula that computes the whole gradient of such a weight
// (linear's weight and bias, rms_norm, embedding) asks grad_destination(weight) and, when it gets
// a tensor (the weight's shape, contiguous, its dtype and device), writes the gradient into it and
// returns it instead of a fresh tensor. Each destination is handed out at most once per backward of its unit
// (a second use of the weight gets a fresh tensor and the engine adds the two), never while a
// backward records a graph (create_graph), and only for the registered storage.
//
// A weight used twice in one backward (tied embeddings: the lookup and the head) gets its
// destination for one use only; the engine then adds the other use's gradient into that
// destination in place (accumulate_grad_in_place), so the sum stays in the buffer, with the bits
// of the out-of-place sum. The buffer says which storage holds its destinations
// (set_grad_accumulator).
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

// `storage`'s views that a destination finder handed out may take a second gradient in place
// (on = false removes it).
void set_grad_accumulator(const Storage* storage, bool on);
// The engine's sum of two gradients of one tensor: when `into` is a view of an accumulator
// storage (and `g` has its shape, dtype, device and DTensor spec, and does not overlap it), adds
// `g` into it in place and returns true; otherwise false (the caller adds out of place). Never
// while a backward records a graph.
bool accumulate_grad_in_place(const Tensor& into, const Tensor& g);

// `storage` lends views of itself as .grad (on = false removes it).
void set_grad_lender(const Storage* storage, bool on);
bool lends_grad_views(const Storage* storage);

}  // namespace mt
