// Collective counting (collective_count.h): thread-local totals.
#include "mesh/collective_count.h"

#include <algorithm>

#include "kernels/cost.h"
#include "runtime/profiler.h"

namespace mt {
namespace {
thread_local bool g_active = false;
thread_local CollectiveCounts g_counts;
thread_local int g_overlapped = 0;  // OverlappedCollectiveScope depth
}  // namespace

CollectiveCountScope::CollectiveCountScope() : prev_(g_active) {
  g_active = true;
  g_counts.clear();
}
CollectiveCountScope::~CollectiveCountScope() { g_active = prev_; }
bool CollectiveCountScope::active() { return g_active; }
const CollectiveCounts& CollectiveCountScope::counts() { return g_counts; }
void CollectiveCountScope::reset() { g_counts.clear(); }

void count_collective(const char* kind, const std::string& dims, int64_t group_size, int64_t bytes) {
  // The profiler (runtime/profiler.h) records every collective issued, groups of one included.
  if (kernel_hooks_armed())
    if (Profiler* p = Profiler::current()) p->add_collective(kind, dims.empty() ? "world" : dims, group_size, bytes);
  if (!g_active || group_size <= 1) return;
  CollectiveTally& t = g_counts[CollectiveKey{kind, dims.empty() ? "world" : dims}];
  ++t.calls;
  t.bytes += bytes;
  t.group_size = std::max(t.group_size, group_size);
  if (g_overlapped == 0) count_host_call(HostCall::kBlockingCollective);
}

OverlappedCollectiveScope::OverlappedCollectiveScope() { ++g_overlapped; }
OverlappedCollectiveScope::~OverlappedCollectiveScope() { --g_overlapped; }

}  // namespace mt
