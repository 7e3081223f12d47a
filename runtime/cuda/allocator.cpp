// The CUDA caching allocator. A request is rounded up to a size class (512 B steps below 1 MiB,
// then four classes per power of two, so at most 25% is wasted) and served from the free list of
// (device, stream, class); only a miss calls cudaMalloc. Freed blocks go back to the list of the
// stream they were allocated on, which makes reuse safe without synchronization: later work on
// that stream runs after earlier work that used the block. A block also used on other streams
// (record_stream) waits for events recorded on them before it is reused. When cudaMalloc fails,
// the device's cached blocks are released and the request is retried once.
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/cuda/check.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/memory.h"
#include "runtime/cuda/stream.h"
#include "runtime/error.h"

namespace mt::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct Block {
  size_t size = 0;  // size class
  int device = 0;
  cudaStream_t stream = nullptr;
  std::vector<cudaStream_t> other_streams;  // from record_stream
};

struct Pending {  // a freed block waiting for work on other streams
  void* ptr;
  std::vector<cudaEvent_t> events;
};

struct DeviceState {
  std::map<std::pair<cudaStream_t, size_t>, std::vector<void*>> free_lists;
  std::vector<Pending> pending;
  MemoryStats stats;
};

class CachingAllocator {
 public:
  void* alloc(size_t nbytes, int index) {
    if (index < 0 || index >= device_count())  // format the message only when it is needed
      check_device(Device::cuda(index), fmt::format("allocating {} bytes", nbytes));
    MT_CHECK(index < kMaxDevices, "cuda:{}: at most {} devices are supported", index, kMaxDevices);
    std::lock_guard<std::mutex> lock(mu_);
    DeviceState& st = dev_[index];
    ++st.stats.allocations;
    if (nbytes == 0) return nullptr;
    const size_t size = round_size(nbytes);
    cudaStream_t stream = current_stream_of(index).handle();
    process_pending(st);
    void* p = nullptr;
    auto it = st.free_lists.find({stream, size});
    if (it != st.free_lists.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else {
      p = device_malloc(st, size, index);
    }
    blocks_[p] = Block{size, index, stream, {}};
    st.stats.current += static_cast<int64_t>(size);
    st.stats.peak = std::max(st.stats.peak, st.stats.current);
    return p;
  }

  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    MT_ASSERT(it != blocks_.end(), "cuda free of {} which the caching allocator did not hand out", p);
    Block b = std::move(it->second);
    blocks_.erase(it);
    DeviceState& st = dev_[b.device];
    st.stats.current -= static_cast<int64_t>(b.size);
    free_sizes_[p] = {b.size, b.stream};
    if (b.other_streams.empty()) {
      st.free_lists[{b.stream, b.size}].push_back(p);
      return;
    }
    DeviceGuard g(b.device);
    Pending pend{p, {}};
    for (cudaStream_t s : b.other_streams) {
      cudaEvent_t e = nullptr;
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      MT_CUDA_CHECK(cudaEventRecord(e, s));
      pend.events.push_back(e);
    }
    st.pending.push_back(std::move(pend));
  }

  void record_stream(void* p, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    MT_CHECK(it != blocks_.end(), "record_stream: {} is not a live block of the CUDA caching allocator", p);
    if (s == it->second.stream) return;
    for (cudaStream_t o : it->second.other_streams)
      if (o == s) return;
    it->second.other_streams.push_back(s);
  }

  MemoryStats stats(int index) {
    std::lock_guard<std::mutex> lock(mu_);
    return index >= 0 && index < kMaxDevices ? dev_[index].stats : MemoryStats{};
  }

