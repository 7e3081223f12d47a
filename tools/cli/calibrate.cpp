// Calibration of a hardware profile on the machine at hand (calibrate.h).
#include "tools/cli/calibrate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cost.h"
#include "kernels/registry.h"
#include "mesh/collective_count.h"
#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "plan/estimate.h"
#include "plan/grad_reducer.h"
#include "plan/parallelize.h"
#include "plan/plan.h"
#include "plan/roofline.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/meta_memory.h"
#include "tensor/module.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace mt::cli {
namespace {

// Best of `reps` timings (seconds) of f (at least one), after one warm-up call unless `warm_up` is false.
double best_time(int reps, const std::function<void()>& f, bool warm_up = true) {
  if (warm_up) f();
  double best = 1e30;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// One fitted per-call cost and how it was fitted (printed as a comment after the profile).
struct Fit {
  double per_call_s = 0;
  double kernels_per_call = 0;  // kernel calls inside one call (a redistribution's copies)
  std::string note;
};

// The stock data-parallel LLaMA plan (plans/llama_dp.plan), inline so that calibrating needs no
// plans directory.
constexpr const char* kDpPlan =
    "mesh dp=*\n"
    "place    model  <in>:0  dp=S(0)\n"
    "factory  model  rope    dp=R\n";

// Host time per DTensor redistribution beyond its kernels and its collective: a small [8 K, 16]
// f32 DTensor is redistributed Shard(0) -> Replicate over the whole world (one all_gather; a copy
// in a world of one), best of 50; the all_gather's alpha-beta time (the links just timed) and the
// copy kernels at the memory bandwidth are taken off (later also their per-kernel overhead), compute
// stretched by the ranks sharing the cores as the roofline does.
Fit redistribute_overhead(const HardwareProfile& hw, double sharing) {
  const World& w = world();
  const int64_t k = w.size();
  DeviceMesh mesh(Shape{k}, {"dp"});
  Tensor x = distribute_tensor(ones(Shape{8 * k, 16}), mesh, {Placement::shard(0)});
  const Placements rep{Placement::replicate()};
  (void)redistribute(x, rep);
  KernelCost cost;
  {
    KernelCostScope scope;
    (void)redistribute(x, rep);
    cost = KernelCostScope::totals();
  }
  const double t = best_time(50, [&] { (void)redistribute(x, rep); });
  const double comm = collective_seconds("all_gather", 1, 8 * k * 16 * 4, k, hw.intra);
  const double host = (t - comm) / sharing - cost.other_bytes / hw.memory_bandwidth;
  Fit f;
  const double calls = static_cast<double>(std::max<int64_t>(cost.redistributes, 1));
  f.per_call_s = std::max(0.0, host / calls);
  f.kernels_per_call = static_cast<double>(cost.kernels) / calls;
  f.note = fmt::format("per redistribution: {:.1f} us, all_gather {:.1f} us, {} kernel calls, sharing {:.2g}", t * 1e6,
                       comm * 1e6, cost.kernels, sharing);
  return f;
}

// Host time per kernel call and per DTensor op dispatch, fitted on two real llama-tiny training
// steps (f32, AdamW, batch 2 x seq 16 per rank) that run on every rank at once, interleaved
// (plain, plan, plain, plan, ...: a shared machine's load falls on both alike), best of 10 each:
//  - plain: the model without a plan. Its kernel calls, matmul FLOPs and memory-bound bytes are
//    counted (kernels/cost.h) by a dry run on meta tensors, as the estimate counts them (the
//    optimizer is modelled as the estimate models it: 7 f32 accesses per element); what the GEMM and copy rates do not explain (compute stretched by
//    the ranks sharing the cores, as the roofline does) is spread over its kernel calls: dispatch,
//    autograd, allocation, views, and the small GEMMs' shortfall from the n=384 rate;
//  - plan: the same model parallelized by the data-parallel plan over the whole world, with the
//    gradient reducer (64 KiB buckets); its kernels, DTensor dispatches, redistributions and
//    collectives are counted by the estimate itself (estimate_rank on this rank's coordinate). What the roofline with every other fitted figure
//    (GEMM, copy, per-kernel and per-redistribution overheads, sharing, alpha-beta collectives)
//    does not explain is spread over the DTensor dispatches: it takes in module hooks, the DTensor
//    autograd nodes and the reducer's bookkeeping, which run once per dispatch or less.
std::pair<Fit, Fit> fit_step_overheads(HardwareProfile& hw) {
  const int64_t k = world().size();
  const ModelConfig cfg = builtin_config("llama-tiny");
  const int64_t seq = 16;
  Generator g(7);
  const Tensor t = randint(0, cfg.vocab_size, {2 * k, seq + 1}, DType::kI64, &g);
  const Tensor ids_g = t.narrow(1, 0, seq).contiguous(), targets_g = t.narrow(1, 1, seq).contiguous();

  manual_seed(1234);
  std::shared_ptr<CausalLM> plain = build_causal_lm(cfg);
  AdamWOptions ao;
  ao.lr = 1e-3;
  AdamW plain_opt(make_param_groups(plain->named_parameters(), 0.0), ao);
  const Tensor plain_ids = ids_g.narrow(0, 0, 2).contiguous(), plain_targets = targets_g.narrow(0, 0, 2).contiguous();
  auto plain_step = [&] {
    plain->loss(plain_ids, plain_targets).backward();
    plain_opt.step();
    plain_opt.zero_grad();
    plain->zero_grad();
  };

  const Plan plan = parse_plan(kDpPlan, "<meshtrain plan --calibrate: llama_dp>");
  const PlanMesh pm = plan.resolve_mesh(k);
  DeviceMesh mesh(pm.shape, pm.names);
  manual_seed(1234);
  std::shared_ptr<CausalLM> model = build_causal_lm(cfg);
  Parallelized par = parallelize(*model, plan, mesh);
  GradReducerOptions ro;
  ro.bucket_bytes = int64_t{1} << 16;
  GradReducer reducer(*model, mesh, ro);
  AdamW opt(make_param_groups(model->named_parameters(), 0.0), ao);
  const Placements in_ps = par.input_placements("model");
  auto plan_step = [&] {
    Tensor ids = distribute_tensor(ids_g, mesh, in_ps), targets = distribute_tensor(targets_g, mesh, in_ps);
    model->loss(ids, targets).backward();
    reducer.finish();
    opt.step();
    opt.zero_grad();
    model->zero_grad();
  };

  plain_step();
  plan_step();  // the reducer fixes its buckets on the first step
  // The calls are counted as the estimate counts them, by the same dry run on meta tensors (meta
  // fills, for one, run no kernel): the fitted costs are per counted call.
  RankEstimate plain_count, plan_count;
  {
    std::shared_ptr<CausalLM> meta;
    {
      InitDeviceGuard on_meta(Device::meta());
      meta = build_causal_lm(cfg);
    }
    MetaKernelsGuard meta_kernels;
    MetaMemoryScope meta_bytes;
    const TensorOptions io = TensorOptions(DType::kI64).with_device(Device::meta());
    meta->loss(empty(Shape{2, seq}, io), empty(Shape{2, seq}, io)).backward();  // warm-up, as the estimate's
    meta->zero_grad();
    KernelCostScope cost;
    meta->loss(empty(Shape{2, seq}, io), empty(Shape{2, seq}, io)).backward();
    plain_count.cost = KernelCostScope::totals();
    // The optimizer as the estimate models it (estimate.cpp): the fused AdamW loop, 7 f32 accesses per element.
    plain_count.cost.other_bytes += 7 * 4 * static_cast<double>(cfg.num_parameters());
  }
  {
    EstimateModel em;
    em.build_meta = [&] {
      InitDeviceGuard on_meta(Device::meta());
      return std::static_pointer_cast<Module>(build_causal_lm(cfg));
    };
    em.loss = [](Module& m, const Tensor& ids, const Tensor& tg) { return static_cast<CausalLM&>(m).loss(ids, tg); };
    EstimateOptions eo;
    eo.batch = 2 * k;
    eo.seq = seq;
    eo.precision = DType::kF32;
    eo.bucket_bytes = ro.bucket_bytes;
    plan_count = estimate_rank(em, plan, pm, {world().rank()}, eo);
  }
  double t_plain = 1e30, t_plan = 1e30;
  for (int i = 0; i < 10; ++i) {
    t_plain = std::min(t_plain, best_time(0, plain_step, false));
    t_plan = std::min(t_plan, best_time(0, plan_step, false));
  }
  const PlanMesh one{{"dp"}, Shape{k}};  // the plain step's ranks share the cores as the plan's do
  HardwareProfile h = hw;
  h.kernel_overhead_s = h.dist_op_overhead_s = 0;
  const StepTime rp = roofline(plain_count, one, h, DType::kF32);
  std::pair<Fit, Fit> f;
  f.first.per_call_s = std::max(0.0, t_plain / rp.sharing - rp.total_s / rp.sharing) /
                       static_cast<double>(std::max<int64_t>(plain_count.cost.kernels, 1));
  f.first.note = fmt::format("per kernel: llama-tiny step {:.3f} ms, GEMM + copy {:.3f} ms (sharing {:.2g}), {} kernel calls",
                             t_plain * 1e3, rp.total_s * 1e3, rp.sharing, plain_count.cost.kernels);
  h.kernel_overhead_s = f.first.per_call_s;
  const StepTime r = roofline(plan_count, pm, h, DType::kF32);
  f.second.per_call_s = std::max(0.0, (t_plan - r.total_s) / r.sharing) /
                        static_cast<double>(std::max<int64_t>(plan_count.cost.dist_ops, 1));
  f.second.note = fmt::format("per DTensor op: llama_dp step {:.3f} ms, roofline without it {:.3f} ms (comm {:.3f} ms, "
                              "sharing {:.2g}), {} kernel calls, {} DTensor ops, {} redistributions",
                              t_plan * 1e3, r.total_s * 1e3, r.comm_s * 1e3, r.sharing, plan_count.cost.kernels,
                              plan_count.cost.dist_ops, plan_count.cost.redistributes);
  return f;
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
  const double t = best_time(10, [&] { (void)matmul(a, b); });
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
  std::vector<double> rates(3, 0.0);
  std::vector<std::string> notes;
  if (w.rank() < hw.compute_slots) {
    rates[0] = gemm_rate(DType::kF32);
    rates[1] = gemm_rate(DType::kBF16);
    const int64_t n = int64_t{16} << 20;  // 64 MiB of f32
    Tensor src = ones(Shape{n}), dst = empty(Shape{n});
    const double t = best_time(5, [&] { dst.copy_(src); });
    rates[2] = 2.0 * 4.0 * static_cast<double>(n) / t;  // read + written, as kernels/cost.h counts
  }
  if (k > 1) {
    DeviceMesh all(Shape{k}, {"world"});
    Tensor r = from_vector<double>(rates, Shape{3});
    all.comm().broadcast(r, 0);
    rates = r.to_vector<double>();
  }
  hw.gemm_flops_f32 = rates[0];
  hw.gemm_flops_bf16 = rates[1];
  hw.memory_bandwidth = rates[2];
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
        "per DTensor redistribution on a timed Shard(0) -> Replicate, per DTensor op dispatch on a llama-tiny step "
        "under the data-parallel plan over all ranks, and {} compute slots (cores / OpenMP threads per rank)", k, hw.compute_slots);
  } else {
    // A world of one has no peers to time: a collective is taken as a copy through shared memory.
    hw.intra.alpha_s = 5e-6;
    hw.intra.bandwidth = hw.memory_bandwidth / 2;
    hw.description = "calibrated by `meshtrain plan --calibrate` in a world of one: GEMM, copy, per-kernel, per-redistribution and "
                     "per-DTensor-op (a one-rank data-parallel plan step) overheads timed; "
                     "the links are not (alpha 5 us and half the copy bandwidth assumed; run it under mpirun -np 2 "
                     "or more)";
  }
  hw.inter = hw.intra;
  // The host costs per call, every rank at once; rank 0's figures are given to every rank.
  {
    const bool prev = GradMode::enabled();  // run_calibrate holds a NoGradGuard: the steps need autograd
    const double sharing = std::max(1.0, static_cast<double>(k) / static_cast<double>(hw.compute_slots));
    const Fit fr = redistribute_overhead(hw, sharing);
    hw.redistribute_overhead_s = fr.per_call_s;
    GradMode::set(true);
    const auto [fk, fd] = fit_step_overheads(hw);
    GradMode::set(prev);
    notes.push_back(fk.note);
    notes.push_back(fr.note);
    notes.push_back(fd.note);
    std::vector<double> fit{fk.per_call_s, fd.per_call_s, fr.per_call_s};
    if (k > 1) {
      DeviceMesh all(Shape{k}, {"world"});
      Tensor f = from_vector<double>(fit, Shape{3});
      all.comm().broadcast(f, 0);
      fit = f.to_vector<double>();
    }
    hw.kernel_overhead_s = fit[0];
    hw.dist_op_overhead_s = fit[1];
    // The redistribution's own kernel calls are charged the per-kernel overhead apart.
    hw.redistribute_overhead_s = std::max(0.0, fit[2] - fr.kernels_per_call * fit[0]);
  }
  if (w.rank() == 0) {
    std::ofstream f(out);
    MT_CHECK(f.good(), "meshtrain plan --calibrate: cannot write --out {}", out);
    f << hardware_profile_json(hw);
    MT_CHECK(f.good(), "meshtrain plan --calibrate: writing --out {} failed", out);
    fmt::print("{}", hardware_profile_json(hw));
    for (const std::string& n : notes) fmt::print("# rank 0 fit, {}\n", n);
    fmt::print("# wrote {}\n", out);
  }
  return 0;
}

}  // namespace mt::cli
