// GradReducer: fused, bucketed reduction of Partial(sum) gradients (DESIGN.md, "Gradient
// reduction"; docs/grad_reduction.md). Under data (or sequence) parallelism a parameter is
// Replicate over `dp` while its gradient comes out of backward Partial(sum) over `dp`: each rank
// holds its batch part's term. The reducer packs such gradients into flat buckets, one group per
// (Partial mesh dims, target placements, dtype), and reduces each bucket with ONE collective over
// the flattened sub-mesh of all its Partial dims, started from a post-accumulate-grad hook as soon
// as the bucket is complete, so that it overlaps the rest of backward. finish() waits and writes
// every .grad back with the target placements.
//
//   GradReducer red(model, mesh);           // after parallelize(); hooks on every parameter
//   loss.backward(); red.finish(); opt.step(); opt.zero_grad();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "tensor/module.h"
#include "tensor/tensor.h"

namespace mt {

struct GradReducerOptions {
  int64_t bucket_bytes = int64_t{25} << 20;  // a bucket is closed once it holds this many bytes
  bool overlap = true;  // launch a bucket from the backward hooks (false: everything in finish())
  bool fuse = true;     // false: one collective per tensor and per Partial mesh dim (a baseline)
  // The placements a parameter's gradient is reduced to; default: the parameter's placements.
  // S(0) on a Partial dim gives ZeRO-2 style sharded gradients (a reduce_scatter when it is the
  // bucket's only Partial dim, else all_reduce then a local slice).
  std::function<Placements(const std::string& name, const Tensor& param)> grad_placements;
};

// Counts of the last synchronized step (the one finish() completed).
struct GradReducerStats {
  int64_t collectives = 0;           // all_reduces + reduce_scatters
  int64_t all_reduces = 0;
  int64_t reduce_scatters = 0;
  int64_t bytes = 0;                 // bytes handed to those collectives (input buffers)
  int64_t buckets = 0;               // buckets reduced (unfused: one per tensor)
  int64_t launched_in_backward = 0;  // collectives started from hooks, before finish()
  int64_t setup_collectives = 0;     // the one-time layout agreement (first synchronized step)
  int64_t passed_through = 0;        // gradients that were not Partial (no communication)
  int64_t unused = 0;                // parameters whose gradient never arrived here (zeros, if any rank had one)
  int64_t unused_everywhere = 0;     // of those, with no gradient on any rank: left without one (as on one device)
  int64_t presence_checks = 0;       // the all_reduce of per-parameter "had a gradient" flags (1 per step)
  int64_t late_partial = 0;          // outside the buckets (no gradient anywhere when the layout was fixed)
                                     // but Partial on some rank now: reduced one by one
  std::string str() const;
};

// Not copyable; movable (the hooks hold the shared state, not the object).
class GradReducer {
 public:
  using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
  // Every parameter requiring grad must be a DTensor on `mesh`. Registers post-accumulate-grad
  // hooks, removed by remove() or the destructor.
  GradReducer(const Module& model, const DeviceMesh& mesh, GradReducerOptions options = {});
  GradReducer(NamedTensors params, const DeviceMesh& mesh, GradReducerOptions options = {});
  GradReducer(GradReducer&&) noexcept;
  GradReducer& operator=(GradReducer&&) noexcept;
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;
  ~GradReducer();

  // false: backward only accumulates the local Partial terms into .grad (micro-batches but the
  // last, as DDP's no_sync); finish() then does nothing. true (default): reduce this step.
  void set_sync(bool sync);
  bool sync() const;

  // After backward, before the optimizer: launches the buckets not yet started (in bucket order,
  // parameters without a gradient contributing zeros), waits for all, and sets every .grad to a
  // DTensor with its target placements. Collective over the mesh: every rank must call it.
  // The first synchronized step also agrees on the bucket layout (one small all_reduce over the
  // whole mesh) and launches everything here; later steps overlap with backward.
  void finish();

  const GradReducerStats& stats() const;
  // One line per bucket: index, group (Partial dims, target placements, dtype), collective, bytes,
  // tensors. Empty before the first synchronized finish().
  std::string layout_str() const;
  int64_t num_buckets() const;

  void remove();  // removes the hooks (waits for collectives in flight)

  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace mt
