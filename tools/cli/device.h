// --device for the meshtrain subcommands (docs/cuda.md, "Training on a GPU"): "cpu", "cuda" or
// "cuda:N". The model is built (or loaded) on the host exactly as on a CPU run, parallelized there
// when a plan is given, and then moved to the device (Module::to), so a CUDA run starts from the
// same bytes as a CPU run.
#pragma once

#include <string>

#include "runtime/device.h"
#include "runtime/dtype.h"

namespace mt::cli {

// Resolves `value` for `command`: "cpu", "cuda" (GPU local_rank() % device_count(), mesh/world.h:
// the ranks of a node spread over its GPUs) or "cuda:N" (taken as given). A CUDA device is checked and
// made current. Without a GPU (or in a build without CUDA) the error is one line naming the flag
// and the reason.
Device resolve_device(const std::string& command, const std::string& value);

// The dense peak FLOP/s that MFU is reported against: for a known CUDA device the datasheet figure
// for `compute` (bf16/f16 tensor cores; f32 on the FP32 units, or TF32 when MT_ALLOW_TF32=1), else
// a GEMM of 4096^3 measured on the device; on the CPU a measured 1024^3 f32 GEMM (best of 10).
// MT_PEAK_TFLOPS, when set, is taken instead (TFLOP/s per rank; anything but a positive number is
// an error naming the variable).
double peak_flops(Device device, DType compute);

// Waits for the device's queued work (a no-op on the CPU): step times include all their kernels.
void synchronize(Device device);

}  // namespace mt::cli
