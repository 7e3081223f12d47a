// The CUDA caching allocator's interface, without CUDA types (runtime/cuda/allocator.cpp).
// Blocks are rounded up to a size class and kept on free lists per (device, stream) when
// released, so a training step that allocates the same sizes every iteration calls cudaMalloc
// only during its first iteration. Counters use runtime/allocator.h's MemoryStats.
#pragma once

#include <cstddef>

#include "runtime/allocator.h"
#include "runtime/device.h"

namespace mt::cuda {

// nbytes on device `index`, ordered on that device's current stream. Throws "no CUDA device"
// or a CUDA out-of-memory error naming the device and the counters. nullptr for 0 bytes.
void* alloc(size_t nbytes, int index);
// Returns a block from alloc() to its free list (no cudaFree).
void free(void* p);
// current/peak: bytes handed out (size-class rounded); reserved: bytes held from cudaMalloc;
// allocations: alloc() calls; device_mallocs: cudaMalloc calls.
MemoryStats memory_stats(int index);
void reset_peak(int index);
// Gives every cached (free) block of every device back to the driver.
void empty_cache();
// The size class a request of nbytes is served from.
size_t round_size(size_t nbytes);

// Copies nbytes between host and device memory or between devices; returns when dst may be read
// from the host (CPU dst) or by later work on dst's current stream (CUDA dst).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);

}  // namespace mt::cuda
