// Differentiable all-to-all(v) of plain (local) tensors over one communicator: the token exchange
// of expert parallelism (plan/expert_dispatch.h). The backward of an exchange is the exchange back:
// the gradient rows return to the ranks the rows came from, in the order they were sent.
#pragma once

#include <cstdint>
#include <vector>

#include "mesh/communicator.h"
#include "tensor/tensor.h"

namespace mt {

// send_counts[j] rows (dim 0) of `in` go to group rank j, in order; recv_counts[j] rows come from
// rank j. Returns the rows received, ordered by source rank (shape [sum recv_counts, ...]).
// Recorded by autograd when `in` requires grad. Every rank of `comm` calls it (collective).
Tensor exchange_rows(Communicator comm, const Tensor& in, std::vector<int64_t> send_counts,
                     std::vector<int64_t> recv_counts);

}  // namespace mt
