// The simplest gradient reduction: after backward, every parameter gradient that is Partial over
// some mesh dims is redistributed to the parameter's placements (one collective per tensor and
// mesh dim, no buckets, no overlap). The reference for the bucketed reducer
// (plan/grad_reducer.h) and enough for small models.
#pragma once

#include "tensor/module.h"

namespace mt {

// Returns the number of gradients reduced.
int sync_gradients(Module& model);

}  // namespace mt
