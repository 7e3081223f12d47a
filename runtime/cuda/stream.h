// Streams and events. Each device has one compute stream (non-blocking, created on first use)
// that kernels, cuBLASLt and copies of the calling thread run on unless a StreamGuard selects
// another stream, e.g. a communication stream from Stream::create(); events order work across
// streams and time it. CUDA types appear here: include only from .cu files, runtime/cuda/ and
// CUDA tests.
#pragma once

#include <cuda_runtime.h>

namespace mt::cuda {

class Stream {
 public:
  Stream() = default;
  // Wraps an existing stream of device `device` (not owned).
  Stream(cudaStream_t h, int device) : handle_(h), device_(device) {}
  // A new stream on device `index` (priority: lower is more urgent, 0 = default); it lives until
  // the process ends (streams are few and long-lived).
  static Stream create(int index, int priority = 0);
  // The compute stream of device `index`.
  static Stream compute(int index);

  cudaStream_t handle() const { return handle_; }
  int device() const { return device_; }
  void synchronize() const;
  bool query() const;  // true when all its work is done
  bool operator==(const Stream& o) const { return handle_ == o.handle_; }

 private:
  cudaStream_t handle_ = nullptr;
  int device_ = 0;
};

// The calling thread's stream for device `index` (its compute stream unless a guard set another).
Stream current_stream_of(int index);
void set_current_stream(Stream s);
// The current stream of the current device (declared for kernels in kernels/cuda/common.cuh).
cudaStream_t current_stream();

// Makes s current (on its device) for its lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(Stream s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

enum class EventTiming : bool { kDisabled = false, kEnabled = true };

class Event {
 public:
  explicit Event(EventTiming timing = EventTiming::kDisabled);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& s);
  // Work queued on s after this call waits for the recorded work (the host does not block).
  void wait(const Stream& s) const;
  void synchronize() const;
  bool query() const;
  // Milliseconds from this event to `end`; both recorded with EventTiming::kEnabled.
  float elapsed_ms(const Event& end) const;
  cudaEvent_t handle() const { return handle_; }

 private:
  cudaEvent_t handle_ = nullptr;
};

// Tells the allocator that the block at p (from alloc()) is used by work on s too: when freed it
// is reused only after the work s has queued by then completes.
void record_stream(void* p, const Stream& s);

}  // namespace mt::cuda
