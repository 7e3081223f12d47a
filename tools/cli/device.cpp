// --device for the meshtrain subcommands; see device.h.
#include "tools/cli/device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "mesh/world.h"
#include "runtime/cuda/device.h"
#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt::cli {
namespace {

// Dense datasheet peaks (no sparsity), in TFLOP/s: {name fragment, bf16/f16, tf32, f32}.
struct Peak {
  const char* name;
  double half, tf32, f32;
};
constexpr Peak kPeaks[] = {
    {"H200", 989.4, 494.7, 66.9},  // H200 SXM: the H100 SXM's compute
    {"H100 PCIe", 756.0, 378.0, 51.2},
    {"H100", 989.4, 494.7, 66.9},  // H100 SXM5
    {"A100", 312.0, 156.0, 19.5},
};

// Best of `reps` n^3 products after two warm-up calls (the output's first pages, the BLAS's
// buffers, OpenMP's threads).
double measured_gemm_flops(Device device, DType dtype, int64_t n, int reps) {
  TensorOptions o = TensorOptions(dtype).with_device(device);
  Tensor a = ones({n, n}, o), b = ones({n, n}, o);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 2; ++i) Tensor warm = matmul(a, b);
  for (int i = 0; i < reps; ++i) {
    synchronize(device);
    auto t0 = std::chrono::steady_clock::now();
    Tensor c = matmul(a, b);
    synchronize(device);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n * n * n) / best;
}

}  // namespace

Device resolve_device(const std::string& command, const std::string& value) {
  MT_CHECK(value == "cpu" || value == "cuda" || value.rfind("cuda:", 0) == 0,
           "meshtrain {}: --device must be cpu, cuda or cuda:N, got '{}'", command, value);
  if (value == "cpu") return Device::cpu();
  Device d;
  if (value == "cuda") {
    const int n = cuda::device_count();
    MT_CHECK(n > 0, "meshtrain {}: --device cuda: no CUDA device ({}); use --device cpu", command,
             cuda::unavailable_reason());
    d = Device::cuda(local_rank() % n);
  } else {
    const std::string index = value.substr(5);
    MT_CHECK(!index.empty() && index.size() <= 4 && index.find_first_not_of("0123456789") == std::string::npos,
             "meshtrain {}: --device must be cpu, cuda or cuda:N, got '{}'", command, value);
    d = Device::cuda(std::stoi(index));
  }
  try {
    cuda::check_device(d, "--device " + value);
  } catch (const Error& e) {
    MT_FAIL("meshtrain {}: {}; use --device cpu", command, e.what());
  }
  cuda::set_device(d.index);
  return d;
}

double peak_flops(Device device, DType compute) {
  // A peak the user knows (a datasheet, a cluster's profile) replaces the measurement and the table;
  // the test suites set it so that each of their hundreds of short runs skips the 0.1-0.5 s GEMM.
  if (const char* s = std::getenv("MT_PEAK_TFLOPS"); s && *s) {
    char* end = nullptr;
    const double t = std::strtod(s, &end);
    MT_CHECK(end != s && *end == '\0' && std::isfinite(t) && t > 0 && t <= 1e6,
             "MT_PEAK_TFLOPS='{}': expected the peak in TFLOP/s per rank, a number in (0, 1e6]", s);
    return t * 1e12;
  }
  // 1024^3, as bench_matmul and bench_train measure it: at 512^3 two threads reached only about
  // 0.75 of it, which put the CPU's MFU above 100% at seq 1024 (PaLM's accounting counts causal
  // attention in full). Best of 10 (about 0.1 s at two threads): consecutive calls at start-up
  // moved between 170 and 200 GFLOP/s on the 2-core machine, and the best of 3 often missed the top.
  if (device.is_cpu()) return measured_gemm_flops(device, DType::kF32, 1024, 10);
  const std::string name = cuda::device_name(device.index);
  for (const Peak& p : kPeaks)
    if (name.find(p.name) != std::string::npos) {
      if (compute == DType::kBF16 || compute == DType::kF16) return p.half * 1e12;
      return (cuda::allow_tf32() ? p.tf32 : p.f32) * 1e12;
    }
  return measured_gemm_flops(device, compute, 4096, 3);
}

void synchronize(Device device) {
  if (device.is_cuda()) cuda::synchronize();
}

}  // namespace mt::cli
