// Calibration of a hardware profile on the machine at hand (calibrate.h).
#include "tools/cli/calibrate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cost.h"
#include "mesh/device_mesh.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/llama.h"
#include "optim/adamw.h"
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

// Host time per kernel call in an eager training step, fitted on a real one: llama-tiny (batch 2 x
// seq 16, f32, AdamW) is timed (best of 3 steps), its kernel calls, matmul FLOPs and memory-bound
// bytes are counted (kernels/cost.h), and what the GEMM and copy rates do not explain is spread
// over the calls. This takes in everything an eager op costs besides its kernel: dispatch,
// autograd, allocation, views and module hooks.
double kernel_overhead(double gemm_flops, double memory_bandwidth) {
  const ModelConfig cfg = builtin_config("llama-tiny");
  manual_seed(1234);
  std::shared_ptr<CausalLM> model = build_causal_lm(cfg);
  AdamWOptions ao;
  ao.lr = 1e-3;
  AdamW opt(make_param_groups(model->named_parameters(), 0.0), ao);
  Generator g(7);
  const Tensor t = randint(0, cfg.vocab_size, {2, 17}, DType::kI64, &g);
  const Tensor ids = t.narrow(1, 0, 16).contiguous(), targets = t.narrow(1, 1, 16).contiguous();
  auto step = [&] {
    model->loss(ids, targets).backward();
    opt.step();
    opt.zero_grad();
    model->zero_grad();
  };
  step();
  KernelCost cost;
  {
    KernelCostScope scope;
    step();
    cost = KernelCostScope::totals();
  }
  const double t_best = best_time(3, step);
  const double explained = cost.matmul_flops / gemm_flops + cost.other_bytes / memory_bandwidth;
  return cost.kernels > 0 ? std::max(0.0, t_best - explained) / static_cast<double>(cost.kernels) : 0.0;
}

// Ranks of this host that compute at once: the host's online cores / OpenMP threads per rank
// (not the process's affinity mask, which mpirun narrows to the rank's own core).
int64_t compute_slots() {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores <= 0) cores = static_cast<long>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = 1;
#ifdef _OPENMP
  threads = std::max(1, omp_get_max_threads());
#endif
  return std::max<int64_t>(1, cores / threads);
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
  hw.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  // One host holds every rank (no group crosses nodes); ranks beyond the compute slots share the cores.
  hw.devices_per_node = int64_t{1} << 20;
  hw.compute_slots = compute_slots();
  // The per-rank rates are those of a rank with its own compute slot: only the first
  // min(ranks, slots) ranks time them, at once (the roofline stretches compute by ranks / slots
  // itself); rank 0's figures are then given to every rank.
  const int k = w.size();
  std::vector<double> rates(4, 0.0);
  if (w.rank() < hw.compute_slots) {
    rates[0] = gemm_rate(DType::kF32);
    rates[1] = gemm_rate(DType::kBF16);
    const int64_t n = int64_t{16} << 20;  // 64 MiB of f32
    Tensor src = ones(Shape{n}), dst = empty(Shape{n});
    const double t = best_time(3, [&] { dst.copy_(src); });
    rates[2] = 2.0 * 4.0 * static_cast<double>(n) / t;  // read + written, as kernels/cost.h counts
    const bool prev = GradMode::enabled();  // run_calibrate holds a NoGradGuard: the step needs autograd
    GradMode::set(true);
    rates[3] = kernel_overhead(rates[0], rates[2]);
    GradMode::set(prev);
  }
  if (k > 1) {
    DeviceMesh all(Shape{k}, {"world"});
    Tensor r = from_vector<double>(rates, Shape{4});
    all.comm().broadcast(r, 0);
    rates = r.to_vector<double>();
  }
  hw.gemm_flops_f32 = rates[0];
  hw.gemm_flops_bf16 = rates[1];
  hw.memory_bandwidth = rates[2];
  hw.kernel_overhead_s = rates[3];
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
        "MPI all_reduce of 4 B and 16 MiB, the host time per kernel call fitted on a llama-tiny training step, "
        "and {} compute slots (cores / OpenMP threads per rank)", k, hw.compute_slots);
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
