// The CUDA runtime interface of a build without the CUDA backend (nvcc not found, or
// -Dcuda=disabled): no devices, and a clear error for anything that needs one.
#include "runtime/cuda/device.h"
#include "runtime/cuda/memory.h"
#include <cstring>

#include "runtime/error.h"

namespace mt::cuda {
namespace {
constexpr const char* kReason =
    "this build of meshtrain has no CUDA backend (nvcc was not found at configure time, or -Dcuda=disabled)";
}

int device_count() { return 0; }
bool is_available() { return false; }
std::string unavailable_reason() { return kReason; }
void check_device(Device d, std::string_view what) {
  MT_FAIL("no CUDA device: {} needs {} but {}", what, d, kReason);
}
std::string device_name(int index) {
  check_device(Device::cuda(index), "device_name");
  return {};
}
int current_device() { MT_FAIL("no CUDA device: current_device: {}", kReason); }
void set_device(int index) { check_device(Device::cuda(index), "set_device"); }
void synchronize() {}
DeviceGuard::DeviceGuard(int) {}
DeviceGuard::~DeviceGuard() = default;
bool allow_tf32() { return false; }
void set_allow_tf32(bool) {}
int gemm_tune_level() { return 0; }
void set_gemm_tune_level(int) {}
int64_t gemm_tune_taken() { return 0; }
void count_gemm_tune_taken() {}

void* alloc(size_t nbytes, int index) {
  check_device(Device::cuda(index), fmt::format("allocating {} bytes", nbytes));
  return nullptr;
}
void free(void*) {}
MemoryStats memory_stats(int) { return {}; }
void reset_peak(int) {}
void empty_cache() {}
size_t round_size(size_t nbytes) { return nbytes; }
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  MT_CHECK(dst_dev.is_cpu() && src_dev.is_cpu(), "no CUDA device: copying {} bytes from {} to {}: {}", nbytes,
           src_dev, dst_dev, kReason);
  if (nbytes) std::memcpy(dst, src, nbytes);
}

}  // namespace mt::cuda
