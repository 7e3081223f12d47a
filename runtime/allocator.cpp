// Aligned host allocation with relaxed atomic counters (cheap enough for every tensor).
#include "runtime/allocator.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "runtime/cuda/memory.h"
#include "runtime/error.h"

namespace mt {
namespace {
std::atomic<int64_t> g_current{0}, g_peak{0}, g_allocs{0};

// Keep large freed blocks in the heap instead of returning them to the OS: a training step
// allocates the same sizes every iteration, and fresh mmap'd pages cost a fault per 4 KiB
// (about 1 ms for a 4 MiB activation), which would dominate mid-sized ops.
bool configure_heap() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return true;
}
}

void* cpu_alloc(size_t nbytes) {
  static const bool configured = configure_heap();
  (void)configured;
  if (nbytes == 0) return nullptr;
  size_t rounded = (nbytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  MT_CHECK(p != nullptr, "out of host memory allocating {} bytes", nbytes);
  int64_t cur = g_current.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) +
                static_cast<int64_t>(nbytes);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (cur > peak && !g_peak.compare_exchange_weak(peak, cur, std::memory_order_relaxed)) {
  }
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void cpu_free(void* p, size_t nbytes) {
  if (!p) return;
  std::free(p);
  g_current.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
}

MemoryStats cpu_memory_stats() {
  return {g_current.load(), g_peak.load(), g_allocs.load()};
}

void reset_cpu_peak() { g_peak.store(g_current.load()); }

void* device_alloc(Device device, size_t nbytes) {
  switch (device.type) {
    case DeviceType::kCPU: return cpu_alloc(nbytes);
    case DeviceType::kCUDA: return cuda::alloc(nbytes, device.index);
    case DeviceType::kMeta: break;
  }
  MT_FAIL("cannot allocate {} bytes on {}: meta tensors have no storage (materialize them first)", nbytes, device);
}

void device_free(Device device, void* p, size_t nbytes) {
  if (device.is_cuda())
    cuda::free(p);
  else
    cpu_free(p, nbytes);
}

MemoryStats memory_stats(Device device) {
  if (device.is_cuda()) return cuda::memory_stats(device.index);
  return device.is_cpu() ? cpu_memory_stats() : MemoryStats{};
}

void reset_memory_peak(Device device) {
  if (device.is_cuda())
    cuda::reset_peak(device.index);
  else if (device.is_cpu())
    reset_cpu_peak();
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  MT_CHECK(!dst_dev.is_meta() && !src_dev.is_meta(), "copy_bytes: {} -> {}: meta tensors have no storage", src_dev,
           dst_dev);
  cuda::copy_bytes(dst, dst_dev, src, src_dev, nbytes);
}

}  // namespace mt
