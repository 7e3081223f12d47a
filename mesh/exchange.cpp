// exchange_rows: all_to_allv with an autograd record (mesh/exchange.h).
#include "mesh/exchange.h"

#include <numeric>

#include "runtime/error.h"
#include "tensor/autograd.h"

namespace mt {

Tensor exchange_rows(Communicator comm, const Tensor& in, std::vector<int64_t> send_counts,
                     std::vector<int64_t> recv_counts) {
  MT_CHECK(!in.is_distributed(), "exchange_rows: expected a local tensor, got a DTensor");
  MT_CHECK(in.dim() >= 1, "exchange_rows: expected at least one dim, got {}", in.desc());
  const auto P = static_cast<size_t>(comm.size());
  MT_CHECK(send_counts.size() == P && recv_counts.size() == P,
           "exchange_rows: {} send and {} receive counts for a group of {} ranks", send_counts.size(),
           recv_counts.size(), P);
  MT_CHECK(std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}) == in.size(0),
           "exchange_rows: send counts add up to {} rows, the input has {}",
           std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}), in.size(0));
  Tensor out;
  {
    NoGradGuard ng;
    out = comm.all_to_allv(in.detach().contiguous(), send_counts, recv_counts);
  }
  if (needs_grad(in)) {
    record("ExchangeRowsBackward", {in}, out, [comm, send_counts, recv_counts](const std::vector<Tensor>& g) {
      // The gradient of each received row goes back to its sender, where it lands in send order.
      return std::vector<Tensor>{exchange_rows(comm, g[0], recv_counts, send_counts)};
    });
  }
  return out;
}

}  // namespace mt
