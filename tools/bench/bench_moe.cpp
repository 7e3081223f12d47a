// Expert parallelism with a token all-to-all (plans/mixtral_ep_tp.plan, plans/mixtral_ep.plan)
// against the replicated-token expert parallelism it replaced (tools/bench/plans/
// mixtral_ep_tp_replicated.plan), measured in the same run: training steps per second, bytes moved
// per step by collective kind and mesh dims (forward, backward and gradient reduction), and the
// fewest / most rows any expert got. `mpirun -np N ./bench_moe [plans_dir] [bench_plans_dir]
// [steps] [batch] [seq]` (N = 2 or 4; mixtral-tiny).
#include <chrono>
#include <optional>
#include <string>

#include "mesh/collective_count.h"
#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "plan/grad_reducer.h"
#include "plan/parallelize.h"
#include "runtime/error.h"
#include "tensor/moe.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tools/bench/bench_world.h"

using namespace mt;

namespace {

struct Result {
  double step_s = 0;
  CollectiveCounts counts;  // one step
  int64_t rows_min = 0, rows_max = 0;
};

Result run(const std::string& path, const ModelConfig& cfg, int steps, int64_t B, int64_t T) {
  Plan plan = load_plan(path);
  PlanMesh pm = plan.resolve_mesh(world().size());
  DeviceMesh mesh(pm.shape, pm.names);
  std::shared_ptr<CausalLM> model = bench::build_model(cfg, bench::Materialize::kOnMeta);
  Parallelized par = parallelize(*model, plan, mesh);
  GradReducer reducer(*model, mesh);
  AdamW opt(make_param_groups(model->named_parameters(), 0.01), AdamWOptions{});
  Generator g(7);
  Result r;
  r.step_s = 1e30;
  for (int s = 0; s <= steps; ++s) {
    Tensor t = randint(0, cfg.vocab_size, {B, T + 1}, DType::kI64, &g);
    Placements ps = par.input_placements("model");
    Tensor ids = distribute_tensor(t.narrow(1, 0, T).contiguous(), mesh, ps);
    Tensor tg = distribute_tensor(t.narrow(1, 1, T).contiguous(), mesh, ps);
    bench::world_barrier();
    std::optional<CollectiveCountScope> count;
    if (s == steps) count.emplace();
    auto t0 = std::chrono::steady_clock::now();
    model->loss(ids, tg).backward();
    reducer.finish();
    opt.step();
    opt.zero_grad();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (count) r.counts = CollectiveCountScope::counts();
    if (s > 0) r.step_s = std::min(r.step_s, sec);
  }
  bool first = true;
  for (auto& [p, m] : model->named_modules()) {
    const auto* moe = dynamic_cast<const MoeModule*>(m.get());
    if (!moe) continue;
    for (int64_t n : moe->tokens_per_expert()) {
      r.rows_min = first ? n : std::min(r.rows_min, n);
      r.rows_max = first ? n : std::max(r.rows_max, n);
      first = false;
    }
  }
  return r;
}

std::string counts_str(const CollectiveCounts& c) {
  std::string s;
  for (const auto& [k, t] : c) s += fmt::format("{}{}@{} {} x {:.1f} KiB", s.empty() ? "" : ", ", k.kind, k.dims, t.calls,
                                                static_cast<double>(t.bytes) / 1024 / static_cast<double>(t.calls));
  return s.empty() ? "none" : s;
}

int64_t total_bytes(const CollectiveCounts& c) {
  int64_t b = 0;
  for (const auto& [k, t] : c) b += t.bytes;
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string plans = argc > 1 ? argv[1] : "plans";
  const std::string bench_plans = argc > 2 ? argv[2] : "tools/bench/plans";
  const int steps = argc > 3 ? std::stoi(argv[3]) : 5;
  const int64_t B = argc > 4 ? std::stoll(argv[4]) : 8, T = argc > 5 ? std::stoll(argv[5]) : 64;
  const bool root = world().rank() == 0;
  ModelConfig cfg = builtin_config("mixtral-tiny");
  if (world().size() > 2) cfg.num_key_value_heads = cfg.num_attention_heads;  // tp=2 x ep=2 at np 4
  const Result base = run(bench_plans + "/mixtral_ep_tp_replicated.plan", cfg, steps, B, T);
  const Result a2a = run(plans + "/mixtral_ep_tp.plan", cfg, steps, B, T);
  const Result ep = run(plans + "/mixtral_ep.plan", cfg, steps, B, T);
  if (!root) return 0;
  fmt::print("mixtral-tiny, np {}, global batch {} x {}, best of {} steps (rank 0)\n", world().size(), B, T, steps);
  auto line = [&](const char* name, const Result& r) {
    fmt::print("  {:<26} {:7.2f} steps/s ({:.2f}x the replicated baseline) | {:8.1f} KiB moved per step by rank 0 "
               "({:.2f}x) | expert rows {}-{}\n    {}\n",
               name, 1 / r.step_s, base.step_s / r.step_s, static_cast<double>(total_bytes(r.counts)) / 1024,
               static_cast<double>(total_bytes(r.counts)) / static_cast<double>(std::max<int64_t>(1, total_bytes(base.counts))),
               r.rows_min, r.rows_max, counts_str(r.counts));
  };
  line("replicated tokens (ep x tp)", base);
  line("mixtral_ep_tp (all_to_all)", a2a);
  line("mixtral_ep (all_to_all)", ep);
  return 0;
}
