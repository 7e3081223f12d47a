// Collectives over one group of ranks (a communicator of a DeviceMesh dimension or of several
// flattened dimensions). Host tensors go over MPI; CUDA tensors go over NCCL (a build with NCCL:
// the group's NCCL communicator is created on its first CUDA collective, the unique id broadcast
// over MPI, on the tensors' device, one GPU per rank). Every collective is asynchronous
// underneath: `x_async` returns a Work handle, and `x` is `x_async(...).wait()`. A wait that
// exceeds collective_timeout() ends the whole job with an error naming the collective, the group
// and this rank (abort_job; NCCL communicators are aborted first): a dead or hung peer never
// leaves the others waiting forever. Creating a communicator (and a group's NCCL communicator)
// has the same deadline.
//
// Rules: tensors are contiguous, of any dtype, all on the host or all on one CUDA device (a mix
// is an error naming both); outputs have the input's dtype and device and the shape the
// collective defines (errors name the collective, shapes and group size). Host bf16 and f16
// reductions gather the inputs and reduce them in f32 in rank order 0..size-1, rounding once;
// NCCL reduces them natively. Either way every rank gets the same bits.
// CUDA tensors: the collective runs on a communication stream ordered after the work queued on
// the calling thread's current stream; wait() returns once it completed on the GPU. NCCL has no
// tags: send/recv between two ranks match in posting order (a rank's send to itself is a copy).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mt {

namespace detail {
class CommHandle;
}

enum class CommReduceOp { kSum, kAvg, kMax, kMin };
const char* comm_reduce_op_name(CommReduceOp op);

// How long a wait (or a communicator creation) may take before the job is aborted. Default 300 s, or MT_COLLECTIVE_TIMEOUT_S
// (seconds, may be fractional) read once at first use; the setter wins afterwards. Each Work
// takes the timeout in force when it was started.
std::chrono::milliseconds collective_timeout();
void set_collective_timeout(std::chrono::milliseconds timeout);

// Handle of an in-flight collective. Keeps its tensors alive until complete. wait() is idempotent;
// dropping an unfinished Work waits for it (MPI cannot cancel a collective, and its buffers must
// outlive it). A default Work is complete.
class Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> s) : s_(std::move(s)) {}

  void wait();
  bool is_completed();  // never blocks
  // The output of collectives that allocate it (all_gather_uneven, all_to_allv), after wait().
  Tensor result();

 private:
  std::shared_ptr<State> s_;
};

class Communicator {
 public:
  Communicator() = default;  // undefined: every collective throws
  // A communicator over `world_ranks` (this rank must be one of them; group rank i is
  // world_ranks[i]). Collective over those ranks: all of them must call it with the same
  // arguments. `description` names the group in errors, e.g. the mesh dims.
  // `label` names the group's mesh dims for collective counting (mesh/collective_count.h), e.g.
  // "dp" or "dp,tp"; empty: "world".
  static Communicator create(const std::vector<int>& world_ranks, int tag, std::string description,
                             std::string label = "");
  // A stand-in for one rank of a group that is not there (a simulated mesh: plan checks and
  // estimates on meta tensors, any world size in one process). Collectives on meta tensors only
  // check shapes and are counted (collective_count.h); all_reduce with max or min of host tensors
  // leaves them as they are (every simulated peer is taken to hold what this rank holds); anything
  // else is an error. all_gather_uneven and all_to_allv without receive counts need the peers'
  // sizes and are errors.
  static Communicator simulated(int size, int rank, std::string description, std::string label = "");
  bool is_simulated() const;
  const std::string& label() const;

  bool defined() const { return static_cast<bool>(impl_); }
  int rank() const;  // in the group
  int size() const;
  const std::vector<int>& world_ranks() const;
  const std::string& description() const;

  // In place: every rank ends with op over all ranks' t (identical bits on every rank).
  void all_reduce(Tensor& t, CommReduceOp op = CommReduceOp::kSum);
  Work all_reduce_async(Tensor& t, CommReduceOp op = CommReduceOp::kSum);

  // out = concatenation of every rank's `in` along dim 0; out.size(0) == size() * in.size(0).
  void all_gather(const Tensor& in, Tensor& out);
  Work all_gather_async(const Tensor& in, Tensor& out);

  // Like all_gather, but each rank's in.size(0) may differ (0 included); the trailing dims and
  // dtype must agree (checked). Returns the concatenation. The async variant exchanges the sizes
  // first (a small blocking step), then gathers asynchronously: see Work::result().
  Tensor all_gather_uneven(const Tensor& in);
  Work all_gather_uneven_async(const Tensor& in);

  // out = chunk rank() of (op over all ranks' in), chunks along dim 0;
  // in.size(0) == size() * out.size(0).
  void reduce_scatter(const Tensor& in, Tensor& out, CommReduceOp op = CommReduceOp::kSum);
  Work reduce_scatter_async(const Tensor& in, Tensor& out, CommReduceOp op = CommReduceOp::kSum);

  // Chunk j (along dim 0) of `in` goes to rank j; out's chunk j comes from rank j. Same shapes.
  void all_to_all(const Tensor& in, Tensor& out);
  Work all_to_all_async(const Tensor& in, Tensor& out);

  // send_counts[j] rows (dim 0) of `in`, in order, go to rank j; returns the rows received,
  // ordered by source rank. recv_counts, when not given, are exchanged first (blocking).
  Tensor all_to_allv(const Tensor& in, const std::vector<int64_t>& send_counts,
                     std::vector<int64_t> recv_counts = {});
  Work all_to_allv_async(const Tensor& in, const std::vector<int64_t>& send_counts,
                         std::vector<int64_t> recv_counts = {});

  // t on every rank becomes root's t.
  void broadcast(Tensor& t, int root);
  Work broadcast_async(Tensor& t, int root);

  // Point to point within the group; recv's t must have the sender's shape and dtype.
  void send(const Tensor& t, int peer, int tag = 0);
  Work send_async(const Tensor& t, int peer, int tag = 0);
  void recv(Tensor& t, int peer, int tag = 0);
  Work recv_async(Tensor& t, int peer, int tag = 0);

  void barrier();
  Work barrier_async();

  struct Impl;

 private:
  const Impl& impl(const char* op) const;
  std::shared_ptr<Impl> impl_;
};

}  // namespace mt
