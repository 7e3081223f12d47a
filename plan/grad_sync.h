// The simplest gradient reduction: after backward, every parameter gradient that is Partial over
// some mesh dims is redistributed to the parameter's placements (one collective per tensor and
// mesh dim, no buckets, no overlap). The reference for the bucketed reducer
// (plan/grad_reducer.h) and enough for small models.
#pragma once

#include "tensor/module.h"

namespace mt {

// Collective over the parameters' mesh (every rank calls it): one small all_reduce agrees which
// parameters got a gradient on some rank and over which mesh dims it is Partial, so that a rank
// without a gradient (its tokens skipped an expert) takes part with zeros. A parameter that got a
// gradient on no rank keeps none. Returns the number of gradients reduced.
int sync_gradients(Module& model);

}  // namespace mt
