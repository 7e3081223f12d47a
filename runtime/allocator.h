// Host memory: 64-byte aligned blocks, with current and peak byte counters that the CLI and
// benchmarks read. The CUDA caching allocator (runtime/cuda/) reports through the same struct.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt {

struct MemoryStats {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocations = 0;  // number of calls, for "no malloc in steady state" checks
};

void* cpu_alloc(size_t nbytes);
void cpu_free(void* p, size_t nbytes);
MemoryStats cpu_memory_stats();
void reset_cpu_peak();

}  // namespace mt
