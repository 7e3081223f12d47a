// Streams and events: one lazily created non-blocking compute stream per device, a thread-local
// current stream per device, and RAII events.
#include "runtime/cuda/stream.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "runtime/cuda/check.h"
#include "runtime/cuda/device.h"
#include "runtime/error.h"

namespace mt::cuda {
namespace {

constexpr int kMaxDevices = 64;

std::mutex g_mu;
std::atomic<cudaStream_t> g_compute[kMaxDevices] = {};  // written once under g_mu

// Per thread and device: the stream a StreamGuard / set_current_stream chose (null: compute).
thread_local cudaStream_t t_current[kMaxDevices] = {};

}  // namespace

Stream Stream::create(int index, int priority) {
  check_device(Device::cuda(index), "creating a stream");
  DeviceGuard g(index);
  cudaStream_t s = nullptr;
  MT_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  return Stream(s, index);
}

Stream Stream::compute(int index) {
  if (index >= 0 && index < kMaxDevices) {  // fast path: every kernel launch asks
    cudaStream_t s = g_compute[index].load(std::memory_order_acquire);
    if (s) return Stream(s, index);
  }
  check_device(Device::cuda(index), "the compute stream");
  MT_CHECK(index < kMaxDevices, "cuda:{}: at most {} devices are supported", index, kMaxDevices);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_compute[index].load()) {
    DeviceGuard g(index);
    cudaStream_t s = nullptr;
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    g_compute[index].store(s, std::memory_order_release);
  }
  return Stream(g_compute[index].load(), index);
}

void Stream::synchronize() const { MT_CUDA_CHECK(cudaStreamSynchronize(handle_)); }

bool Stream::query() const {
  cudaError_t e = cudaStreamQuery(handle_);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  MT_CUDA_CHECK(e);
  return true;
}

Stream current_stream_of(int index) {
  MT_CHECK(index >= 0 && index < kMaxDevices, "cuda:{}: at most {} devices are supported", index, kMaxDevices);
  if (t_current[index]) return Stream(t_current[index], index);
  return Stream::compute(index);
}

void set_current_stream(Stream s) { t_current[s.device()] = s.handle(); }

cudaStream_t current_stream() { return current_stream_of(current_device()).handle(); }

StreamGuard::StreamGuard(Stream s) : prev_(current_stream_of(s.device())) { set_current_stream(s); }
StreamGuard::~StreamGuard() { set_current_stream(prev_); }

Event::Event(EventTiming timing) {
  MT_CUDA_CHECK(cudaEventCreateWithFlags(
      &handle_, timing == EventTiming::kEnabled ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (handle_) (void)cudaEventDestroy(handle_);
}

Event::Event(Event&& o) noexcept : handle_(o.handle_) { o.handle_ = nullptr; }

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (handle_) (void)cudaEventDestroy(handle_);
    handle_ = o.handle_;
    o.handle_ = nullptr;
  }
  return *this;
}

void Event::record(const Stream& s) { MT_CUDA_CHECK(cudaEventRecord(handle_, s.handle())); }
void Event::wait(const Stream& s) const { MT_CUDA_CHECK(cudaStreamWaitEvent(s.handle(), handle_, 0)); }
void Event::synchronize() const { MT_CUDA_CHECK(cudaEventSynchronize(handle_)); }

bool Event::query() const {
  cudaError_t e = cudaEventQuery(handle_);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  MT_CUDA_CHECK(e);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  float ms = 0;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, handle_, end.handle_));
  return ms;
}

}  // namespace mt::cuda
