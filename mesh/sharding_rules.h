// Sharding propagation (docs/sharding.md): for an op, its input specs and its outputs' global
// shapes (from shape inference on meta tensors), the output placements per mesh dim, or an error
// that names the op, the input placements and what to change. Explicit: a rule never asks for a
// redistribution; an input it cannot take is an error. Pure functions of their arguments: the
// dispatcher caches the results (mesh/dispatch.cpp).
#pragma once

#include <string>
#include <vector>

#include "mesh/dtensor.h"
#include "tensor/dist_dispatch.h"

namespace mt {

struct RuleResult {
  std::vector<Placements> outputs;  // one placement list per output
  // Per input: mesh dims (bitmask) on which the input is Replicate but enters a Partial(sum)
  // result, so only coordinate 0 of those dims contributes it (the others use zeros).
  std::vector<uint32_t> root_only;
  // Mesh dims on which output 0 is Partial(sum): constants are added by coordinate 0 only.
  uint32_t partial_sum_dims = 0;
  std::string error;  // non-empty: the rule rejects these inputs
};

// `in[i]` is null for an absent (undefined) input; plain inputs arrive as all-Replicate specs.
RuleResult propagate(const DistOp& op, const std::vector<const DTensorSpec*>& in,
                     const std::vector<Shape>& out_shapes);

// `p` moved to tensor dim `dim` (same kind, groups or units).
Placement with_dim(const Placement& p, int dim);

}  // namespace mt
