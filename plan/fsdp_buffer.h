// The DBuffer of one FSDP unit (docs/fsdp.md): the unit's shard of the planned layout as one
// contiguous buffer per rank, whose views ARE the parameters' local tensors (their TensorImpls
// point into it), so that
//   forward:  one all-gather of the shard straight into the unit's full buffer; every parameter's
//             compute tensor is a view of it at the planned offset (no copy in, no copy out);
//   backward: the weight-gradient formulas write each gradient straight into the unit's
//             gradient buffer (tensor/grad_destination.h: zero-copy); one autograd node for the
//             whole unit runs once every parameter's gradient is in and reduce-scatters that
//             buffer straight into the shard of gradients, whose views are the parameters'
//             gradients (lent to .grad, not cloned); buffers are made once per unit and reused
//             across steps; under HSDP (the batch also
//             split over a dim the unit is replicated on) that shard is then all-reduced over
//             it, once per unit. Both collectives run while the units before it compute their
//             gradients; the backward pass waits for them before it returns.
// With reshard after forward the full buffer's memory is freed when the unit's forward ends and
// gathered again (into the same storage) when its backward begins.
// Prefetch (link_prefetch): each unit's all-gather is started ahead, while the unit before it
// computes: in the forward, when a unit gathers, the next unit in forward order starts its
// all-gather; in the backward, when a unit gathers again, the unit before it does. A prefetch
// is used only within the forward pass of the model it was started in (and its backward), so a
// gather never returns parameters from before an optimizer step.
// Under a pipeline schedule several forwards of a unit (micro-batches in flight) come before their
// backwards: they share the gathered buffer (the parameters are fixed within a step), each
// backward claims the gradient destinations anew and reduce-scatters into the gradient shard
// (accumulated), and a backward first completes a prefetch in flight into the buffer.
// Activation recomputation: a gather inside the unit's backward (a recomputed forward) takes views
// of the buffer the backward regathered, with no all-gather; when the unit's forward recorded a
// node too (a recomputed submodule), the replay's node only leaves its gradients in the gradient
// buffer and the forward's node reduces the whole unit once. Views are cached per forward pass and
// per recomputation (tensor/checkpoint.h, current_recompute), never across them.
// parallelize() builds one per unit and gathers the unit's parameters through it instead of one
// redistribute per parameter. If something re-points a parameter's storage (Module::to), the next
// gather adopts the parameters again (one copy, counted).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "plan/lower.h"
#include "tensor/module.h"

namespace mt {

// Bytes and calls of every FSDP unit of the process, for tests and benchmarks.
struct FsdpCounters {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t forward_bytes_copied = 0;   // outside collectives, while gathering (0 on the steady path)
  int64_t backward_bytes_copied = 0;  // gradients copied into the unit's gradient buffer (0 on the
                                      // steady path: the formulas write them there)
  int64_t adoption_bytes = 0;         // parameters moved into a shard buffer (at setup, after Module::to)
  int64_t prefetches = 0;             // all-gathers started ahead of their unit (in all_gathers too)
  int64_t prefetch_hits = 0;          // of those, the ones their unit used
  int64_t replica_all_reduces = 0;    // HSDP: a unit's gradient shard summed over a replica dim
  int64_t buffer_allocations = 0;     // buffers made (shard, gathered, gradient, gradient shard):
                                      // once per unit, flat after the first step
  int64_t buffer_refills = 0;         // a resharded buffer's memory taken again (same buffer)
  int64_t zero_copy_grads = 0;        // gradients found written in place in the unit's buffer
  int64_t ordered_reductions = 0;     // reduce-scatters done in rank order (in reduce_scatters too)
  int64_t reductions_in_flight = 0;   // reductions still running when their unit's backward returned
};
FsdpCounters fsdp_counters();
void reset_fsdp_counters();

class FsdpUnitBuffer {
 public:
  // `unit` from the IR; the unit's parameters must already be DTensors with their RaggedShard
  // storage (parallelize's param_init). Adopts them: copies their shards into the buffer and
  // points their storage at it.
  FsdpUnitBuffer(const FsdpUnit& unit, const HookIR& ir, Module& model, const DeviceMesh& mesh);
  ~FsdpUnitBuffer();
  FsdpUnitBuffer(const FsdpUnitBuffer&) = delete;
  FsdpUnitBuffer& operator=(const FsdpUnitBuffer&) = delete;

  const std::string& module() const;
  const std::vector<std::string>& params() const;
  // Reshard after forward: end_forward() frees the gathered buffer's memory and begin_backward()
  // (the unit module's backward-pre hook) gathers it again into the same storage, so only the
  // units in use hold full buffers. Off: the buffer stays until the backward no longer needs it.
  void set_reshard_after_forward(bool on);
  // Zero-copy gradients (on by default): the weight-gradient formulas write into the unit's
  // gradient buffer (tensor/grad_destination.h). Off: fresh gradients copied in (benchmarks;
  // MT_FSDP_ZERO_COPY=0).
  void set_zero_copy_gradients(bool on);
  // Ordered reduction (off by default; MT_FSDP_REDUCE=ordered): the gradient shard summed in rank
  // order 0, 1, 2, ... (an all-to-all and local sums) instead of by MPI's reduce-scatter, so that
  // it has the bits of one device accumulating the ranks' micro-batches in that order.
  void set_ordered_reduction(bool on);
  // Reductions in flight (on by default; MT_FSDP_ASYNC_REDUCE=0 for benchmarks): the unit's
  // reduce-scatter is left running when its backward ends and waited for when the next unit's
  // backward ends, where its HSDP all-reduce starts; all of it completes before the backward
  // pass returns. Its parameters' .grad are final then, not when a hook sees them. Off: both
  // complete before the unit's backward returns.
  void set_async_reduction(bool on);
  // The unit's forward begins / ends, its backward begins (its module's hooks): the next
  // gathered() after begin_forward() gathers anew.
  void begin_forward();
  void end_forward();
  void begin_backward();
  // Parameter `path`'s compute (RUN) tensor: a view of the gathered full buffer. The first call
  // after begin_forward() all-gathers the unit and records one autograd node for all of it.
  Tensor gathered(const std::string& path);

  // Prefetch (on by default; a plan's `prefetch=no`): whether the unit before this one (in forward
  // or, for the backward's regather, backward order) starts this unit's gather ahead of it.
  void set_prefetch(bool on);
  // Links `units`, given in forward order, for prefetching (units with prefetch off are never
  // started ahead). Returns what the model's forward-pre hook must call as each forward pass of
  // the model begins (before any unit gathers).
  static std::function<void()> link_prefetch(const std::vector<std::shared_ptr<FsdpUnitBuffer>>& units);

  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace mt
