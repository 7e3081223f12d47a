// Host memory: 64-byte aligned blocks, with current and peak byte counters that the CLI and
// benchmarks read. The CUDA caching allocator (runtime/cuda/memory.h) reports through the same
// struct; device_alloc/device_free/copy_bytes pick the allocator of a Device (Storage uses them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/device.h"

namespace mt {

struct MemoryStats {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocations = 0;  // number of calls, for "no malloc in steady state" checks
  int64_t reserved = 0;        // CUDA: bytes held from cudaMalloc (cached blocks included)
  int64_t device_mallocs = 0;  // CUDA: cudaMalloc calls (flat in the steady state)
};

void* cpu_alloc(size_t nbytes);
void cpu_free(void* p, size_t nbytes);
MemoryStats cpu_memory_stats();
void reset_cpu_peak();

// Any device with storage (CPU or CUDA); meta has none and throws.
void* device_alloc(Device device, size_t nbytes);
void device_free(Device device, void* p, size_t nbytes);
MemoryStats memory_stats(Device device);
// Sets the device's peak to its current bytes (CPU or CUDA; nothing for meta).
void reset_memory_peak(Device device);
// nbytes from src on src_dev to dst on dst_dev (host, device or peer); see runtime/cuda/memory.h.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);

}  // namespace mt
