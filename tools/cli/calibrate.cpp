// Calibration of a hardware profile on the machine at hand (calibrate.h).
#include "tools/cli/calibrate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <ctime>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
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
#include "runtime/file_io.h"
#include "runtime/profiler.h"
#include "tensor/autograd.h"
#include "tensor/meta_memory.h"
#include "tensor/module.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace mt::cli {
namespace {

// This process's CPU time (s): the time it ran, not the time it waited to run.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best of `reps` timings (seconds) of f (at least one), after one warm-up call unless `warm_up` is false.
// `cpu_clock`: timed in this process's CPU time instead of wall time.
double best_time(int reps, const std::function<void()>& f, bool warm_up = true, bool cpu_clock = false) {
  if (warm_up) f();
  double best = 1e30;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    f();
    best = std::min(best, cpu_clock ? cpu_seconds() - c0
                                    : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The statistic the validation measures a step with (best of 3 calls), taken 7 times and the
// median kept: a shared machine's load varies from second to second.
double median_best_of_3(const std::function<void()>& f, bool cpu_clock = false) {
  f();
  std::vector<double> v;
  for (int i = 0; i < 7; ++i) v.push_back(best_time(3, f, false, cpu_clock));
  std::nth_element(v.begin(), v.begin() + 3, v.end());
  return v[3];
}

// One fitted per-call cost and how it was fitted (printed as a comment after the profile).
struct Fit {
  double per_call_s = 0;
  double kernels_per_call = 0;  // kernel calls inside one call (a redistribution's copies)
  std::string note;
};

// Waits for a collective without spinning (MPI's blocking waits poll a core): the ranks that do not
// time the rates must leave the cores to those that do.
void quiet_wait(Work w) {
  while (!w.is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// The stock data-parallel LLaMA plan (plans/llama_dp.plan), inline so that calibrating needs no
// plans directory.
constexpr const char* kDpPlan =
    "mesh dp=*\n"
    "place    model  <in>:0  dp=S(0)\n"
    "factory  model  rope    dp=R\n";
// The stock ZeRO-3 plan (plans/llama_zero3.plan).
constexpr const char* kZero3Plan =
    "mesh dp=*\n"
    "init     .*     .*      dp=S(0)\n"
    "run      .*     .*      dp=R\n"
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

// One plan's training step on llama-tiny over the whole world, f32, the gradient reducer (one
// 25 MiB bucket: a handful of collectives) and AdamW, and the same step counted by the estimate
// itself (estimate_rank on this rank's coordinate: the fitted costs are per call as the estimate
// counts calls; meta fills, for one, run no kernel). `one_rank`: each rank runs the plan alone, on
// a mesh of one rank (the `one` dim of a [world, one] mesh), as a pipeline stage's own mesh is.
DeviceMesh plan_step_mesh(const PlanMesh& pm, bool one_rank) {
  if (!one_rank) return DeviceMesh(pm.shape, pm.names);
  return DeviceMesh(Shape{world().size(), 1}, {"world", pm.names.at(0)}).select({pm.names.at(0)});
}

struct PlanStep {
  PlanStep(const char* text, const char* name, const ModelConfig& cfg, const Tensor& ids_g, const Tensor& targets_g,
           bool one_rank = false)
      : plan(parse_plan(text, fmt::format("<meshtrain plan --calibrate: {}>", name))),
        pm(plan.resolve_mesh(one_rank ? 1 : world().size())),
        mesh(plan_step_mesh(pm, one_rank)),
        ids(ids_g),
        targets(targets_g) {
    manual_seed(1234);
    model = build_causal_lm(cfg);
    par.emplace(parallelize(*model, plan, mesh));
    reducer.emplace(*model, mesh, GradReducerOptions{});
    AdamWOptions ao;
    ao.lr = 1e-3;
    opt.emplace(make_param_groups(model->named_parameters(), 0.0), ao);
    in_ps = par->input_placements("model");
    run();  // the reducer fixes its buckets on the first step
    EstimateModel em;
    em.build_meta = [&] {
      InitDeviceGuard on_meta(Device::meta());
      return std::static_pointer_cast<Module>(build_causal_lm(cfg));
    };
    em.loss = [](Module& m, const Tensor& i, const Tensor& t) { return static_cast<CausalLM&>(m).loss(i, t); };
    EstimateOptions eo;
    eo.batch = ids.shape()[0];
    eo.seq = ids.shape()[1];
    eo.precision = DType::kF32;
    eo.bucket_bytes = GradReducerOptions{}.bucket_bytes;
    counted = estimate_rank(em, plan, pm, {one_rank ? 0 : world().rank()}, eo);
  }
  void run() {
    Tensor i = distribute_tensor(ids, mesh, in_ps), t = distribute_tensor(targets, mesh, in_ps);
    model->loss(i, t).backward();
    reducer->finish();
    opt->step();
    opt->zero_grad();
    model->zero_grad();
  }
  Plan plan;
  PlanMesh pm;
  DeviceMesh mesh;
  Tensor ids, targets;
  std::shared_ptr<CausalLM> model;
  std::optional<Parallelized> par;
  std::optional<GradReducer> reducer;
  std::optional<AdamW> opt;
  Placements in_ps;
  RankEstimate counted;
};

struct StepFits {
  Fit kernel, dist_op, collective, local_dist_op;
  double kernel_bandwidth = 0;  // the memory-bound kernels' bytes per second in a real step; 0: not fitted
  double cpu_share = 1;
  // Per bucket of kernels/cost.h (0: none of the step's products fell in it): the GEMM efficiency
  // the plain step's own matmuls reached, measured by the profiler.
  std::vector<double> step_gemm_efficiency = std::vector<double>(kGemmDimBuckets - 1, 0.0);
};

// The smallest dim of a matmul event ("[M,K] [K,N] [M,N]", batched dims first): as kernels/cost.h
// buckets it.
int64_t matmul_min_dim(const std::string& shapes) {
  std::vector<std::vector<int64_t>> views;
  size_t i = 0;
  while ((i = shapes.find('[', i)) != std::string::npos) {
    const size_t j = shapes.find(']', i);
    if (j == std::string::npos) break;
    std::vector<int64_t> dims;
    std::stringstream ss(shapes.substr(i + 1, j - i - 1));
    std::string d;
    while (std::getline(ss, d, ',')) dims.push_back(std::atoll(d.c_str()));
    views.push_back(dims);
    i = j + 1;
  }
  if (views.size() < 3 || views[0].size() < 2 || views[2].size() < 2) return 0;
  const auto& a = views[0];
  const auto& out = views[2];
  return std::min({out[out.size() - 2], out.back(), a.back()});
}

// The GEMM efficiency a real step's matmuls reach, per bucket: `steps` profiled runs of `step`,
// each matmul's time (the profiler's, around the kernel) and FLOPs summed per bucket, the rate
// taken as a fraction of `square` (CPU-time rate: the wall times are scaled by the runs' CPU share).
std::vector<double> step_gemm_efficiency(const std::function<void()>& step, int steps, double square) {
  std::vector<double> flops(kGemmDimBuckets, 0.0), secs(kGemmDimBuckets, 0.0);
  const double c0 = cpu_seconds();
  const auto w0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    Profiler prof;
    step();
    prof.stop();
    for (const ProfileEvent& e : prof.events()) {
      if (e.kind != ProfileEvent::Kind::kOp || e.name != "matmul" || e.flops <= 0) continue;
      const int b = gemm_dim_bucket(matmul_min_dim(e.shapes));
      flops[static_cast<size_t>(b)] += e.flops;
      secs[static_cast<size_t>(b)] += e.dur_us * 1e-6;
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  const double share = std::clamp((cpu_seconds() - c0) / std::max(wall, 1e-9), 0.05, 1.0);
  std::vector<double> eff(kGemmDimBuckets - 1, 0.0);
  for (int b = 0; b + 1 < kGemmDimBuckets; ++b)
    if (secs[static_cast<size_t>(b)] > 0)
      eff[static_cast<size_t>(b)] = flops[static_cast<size_t>(b)] / (secs[static_cast<size_t>(b)] * share) / square;
  return eff;
}

// `hw`'s GEMM efficiency points with the buckets a real step measured (`eff`, 0: not measured)
// in place of the synthetic ones at those bounds.
void merge_step_efficiency(HardwareProfile& hw, const std::vector<double>& eff) {
  for (auto& [d, f] : hw.gemm_efficiency)
    for (int b = 0; b + 1 < kGemmDimBuckets; ++b)
      if (kGemmDimBound[b] == d && eff[static_cast<size_t>(b)] > 0) f = eff[static_cast<size_t>(b)];
}


// Host time per kernel call, per DTensor op dispatch and per collective call, fitted on three real
// llama-tiny training steps (f32, AdamW, batch 2 x seq 32 per rank) that run on every rank at once,
// interleaved (plain, dp, zero3, plain, ...: a shared machine's load falls on all alike), each
// timed as the step it predicts is measured (best of 3 steps), the median of 7 such:
//  - plain: the model without a plan, its kernel calls, matmul FLOPs and memory-bound bytes
//    counted by a meta dry run as the estimate counts them (the optimizer modelled as the estimate
//    models it: 7 f32 accesses per element). What the GEMM and copy rates do not explain (compute
//    stretched by the ranks sharing the cores, as the roofline does) is spread over its kernel
//    calls: dispatch, autograd, allocation, views, and what the thin-GEMM efficiencies do not capture;
//  - dp: the data-parallel plan (DTensor ops, a few collectives) and zero3: the ZeRO-3 plan (the
//    same DTensor ops, and an all_gather and a reduce_scatter per parameter). Their roofline with
//    every other fitted figure leaves a remainder; the two remainders give the cost per DTensor
//    dispatch (module hooks, the DTensor autograd nodes, the reducer's bookkeeping: once per
//    dispatch or less) and per collective call beyond its alpha-beta time (a rank waiting for a
//    peer that is not running: the collectives of a real step are not back to back), solved
//    together (least squares of two equations; a negative one is set to 0 and the other refitted).
//    In a world of one no collective runs and the second is 0.
StepFits fit_step_overheads(const HardwareProfile& hw) {
  const int64_t k = world().size();
  const ModelConfig cfg = builtin_config("llama-tiny");
  const int64_t seq = 32;
  Generator g(7);
  const Tensor t = randint(0, cfg.vocab_size, {2 * k, seq + 1}, DType::kI64, &g);
  const Tensor ids_g = t.narrow(1, 0, seq).contiguous(), targets_g = t.narrow(1, 1, seq).contiguous();

  manual_seed(1234);
  std::shared_ptr<CausalLM> plain = build_causal_lm(cfg);
  AdamWOptions ao;
  ao.lr = 1e-3;
  AdamW plain_opt(make_param_groups(plain->named_parameters(), 0.0), ao);
  // One training step of the plain model on the given batch.
  auto step_on = [&](const Tensor& ids, const Tensor& targets) {
    return [&, ids, targets] {
      plain->loss(ids, targets).backward();
      plain_opt.step();
      plain_opt.zero_grad();
      plain->zero_grad();
    };
  };
  const Tensor plain_ids = ids_g.narrow(0, 0, 2).contiguous(), plain_targets = targets_g.narrow(0, 0, 2).contiguous();
  const auto plain_step = step_on(plain_ids, plain_targets);
  plain_step();
  // The same model on one sequence of 16 tokens (a pipeline micro-batch's size): the same kernel
  // calls over a quarter of the bytes, so that the two steps tell the cost per call from the cost
  // per byte of the memory-bound kernels (below).
  const auto small_step = step_on(ids_g.narrow(0, 0, 1).narrow(1, 0, 16).contiguous(),
                                  targets_g.narrow(0, 0, 1).narrow(1, 0, 16).contiguous());
  small_step();
  // The plain step's own matmuls, profiled: their efficiency per bucket replaces the synthetic
  // products' (tools/cli/calibrate.cpp, gemm_efficiency_points) where the step has products, so
  // that what a real step's GEMMs lose to a square product is charged to its FLOPs, not spread
  // over every kernel call.
  StepFits f;
  f.step_gemm_efficiency = step_gemm_efficiency(plain_step, 3, hw.gemm_flops_f32);
  {
    const std::vector<double> small_eff = step_gemm_efficiency(small_step, 3, hw.gemm_flops_f32);
    for (size_t b = 0; b < small_eff.size(); ++b)
      if (f.step_gemm_efficiency[b] == 0) f.step_gemm_efficiency[b] = small_eff[b];
  }
  auto count_plain = [&](int64_t batch, int64_t len) {
    RankEstimate c;
    std::shared_ptr<CausalLM> meta;
    {
      InitDeviceGuard on_meta(Device::meta());
      meta = build_causal_lm(cfg);
    }
    MetaKernelsGuard meta_kernels;
    MetaMemoryScope meta_bytes;
    const TensorOptions io = TensorOptions(DType::kI64).with_device(Device::meta());
    meta->loss(empty(Shape{batch, len}, io), empty(Shape{batch, len}, io)).backward();  // warm-up, as the estimate's
    meta->zero_grad();
    KernelCostScope cost;
    meta->loss(empty(Shape{batch, len}, io), empty(Shape{batch, len}, io)).backward();
    c.cost = KernelCostScope::totals();
    c.cost.optimizer_bytes = 7 * 4 * static_cast<double>(cfg.num_parameters());
    return c;
  };
  const RankEstimate plain_count = count_plain(2, seq), small_count = count_plain(1, 16);
  PlanStep dp(kDpPlan, "llama_dp", cfg, ids_g, targets_g);
  PlanStep z3(kZero3Plan, "llama_zero3", cfg, ids_g, targets_g);
  // Each rank's own data-parallel step on a mesh of one rank, with the plain step's 2 sequences:
  // the DTensor ops without peers (a pipeline stage's mesh under llama_pp). A world of one: dp is it.
  std::optional<PlanStep> alone;
  if (k > 1) alone.emplace(kDpPlan, "llama_dp on one rank", cfg, plain_ids, plain_targets, true);

  // The statistic of the measured steps it predicts (best of 3 steps), taken 7 times per step
  // kind, interleaved, and the median kept: a shared machine's load varies from second to second.
  std::vector<double> s_plain, s_dp, s_z3, s_alone, s_small;
  double plain_cpu = 0, plain_wall = 0;  // the rank's share of the host while its plain steps run
  // The ranks run their plain steps together, and none spins in MPI meanwhile (a busy wait would
  // take a core from the others' plain steps).
  std::optional<DeviceMesh> all;
  if (k > 1) all.emplace(Shape{k}, std::vector<std::string>{"world"});
  auto together = [&] {
    if (all) quiet_wait(all->comm().barrier_async());
  };
  for (int i = 0; i < 7; ++i) {
    together();
    const double c0 = cpu_seconds();
    const auto w0 = std::chrono::steady_clock::now();
    s_plain.push_back(best_time(3, plain_step, false));
    plain_cpu += cpu_seconds() - c0;
    plain_wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    s_small.push_back(best_time(3, small_step, false));
    if (alone) s_alone.push_back(best_time(3, [&] { alone->run(); }, false));
    together();
    s_dp.push_back(best_time(3, [&] { dp.run(); }, false));
    s_z3.push_back(best_time(3, [&] { z3.run(); }, false));
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const double t_plain = median(s_plain), t_dp = median(s_dp), t_z3 = median(s_z3);
  const PlanMesh one{{"dp"}, Shape{k}};  // the plain step's ranks share the cores as the plans' do
  HardwareProfile h = hw;
  h.kernel_overhead_s = h.dist_op_overhead_s = h.collective_overhead_s = 0;
  merge_step_efficiency(h, f.step_gemm_efficiency);
  // The plain steps make no MPI call: CPU / wall is the rank's share of the host, of which ranks /
  // slots is this job's own crowding (the roofline's sharing); the rest is other load.
  const double own = std::max(1.0, static_cast<double>(k) / static_cast<double>(hw.compute_slots));
  f.cpu_share = std::clamp(plain_cpu / std::max(plain_wall, 1e-9) * own, 0.05, 1.0);
  h.cpu_share = f.cpu_share;
  const StepTime rp = roofline(plain_count, one, h, DType::kF32);
  f.kernel.per_call_s = std::max(0.0, (t_plain - rp.total_s) / rp.sharing) /
                        static_cast<double>(std::max<int64_t>(plain_count.cost.kernels, 1));
  f.kernel.note = fmt::format("per kernel: llama-tiny step {:.3f} ms, GEMM + copy {:.3f} ms (sharing {:.2g}, CPU share "
                              "{:.2f}), {} kernel calls", t_plain * 1e3, rp.total_s * 1e3, rp.sharing, f.cpu_share,
                              plain_count.cost.kernels);
  // Per call and per byte together, from the two plain steps (2 x 32 and 1 x 16 tokens: the same
  // calls, 4x the bytes): remainder_s = sharing x (kernels_s x c + memory_bytes_s x y) once the
  // GEMMs (at the steps' own measured efficiencies) and the optimizer are taken off; y is the
  // memory-bound kernels' seconds per byte in a real step (on this project's CPU host about a third
  // of the 64 MiB copy's rate: norms, SwiGLU and rope compute per byte). Kept when both come out
  // positive; otherwise the per-call fit above with the copy bandwidth.
  {
    const double t_small = median(s_small);
    auto without_memory = [&](RankEstimate c) {
      c.cost.other_bytes = 0;
      return roofline(c, one, h, DType::kF32);
    };
    const StepTime r2 = without_memory(plain_count), r1 = without_memory(small_count);
    const double y2 = (t_plain - r2.total_s) / r2.sharing, y1 = (t_small - r1.total_s) / r1.sharing;
    const double k2 = static_cast<double>(plain_count.cost.kernels), k1 = static_cast<double>(small_count.cost.kernels);
    const double b2 = plain_count.cost.other_bytes, b1 = small_count.cost.other_bytes;
    const double det = k1 * b2 - k2 * b1;
    if (std::abs(det) > 1e-9 * k1 * b2) {
      const double c = (y1 * b2 - y2 * b1) / det, y = (k1 * y2 - k2 * y1) / det;
      if (c > 0 && y > 0) {
        f.kernel.per_call_s = c;
        f.kernel_bandwidth = 1.0 / y;
        f.kernel.note = fmt::format("per kernel and per memory-bound byte: llama-tiny steps of 64 and 16 tokens {:.3f} / "
                                    "{:.3f} ms, GEMMs and optimizer {:.3f} / {:.3f} ms (sharing {:.2g}, CPU share {:.2f}), "
                                    "{} / {} kernel calls, {:.0f} / {:.0f} KiB: {:.2f} us per call, {:.1f} GB/s",
                                    t_plain * 1e3, t_small * 1e3, r2.total_s * 1e3, r1.total_s * 1e3, r2.sharing,
                                    f.cpu_share, plain_count.cost.kernels, small_count.cost.kernels, b2 / 1024, b1 / 1024,
                                    c * 1e6, 1e-9 / y);
      }
    }
  }
  h.kernel_overhead_s = f.kernel.per_call_s;
  h.kernel_bandwidth = f.kernel_bandwidth;
  // Remainder_p = sharing x dist_ops_p x c_d + collective_calls_p x c_c, p = dp, zero3.
  const StepTime rd = roofline(dp.counted, dp.pm, h, DType::kF32), rz = roofline(z3.counted, z3.pm, h, DType::kF32);
  const double a1 = rd.sharing * static_cast<double>(dp.counted.cost.dist_ops), y1 = t_dp - rd.total_s;
  const double a2 = rz.sharing * static_cast<double>(z3.counted.cost.dist_ops), y2 = t_z3 - rz.total_s;
  const double b1 = static_cast<double>(dp.counted.cost.blocking_collectives);
  const double b2 = static_cast<double>(z3.counted.cost.blocking_collectives);
  double cd = 0, cc = 0;
  const double det = a1 * b2 - a2 * b1;
  if (std::abs(det) > 1e-9 * std::max(1.0, std::abs(a1 * b2))) {
    cd = (y1 * b2 - y2 * b1) / det;
    cc = (a1 * y2 - a2 * y1) / det;
  }
  if (cd <= 0 || cc <= 0 || b1 + b2 == 0) {  // one unknown alone, least squares over both steps
    const bool only_d = cc <= 0 || b1 + b2 == 0 || cd > 0;
    if (only_d) {
      cc = 0;
      cd = std::max(0.0, (a1 * y1 + a2 * y2) / std::max(a1 * a1 + a2 * a2, 1e-30));
    } else {
      cd = 0;
      cc = std::max(0.0, (b1 * y1 + b2 * y2) / std::max(b1 * b1 + b2 * b2, 1e-30));
    }
  }
  f.dist_op.per_call_s = cd;
  f.collective.per_call_s = cc;
  // Per DTensor op on a one-rank mesh: the one-rank step's remainder over its DTensor ops.
  f.local_dist_op.per_call_s = cd;
  if (alone) {
    const StepTime ra = roofline(alone->counted, one, h, DType::kF32);  // every rank runs its own at once
    const double t_alone = median(s_alone);
    f.local_dist_op.per_call_s = std::max(0.0, t_alone - ra.total_s) /
                                 (ra.sharing * static_cast<double>(std::max<int64_t>(alone->counted.cost.dist_ops, 1)));
    f.local_dist_op.note = fmt::format("per DTensor op on a one-rank mesh: llama_dp step alone {:.3f} ms, roofline "
                                       "without it {:.3f} ms ({} DTensor ops, sharing {:.2g})", t_alone * 1e3,
                                       ra.total_s * 1e3, alone->counted.cost.dist_ops, ra.sharing);
  }
  f.dist_op.note = fmt::format("per DTensor op and per collective call: llama_dp step {:.3f} ms, roofline without them "
                               "{:.3f} ms ({} DTensor ops, {} blocking collectives, sharing {:.2g}); llama_zero3 step "
                               "{:.3f} ms, roofline without them {:.3f} ms ({} DTensor ops, {} blocking collectives)",
                               t_dp * 1e3, rd.total_s * 1e3, dp.counted.cost.dist_ops, b1, rd.sharing, t_z3 * 1e3,
                               rz.total_s * 1e3, z3.counted.cost.dist_ops, b2);
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
  const double t = median_best_of_3([&] { (void)matmul(a, b); }, /*cpu_clock=*/true);
  return 2.0 * static_cast<double>(n * n * n) / t;
}


// The GEMM rate of thin products as a fraction of `square` (gemm_rate's): for each bound d of
// kernels/cost.h's buckets, the three products a linear layer of width 512 makes over d tokens in a
// training step (y = x W^T and dx = dy W: M = d; dW = dy^T x: K = d), timed together in CPU time
// (median of 7 best-of-3), as the estimate counts them: FLOPs in the bucket of their smallest dim.
// The products go over several layers' operands in turn, 64 MiB of weights in all for the thin
// ones, as a step reads each layer's weights from memory, not from a warm cache (one hot 512 x 512
// weight gave 0.87 at d = 64 where a llama-30m step ran its d = 64 products at 0.64-0.76).
std::vector<std::pair<int64_t, double>> gemm_efficiency_points(double square) {
  const int64_t width = 512;
  std::vector<std::pair<int64_t, double>> pts;
  for (const int64_t d : kGemmDimBound) {
    const double flops_per_layer = 3 * 2.0 * static_cast<double>(d * width * width);
    // 64 layers (64 MiB of f32 weights), fewer where one pass would exceed about 2 GFLOP (wide d:
    // compute bound, the cache matters less).
    const int64_t layers = std::clamp<int64_t>(static_cast<int64_t>(2e9 / flops_per_layer), 4, 64);
    std::vector<Tensor> x, w, dy;
    for (int64_t l = 0; l < layers; ++l) {
      x.push_back(ones(Shape{d, width}));
      w.push_back(ones(Shape{width, width}));
      dy.push_back(ones(Shape{d, width}));
    }
    const double t = median_best_of_3(
        [&] {
          for (int64_t l = 0; l < layers; ++l) {
            const size_t i = static_cast<size_t>(l);
            (void)matmul(x[i], w[i].transpose(0, 1));
            (void)matmul(dy[i], w[i]);
            (void)matmul(dy[i].transpose(0, 1), x[i]);
          }
        },
        /*cpu_clock=*/true);
    pts.emplace_back(d, flops_per_layer * static_cast<double>(layers) / t / square);
  }
  return pts;
}

// The optimizer's bytes per second as the estimate counts them (7 f32 accesses per element: p, g,
// m, v read; p, m, v written): AdamW's step over 8 tensors of 1 M elements (224 MB, beyond the
// caches, as a model's state is), in CPU time, median of 7 best-of-3.
double optimizer_bandwidth() {
  NamedTensors params;
  for (int i = 0; i < 8; ++i) {
    Tensor p = ones(Shape{1024, 1024});
    p.requires_grad_(true);
    p.set_grad(ones(Shape{1024, 1024}));
    params.emplace_back(fmt::format("w{}", i), p);
  }
  AdamWOptions ao;
  ao.lr = 1e-6;
  AdamW opt(make_param_groups(params, 0.0), ao);
  const double t = median_best_of_3([&] { opt.step(); }, /*cpu_clock=*/true);
  return 7.0 * 4.0 * 8.0 * 1024.0 * 1024.0 / t;
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
  // itself), the others wait without spinning; rank 0's figures are then given to every rank. GEMM and
  // copy: the median of 7 best-of-3 timings in CPU time (the rate while running; the time a loaded
  // host does not give the rank is the profile's cpu_share, fitted below).
  const int k = w.size();
  constexpr int kEff = kGemmDimBuckets - 1;
  std::vector<double> rates(4 + kEff, 0.0);
  std::vector<std::string> notes;
  if (w.rank() < hw.compute_slots) {
    rates[0] = gemm_rate(DType::kF32);
    rates[1] = gemm_rate(DType::kBF16);
    const int64_t n = int64_t{16} << 20;  // 64 MiB of f32
    Tensor src = ones(Shape{n}), dst = empty(Shape{n});
    const double t = median_best_of_3([&] { dst.copy_(src); }, /*cpu_clock=*/true);
    rates[2] = 2.0 * 4.0 * static_cast<double>(n) / t;  // read + written, as kernels/cost.h counts
    const auto pts = gemm_efficiency_points(rates[0]);
    for (int i = 0; i < kEff; ++i) rates[static_cast<size_t>(3 + i)] = pts[static_cast<size_t>(i)].second;
    rates[static_cast<size_t>(3 + kEff)] = optimizer_bandwidth();
  }
  if (k > 1) {
    DeviceMesh all(Shape{k}, {"world"});
    quiet_wait(all.comm().barrier_async());
    Tensor r = from_vector<double>(rates, Shape{4 + kEff});
    all.comm().broadcast(r, 0);
    rates = r.to_vector<double>();
  }
  hw.gemm_flops_f32 = rates[0];
  hw.gemm_flops_bf16 = rates[1];
  hw.memory_bandwidth = rates[2];
  for (int i = 0; i < kEff; ++i) hw.gemm_efficiency.emplace_back(kGemmDimBound[i], rates[static_cast<size_t>(3 + i)]);
  hw.optimizer_bandwidth = rates[static_cast<size_t>(3 + kEff)];
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
        "calibrated by `meshtrain plan --calibrate` on {} ranks of this host: f32 GEMM n=384 and its efficiency "
        "at thin dims 8-512 (a linear layer's three products), a 64 MiB copy, AdamW over 8 M elements, "
        "MPI all_reduce of 4 B and 16 MiB, the host time per kernel call and the memory-bound kernels' bandwidth "
        "fitted on llama-tiny training steps of 64 and 16 tokens, per DTensor redistribution on a timed Shard(0) -> "
        "Replicate, per DTensor op dispatch and per blocking collective on llama-tiny steps under the data-parallel "
        "and ZeRO-3 plans over all ranks, per DTensor op on a one-rank mesh on each rank's own data-parallel step, "
        "and {} compute slots (cores / OpenMP threads per rank)", k, hw.compute_slots);
  } else {
    // A world of one has no peers to time: a collective is taken as a copy through shared memory.
    hw.intra.alpha_s = 5e-6;
    hw.intra.bandwidth = hw.memory_bandwidth / 2;
    hw.description = "calibrated by `meshtrain plan --calibrate` in a world of one: GEMM (n=384 and thin dims 8-512), copy, AdamW, per-kernel, per-redistribution and "
                     "per-DTensor-op (one-rank data-parallel and ZeRO-3 plan steps) overheads timed; "
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
    const StepFits sf = fit_step_overheads(hw);
    GradMode::set(prev);
    notes.push_back(sf.kernel.note);
    notes.push_back(fr.note);
    notes.push_back(sf.dist_op.note);
    if (!sf.local_dist_op.note.empty()) notes.push_back(sf.local_dist_op.note);
    std::vector<double> fit{sf.kernel.per_call_s, sf.dist_op.per_call_s, fr.per_call_s, sf.collective.per_call_s,
                            sf.cpu_share, sf.local_dist_op.per_call_s, sf.kernel_bandwidth};
    fit.insert(fit.end(), sf.step_gemm_efficiency.begin(), sf.step_gemm_efficiency.end());
    if (k > 1) {
      DeviceMesh all(Shape{k}, {"world"});
      Tensor f = from_vector<double>(fit, Shape{static_cast<int64_t>(fit.size())});
      all.comm().broadcast(f, 0);
      fit = f.to_vector<double>();
    }
    hw.kernel_overhead_s = fit[0];
    hw.dist_op_overhead_s = fit[1];
    // The redistribution's own kernel calls are charged the per-kernel overhead apart.
    hw.redistribute_overhead_s = std::max(0.0, fit[2] - fr.kernels_per_call * fit[0]);
    hw.collective_overhead_s = fit[3];
    hw.cpu_share = fit[4];
    hw.local_dist_op_overhead_s = fit[5];
    hw.kernel_bandwidth = fit[6];
    merge_step_efficiency(hw, std::vector<double>(fit.begin() + 7, fit.end()));
  }
  if (w.rank() == 0) {
    try {
      write_file_atomically(out, [&](std::ostream& f) { f << hardware_profile_json(hw); });
    } catch (const Error& e) {
      MT_FAIL("meshtrain plan --calibrate: --out: {}", e.what());
    }
    fmt::print("{}", hardware_profile_json(hw));
    for (const std::string& n : notes) fmt::print("# rank 0 fit, {}\n", n);
    fmt::print("# wrote {}\n", out);
  }
  return 0;
}

}  // namespace mt::cli
