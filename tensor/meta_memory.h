// Byte-counting meta storage. Normally a meta tensor has no Storage at all (shapes only). While a
// MetaMemoryScope lives on this thread, meta tensors get a Storage that holds no memory (data is
// null) but adds its size to a live/peak counter when created and subtracts it when freed, so a
// whole forward and backward run on meta tensors (kernels are no-ops under MetaKernelsGuard) shows
// the bytes a real run would hold at its peak, from the real ops and their real lifetimes, without
// allocating anything. plan/estimate.h uses it for `meshtrain plan --estimate`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt {

struct MetaMemoryStats {
  int64_t live = 0;         // bytes of meta storages alive now (counted since the scope began)
  int64_t peak = 0;         // highest `live` since the scope began or reset_meta_peak()
  int64_t allocations = 0;  // storages created
};

class MetaMemoryScope {
 public:
  MetaMemoryScope();  // starts counting from zero
  ~MetaMemoryScope();
  MetaMemoryScope(const MetaMemoryScope&) = delete;
  MetaMemoryScope& operator=(const MetaMemoryScope&) = delete;
  static bool active();

 private:
  bool prev_;
};

MetaMemoryStats meta_memory_stats();
void reset_meta_peak();  // peak = live

// Storage's hooks (tensor/tensor.cpp).
void meta_memory_alloc(size_t nbytes);
void meta_memory_free(size_t nbytes);

}  // namespace mt