  void reset_peak(int index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index >= 0 && index < kMaxDevices) dev_[index].stats.peak = dev_[index].stats.current;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (int d = 0; d < kMaxDevices; ++d)
      if (!dev_[d].free_lists.empty()) release_cached(dev_[d], d);
  }

 private:
  void* device_malloc(DeviceState& st, size_t size, int index) {
    DeviceGuard g(index);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached(st, index);
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      MT_FAIL("CUDA out of memory on cuda:{} allocating {} bytes (size class {}): {} bytes in use by tensors, "
              "{} reserved by meshtrain, {} of {} bytes free on the device",
              index, size, size, st.stats.current, st.stats.reserved, free_b, total_b);
    }
    MT_CUDA_CHECK(err);
    st.stats.reserved += static_cast<int64_t>(size);
    ++st.stats.device_mallocs;
    return p;
  }

  // Waits for nothing: moves pending blocks whose events completed to their free lists.
  void process_pending(DeviceState& st) {
    for (size_t i = 0; i < st.pending.size();) {
      Pending& pd = st.pending[i];
      bool done = true;
      for (cudaEvent_t e : pd.events) {
        cudaError_t q = cudaEventQuery(e);
        if (q == cudaErrorNotReady) {
          (void)cudaGetLastError();
          done = false;
          break;
        }
        MT_CUDA_CHECK(q);
      }
      if (!done) {
        ++i;
        continue;
      }
      for (cudaEvent_t e : pd.events) (void)cudaEventDestroy(e);
      auto [size, stream] = free_sizes_[pd.ptr];
      st.free_lists[{stream, size}].push_back(pd.ptr);
      st.pending[i] = std::move(st.pending.back());
      st.pending.pop_back();
    }
  }

  void release_cached(DeviceState& st, int index) {
    DeviceGuard g(index);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    process_pending(st);
    for (auto& [key, ptrs] : st.free_lists) {
      for (void* p : ptrs) {
        MT_CUDA_CHECK(cudaFree(p));
        st.stats.reserved -= static_cast<int64_t>(key.second);
        free_sizes_.erase(p);
      }
    }
    st.free_lists.clear();
  }

  std::mutex mu_;
  DeviceState dev_[kMaxDevices];
  std::unordered_map<void*, Block> blocks_;  // live blocks
  std::unordered_map<void*, std::pair<size_t, cudaStream_t>> free_sizes_;  // cached blocks
};

// Never destroyed: blocks may be freed by static destructors after main returns, and cudaFree at
// exit races with the runtime's own teardown.
CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator;
  return *a;
}

}  // namespace

size_t round_size(size_t nbytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{1} << 20;
  if (nbytes <= kSmall) return kSmall;
  if (nbytes < kLarge) return (nbytes + kSmall - 1) / kSmall * kSmall;
  const size_t pow2 = size_t{1} << (63 - __builtin_clzll(nbytes));
  const size_t step = pow2 / 4;
  return (nbytes + step - 1) / step * step;
}

void* alloc(size_t nbytes, int index) { return allocator().alloc(nbytes, index); }
void free(void* p) { allocator().free(p); }
MemoryStats memory_stats(int index) { return allocator().stats(index); }
void reset_peak(int index) { allocator().reset_peak(index); }
void empty_cache() { allocator().empty_cache(); }
void record_stream(void* p, const Stream& s) { allocator().record_stream(p, s.handle()); }

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  if (dst_dev.is_cuda() && src_dev.is_cuda() && dst_dev.index != src_dev.index) {
    // Source work must be done before the peer copy; the copy must be done before the caller may
    // free the source (whose block its own stream may reuse at once).
    current_stream_of(src_dev.index).synchronize();
    DeviceGuard g(dst_dev.index);
    Stream s = current_stream_of(dst_dev.index);
    MT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, nbytes, s.handle()));
    s.synchronize();
    return;
  }
  const int index = dst_dev.is_cuda() ? dst_dev.index : src_dev.index;
  DeviceGuard g(index);
  Stream s = current_stream_of(index);
  const cudaMemcpyKind kind = dst_dev.is_cpu()   ? cudaMemcpyDeviceToHost
                              : src_dev.is_cpu() ? cudaMemcpyHostToDevice
                                                 : cudaMemcpyDeviceToDevice;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, s.handle()));
  // Host memory is pageable and may be freed by the caller right after: wait for the copy.
  if (kind != cudaMemcpyDeviceToDevice) s.synchronize();
}

}  // namespace mt::cuda
