// DTensor ops that are not one local op: they communicate inside (docs/sharding.md).
// - embedding with a vocabulary-split table: masked local lookup, Partial(sum) result;
// - cross_entropy with vocabulary-split logits (Megatron's vocab-parallel loss: max and sum of
//   exponentials all-reduced over the vocabulary dims), and any reduced cross_entropy (the sum and
//   the count of targets all-reduced): the result is Replicate;
// - random fills of a DTensor: every rank fills its shard with the single-device values.
#pragma once

#include <optional>
#include <vector>

#include "tensor/dist_dispatch.h"
#include "tensor/tensor.h"

namespace mt {

// The composite result when `op` on `in` is one of the ops above, else nullopt.
std::optional<Tensor> dist_composite(const DistOp& op, const std::vector<Tensor>& in);

// Fills DTensor `t` in place (op.extra is a DistRandomFill); returns t.
Tensor dist_random_fill(const DistOp& op, const Tensor& t);

}  // namespace mt
