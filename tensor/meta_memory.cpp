// Byte-counting meta storage (meta_memory.h): thread-local counters.
#include "tensor/meta_memory.h"

#include <algorithm>

namespace mt {
namespace {
thread_local bool g_active = false;
thread_local MetaMemoryStats g_stats;
}  // namespace

MetaMemoryScope::MetaMemoryScope() : prev_(g_active) {
  g_active = true;
  g_stats = MetaMemoryStats{};
}
MetaMemoryScope::~MetaMemoryScope() { g_active = prev_; }
bool MetaMemoryScope::active() { return g_active; }

MetaMemoryStats meta_memory_stats() { return g_stats; }
void reset_meta_peak() { g_stats.peak = g_stats.live; }

void meta_memory_alloc(size_t nbytes) {
  g_stats.live += static_cast<int64_t>(nbytes);
  g_stats.peak = std::max(g_stats.peak, g_stats.live);
  ++g_stats.allocations;
}

void meta_memory_free(size_t nbytes) { g_stats.live -= static_cast<int64_t>(nbytes); }

}  // namespace mt
