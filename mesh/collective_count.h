// Counting collectives: while a CollectiveCountScope lives on this thread, every collective a
// Communicator starts (and every collective a redistribution of meta tensors on a simulated mesh
// would start, mesh/redistribute.cpp) adds one call and its bytes under (kind, mesh dims). The
// estimate of `meshtrain plan --estimate` predicts these counts from a meta dry run; its test
// counts a real step with the same scope and compares (plan/estimate.h, docs/estimate.md).
//
// Bytes per call are the collective's whole buffer on this rank, the usual convention of
// collective benchmarks: all_reduce and broadcast the tensor, all_gather the output (every rank's
// part), reduce_scatter the input (every rank's part), all_to_all(v) the input, send/recv the
// message. The small metadata exchanges of all_gather_uneven and all_to_allv (sizes, counts) and
// barriers carry no payload and are not counted.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace mt {

struct CollectiveTally {
  int64_t calls = 0;
  int64_t bytes = 0;
  int64_t group_size = 1;  // ranks in the group (the largest seen under this key)
};

// Key: collective kind ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
// "send", "recv") and the mesh dims of its group, comma separated ("dp", "dp,tp"; "world" for a
// communicator that is not a mesh's).
struct CollectiveKey {
  std::string kind, dims;
  bool operator<(const CollectiveKey& o) const { return kind != o.kind ? kind < o.kind : dims < o.dims; }
  bool operator==(const CollectiveKey& o) const { return kind == o.kind && dims == o.dims; }
};
using CollectiveCounts = std::map<CollectiveKey, CollectiveTally>;

class CollectiveCountScope {
 public:
  CollectiveCountScope();  // starts from zero
  ~CollectiveCountScope();
  CollectiveCountScope(const CollectiveCountScope&) = delete;
  CollectiveCountScope& operator=(const CollectiveCountScope&) = delete;
  static bool active();
  static const CollectiveCounts& counts();
  static void reset();

 private:
  bool prev_;
};

// Collectives counted while one lives on this thread overlap other work (the gradient reducer's
// bucket launches): they are not counted as blocking (KernelCost::blocking_collectives, which
// every other counted collective adds to while a KernelCostScope is active).
class OverlappedCollectiveScope {
 public:
  OverlappedCollectiveScope();
  ~OverlappedCollectiveScope();
  OverlappedCollectiveScope(const OverlappedCollectiveScope&) = delete;
  OverlappedCollectiveScope& operator=(const OverlappedCollectiveScope&) = delete;
};

// Adds one call when a scope is active (a no-op otherwise). Groups of one rank are not counted:
// they move nothing.
void count_collective(const char* kind, const std::string& dims, int64_t group_size, int64_t bytes);

}  // namespace mt
