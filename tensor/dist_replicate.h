// dist_replicate: a DTensor made Replicate on every mesh dim (Partial sums all-reduced, splits
// gathered), differentiable; a plain tensor is returned as it is. A collective: every rank of the
// mesh calls it. For model code that needs a whole-batch statistic of a batch-split tensor, e.g.
// the router losses of an MoE model (models/moe.cpp) under expert parallelism, without depending on
// mesh/: mesh/ installs the handler with the op dispatch (tensor/dist_dispatch.h).
#pragma once

#include "tensor/tensor.h"

namespace mt {

using DistReplicateHandler = Tensor (*)(const Tensor& t);
void set_dist_replicate_handler(DistReplicateHandler h);
Tensor dist_replicate(const Tensor& t);

}  // namespace mt
