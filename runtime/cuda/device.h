// CUDA devices as the rest of meshtrain sees them, without CUDA types: how many there are, which
// one is current, and a clear error when a tensor asks for one that does not exist. A build
// without the CUDA backend (runtime/cuda/disabled.cpp) answers "no device" to everything, so
// callers never need #if MT_HAVE_CUDA.
#pragma once

#include <string>
#include <string_view>

#include "runtime/device.h"

namespace mt::cuda {

// Number of visible CUDA devices: 0 without a GPU, a driver, or the CUDA backend. On a CUDA build
// that finds no GPU, the first call logs one line saying so (the process then runs on CPU only).
int device_count();
bool is_available();
// Why there is no device ("" when there is at least one).
std::string unavailable_reason();
// Throws mt::Error "no CUDA device: <what> needs cuda:i but ..." unless d is a visible CUDA device.
void check_device(Device d, std::string_view what);

// The device's product name ("NVIDIA H100 80GB HBM3"); check_device's error when there is none.
std::string device_name(int index);

int current_device();
void set_device(int index);
// Waits for all work of the current device.
void synchronize();

// Makes `index` current for its lifetime (no-op when it already is, or for index < 0).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  [[maybe_unused]] int prev_ = -1;  // unused when built without CUDA (runtime/cuda/disabled.cpp)
};

// f32 GEMMs may use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation). Off by
// default; on when MT_ALLOW_TF32=1 in the environment or after set_allow_tf32(true).
bool allow_tf32();
void set_allow_tf32(bool allow);

// Choosing GEMM algorithms by timing (kernels/cuda/matmul.cu, docs/cuda.md): 0 off (the
// default), 1 the first call of a large 16-bit geometry times cuBLASLt's top candidates and keeps
// the fastest with the same output bits, 2 also prints each choice, 3 (tests) takes the first
// other candidate with the same bits whatever its time, so that the swap path runs. From
// MT_GEMM_TUNE, or set here (geometries already tuned stay as they are).
int gemm_tune_level();
void set_gemm_tune_level(int level);
// How many tuned geometries took another algorithm than cuBLASLt's first choice (this process).
int64_t gemm_tune_taken();
void count_gemm_tune_taken();

}  // namespace mt::cuda
