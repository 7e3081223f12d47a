// Device enumeration. The first query asks the runtime once; a machine without a GPU or driver
// gets count 0 and one log line, and every later use of a CUDA device fails with the reason.
#include "runtime/cuda/device.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "runtime/cuda/check.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace mt::cuda {
namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      r.reason = fmt::format("{} ({})", cudaGetErrorString(err), cudaGetErrorName(err));
      n = 0;
    } else if (n == 0) {
      r.reason = "the CUDA runtime reports 0 devices";
    }
    r.count = n;
    if (n == 0) MT_LOG_INFO("CUDA: no GPU found ({}); running on CPU only", r.reason);
    return r;
  }();
  return p;
}

std::atomic<int> g_tf32{-1};  // -1: not read from the environment yet
std::atomic<int> g_gemm_tune{-1};

}  // namespace

int device_count() { return probe().count; }
bool is_available() { return device_count() > 0; }
std::string unavailable_reason() { return probe().reason; }

void check_device(Device d, std::string_view what) {
  MT_ASSERT(d.is_cuda(), "check_device({})", d);
  const Probe& p = probe();
  MT_CHECK(p.count > 0, "no CUDA device: {} needs {} but {}; this process can only use the CPU", what, d,
           p.reason);
  MT_CHECK(d.index >= 0 && d.index < p.count, "no CUDA device: {} needs {} but only {} device(s) are visible "
           "(cuda:0..cuda:{}; CUDA_VISIBLE_DEVICES selects them)", what, d, p.count, p.count - 1);
}

std::string device_name(int index) {
  check_device(Device::cuda(index), "device_name");
  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

int current_device() {
  int d = 0;
  MT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int index) {
  check_device(Device::cuda(index), "set_device");
  MT_CUDA_CHECK(cudaSetDevice(index));
}

void synchronize() { MT_CUDA_CHECK(cudaDeviceSynchronize()); }

DeviceGuard::DeviceGuard(int index) {
  if (index < 0) return;
  int cur = current_device();
  if (cur != index) {
    MT_CUDA_CHECK(cudaSetDevice(index));
    prev_ = cur;
  }
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) (void)cudaSetDevice(prev_);
}

bool allow_tf32() {
  int v = g_tf32.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* s = std::getenv("MT_ALLOW_TF32");
    v = s && (!std::strcmp(s, "1") || !std::strcmp(s, "true")) ? 1 : 0;
    g_tf32.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_allow_tf32(bool allow) { g_tf32.store(allow ? 1 : 0, std::memory_order_relaxed); }

int gemm_tune_level() {
  int v = g_gemm_tune.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* s = std::getenv("MT_GEMM_TUNE");
    v = !s || !*s || !std::strcmp(s, "0") ? 0 : !std::strcmp(s, "2") ? 2 : !std::strcmp(s, "3") ? 3 : 1;
    g_gemm_tune.store(v, std::memory_order_relaxed);
  }
  return v;
}

void set_gemm_tune_level(int level) { g_gemm_tune.store(level < 0 ? 0 : level, std::memory_order_relaxed); }

namespace {
std::atomic<int64_t> g_gemm_taken{0};
}  // namespace

int64_t gemm_tune_taken() { return g_gemm_taken.load(std::memory_order_relaxed); }
void count_gemm_tune_taken() { g_gemm_taken.fetch_add(1, std::memory_order_relaxed); }

}  // namespace mt::cuda
