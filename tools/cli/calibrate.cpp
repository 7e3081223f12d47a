// Calibration of a hardware profile on the machine at hand (calibrate.h).
#include "tools/cli/calibrate.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cost.h"
#include "mesh/device_mesh.h"
#include "mesh/world.h"
#include "plan/roofline.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace mt::cli {
namespace {

// Best of `reps` timings (seconds) of f, after one warm-up call.
double best_time(int reps, const std::function<void()>& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Host time per kernel call in an eager step: a chain of small ops (16 elements) with autograd,
// forward and backward, divided by the kernel calls it makes (counted by kernels/cost.h).
double kernel_overhead() {
  Tensor x = ones(Shape{16}).requires_grad_(true);
  auto chain = [&] {
    Tensor y = x;
    for (int i = 0; i < 100; ++i) y = mul(add(y, x), 0.5);
    sum(y).backward();
    x.set_grad(Tensor());
  };
  int64_t kernels = 0;
  {
    KernelCostScope scope;
    chain();
    kernels = KernelCostScope::totals().kernels;
  }
  const double t = best_time(5, chain);
  return kernels > 0 ? t / static_cast<double>(kernels) : 0.0;
}

// Ranks of this host that compute at once: cores / OpenMP threads per rank.
int64_t compute_slots() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = 1;
#ifdef _OPENMP
  threads = std::max(1, omp_get_max_threads());
#endif
  return std::max(1, cores / threads);
}

double gemm_rate(DType dt) {
  const int64_t n = 384;
  Tensor a = ones(Shape{n, n}, dt), b = ones(Shape{n, n}, dt);
  const double t = best_time(3, [&] { (void)matmul(a, b); });
  return 2.0 * static_cast<double>(n * n * n) / t;
}

}  // namespace

int run_calibrate(const std::string& out) {
  NoGradGuard no_grad;
  const World& w = world();
  HardwareProfile hw;
  hw.name = "calibrated";
  hw.gemm_flops_f32 = gemm_rate(DType::kF32);
  hw.gemm_flops_bf16 = gemm_rate(DType::kBF16);
  {
    const int64_t n = int64_t{16} << 20;  // 64 MiB of f32
    Tensor src = ones(Shape{n}), dst = empty(Shape{n});
    const double t = best_time(3, [&] { dst.copy_(src); });
    hw.memory_bandwidth = 2.0 * 4.0 * static_cast<double>(n) / t;  // read + written, as kernels/cost.h counts
  }
  hw.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  // One host holds every rank (no group crosses nodes); ranks beyond the compute slots share the cores.
  hw.devices_per_node = int64_t{1} << 20;
  hw.compute_slots = compute_slots();
  {
    const bool prev = GradMode::enabled();  // run_calibrate holds a NoGradGuard: the chain needs autograd
    GradMode::set(true);
    hw.kernel_overhead_s = kernel_overhead();
    GradMode::set(prev);
  }
  const int k = w.size();
  if (k > 1) {
    DeviceMesh mesh(Shape{k}, {"world"});
    Communicator c = mesh.comm();
    Tensor small = ones(Shape{1});
    const int64_t big_n = int64_t{4} << 20;  // 16 MiB
    Tensor big = ones(Shape{big_n});
    const double ts = best_time(20, [&] { c.all_reduce(small); });
    const double tb = best_time(3, [&] { c.all_reduce(big); });
    const double kk = static_cast<double>(k);
    hw.intra.alpha_s = ts / (2 * (kk - 1));
    const double rest = std::max(tb - ts, tb * 0.05);
    hw.intra.bandwidth = 2 * (kk - 1) / kk * 4.0 * static_cast<double>(big_n) / rest;
    hw.description = fmt::format(
        "calibrated by `meshtrain plan --calibrate` on {} ranks of this host: f32 GEMM n=384, a 64 MiB copy, "
        "MPI all_reduce of 4 B and 16 MiB, the host time per kernel call of small autograd ops, and {} compute "
        "slots (cores / OpenMP threads per rank)", k, hw.compute_slots);
  } else {
    // A world of one has no peers to time: a collective is taken as a copy through shared memory.
    hw.intra.alpha_s = 5e-6;
    hw.intra.bandwidth = hw.memory_bandwidth / 2;
    hw.description = "calibrated by `meshtrain plan --calibrate` in a world of one: GEMM, copy and per-kernel overhead timed; "
                     "the links are not (alpha 5 us and half the copy bandwidth assumed; run it under mpirun -np 2 "
                     "or more)";
  }
  hw.inter = hw.intra;
  if (w.rank() == 0) {
    std::ofstream f(out);
    MT_CHECK(f.good(), "meshtrain plan --calibrate: cannot write --out {}", out);
    f << hardware_profile_json(hw);
    MT_CHECK(f.good(), "meshtrain plan --calibrate: writing --out {} failed", out);
    fmt::print("{}", hardware_profile_json(hw));
    fmt::print("# wrote {}\n", out);
  }
  return 0;
}

}  // namespace mt::cli
