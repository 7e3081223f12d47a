// Training steps per second of a model under every stock plan that fits the world, against the
// single-device run of the same global batch measured in this run (rank 0 alone, the other ranks
// waiting). `mpirun -np N ./bench_plans [plans_dir] [steps] [batch] [seq]`.
#include <chrono>
#include <string>

#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "plan/grad_reducer.h"
#include "plan/parallelize.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tools/bench/bench_world.h"

using namespace mt;

namespace {

// Seconds per step (best of the timed steps, after one warm-up step).
double time_steps(CausalLM& model, const Parallelized* par, const DeviceMesh* mesh, int steps, int64_t B,
                  int64_t T, int64_t* collectives) {
  std::unique_ptr<GradReducer> reducer;
  if (par) reducer = std::make_unique<GradReducer>(model, *mesh);
  AdamW opt(make_param_groups(model.named_parameters(), 0.01), AdamWOptions{});
  Generator g(7);
  double best = 1e30;
  for (int s = 0; s <= steps; ++s) {
    Tensor t = randint(0, model.config().vocab_size, {B, T + 1}, DType::kI64, &g);
    Tensor ids = t.narrow(1, 0, T).contiguous(), tg = t.narrow(1, 1, T).contiguous();
    if (par) bench::world_barrier();
    auto t0 = std::chrono::steady_clock::now();
    if (par) {
      Placements ps = par->input_placements("model");
      ids = distribute_tensor(ids, *mesh, ps);
      tg = distribute_tensor(tg, *mesh, ps);
    }
    model.loss(ids, tg).backward();
    if (reducer) reducer->finish();
    opt.step();
    opt.zero_grad();
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::min(best, sec);
  }
  if (collectives) *collectives = reducer ? reducer->stats().collectives : 0;
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "plans";
  const int steps = argc > 2 ? std::stoi(argv[2]) : 5;
  const int64_t B = argc > 3 ? std::stoll(argv[3]) : 8, T = argc > 4 ? std::stoll(argv[4]) : 64;
  const int n = world().size();
  const bool root = world().rank() == 0;
  for (const std::string name : {"llama_dp", "llama_tp", "llama_tp_sp", "llama_dp_tp", "llama_zero3", "llama_fsdp",
                                 "llama_fsdp_tp", "mixtral_ep_tp", "mixtral_fsdp_ep"}) {
    Plan plan = load_plan(dir + "/" + name + ".plan");
    PlanMesh pm;
    try {
      pm = plan.resolve_mesh(n);
    } catch (const Error&) {
      continue;
    }
    ModelConfig cfg = builtin_config(name.find("mixtral") != std::string::npos ? "mixtral-tiny" : "llama-tiny");
    if (name.find("tp") != std::string::npos && n > 2) cfg.num_key_value_heads = cfg.num_attention_heads;
    double single = 0;
    if (root) {
      auto ref = bench::build_model(cfg, bench::Materialize::kNow);
      single = time_steps(*ref, nullptr, nullptr, steps, B, T, nullptr);
    }
    bench::world_barrier();
    DeviceMesh mesh(pm.shape, pm.names);
    auto model = bench::build_model(cfg, bench::Materialize::kOnMeta);
    Parallelized par = parallelize(*model, plan, mesh);
    int64_t coll = 0;
    double sec = time_steps(*model, &par, &mesh, steps, B, T, &coll);
    if (root)
      fmt::print("{:<14} np {} mesh {:<14} {:>8.2f} steps/s  (np 1: {:>7.2f} steps/s, ratio {:.2f}); gradient "
                 "collectives/step {}\n",
                 name, n, pm.str(), 1 / sec, 1 / single, single / sec, coll);
  }
  return 0;
}
