// FSDP training steps (docs/fsdp.md) against ZeRO-3 and one process, measured in the same run:
// llama_fsdp with its DBuffer (one all-gather and one reduce-scatter per unit), with and without
// prefetching the next unit's gather (MT_FSDP_PREFETCH=0) and with the gradients copied into the
// unit's buffer instead of written there (MT_FSDP_ZERO_COPY=0), llama_fsdp with
// per-parameter gathers (MT_FSDP_DBUFFER=0: the planner's RaggedShards through redistribute),
// llama_fsdp and llama_hsdp (even worlds) with each unit's reduction waited for before its
// backward returns (MT_FSDP_ASYNC_REDUCE=0) and left in flight (the default), and
// llama_zero3 (row-wise S(0) storage, per-parameter gathers). Per plan: steps/s and its ratio to
// one process running the whole global batch, collectives per step (calls and MiB, rank 0), the
// bytes the DBuffer copies outside collectives per step (0 + 0 on the steady path: the gradients
// are written into each unit's gradient buffer by their formulas), the DBuffer buffers made after
// the warm-up step (0: deterministic memory), and rank 0's peak host memory in the step (over what
// it held before the step) against one process's, and the process's whole peak against the
// theoretical per-rank figure of FSDP's schedule (`Theory` below; issue 11's goal: within 1.1x).
// `mpirun -np N ./bench_fsdp [plans_dir] [steps] [batch] [seq] [config]`
#include <chrono>
#include <cstdlib>
#include <map>
#include <regex>
#include <string>

#include "mesh/collective_count.h"
#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "plan/fsdp_buffer.h"
#include "plan/grad_reducer.h"
#include "plan/parallelize.h"
#include "runtime/allocator.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tools/bench/bench_world.h"

using namespace mt;

namespace {

struct StepStats {
  double seconds = 1e30;  // best step
  int64_t calls = 0, bytes = 0, forward_copied = 0, backward_copied = 0, peak = 0;
  int64_t peak_abs = 0;      // all the process holds at the step's peak (parameters, state included)
  int64_t buffers_made = 0;  // DBuffer buffers made in the timed steps (0: all made in the warm-up)
};

// Best of `steps` timed steps after one warm-up; counts from the last step.
StepStats run(CausalLM& model, const Parallelized* par, const DeviceMesh* mesh, int steps, int64_t B, int64_t T) {
  std::unique_ptr<GradReducer> reducer;
  if (par) reducer = std::make_unique<GradReducer>(model, *mesh);
  AdamW opt(make_param_groups(model.named_parameters(), 0.01), AdamWOptions{});
  Generator g(7);
  StepStats st;
  for (int s = 0; s <= steps; ++s) {
    Tensor t = randint(0, model.config().vocab_size, {B, T + 1}, DType::kI64, &g);
    Tensor ids = t.narrow(1, 0, T).contiguous(), tg = t.narrow(1, 1, T).contiguous();
    if (par) bench::world_barrier();
    CollectiveCountScope counting;
    reset_fsdp_counters();
    reset_cpu_peak();
    const int64_t before = cpu_memory_stats().current;
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
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s == 0) continue;
    st.seconds = std::min(st.seconds, sec);
    st.calls = st.bytes = 0;
    for (const auto& [key, tally] : CollectiveCountScope::counts()) {
      st.calls += tally.calls;
      st.bytes += tally.bytes;
    }
    const FsdpCounters c = fsdp_counters();
    st.forward_copied = c.forward_bytes_copied + c.adoption_bytes;
    st.backward_copied = c.backward_bytes_copied;
    st.peak = cpu_memory_stats().peak - before;
    st.peak_abs = cpu_memory_stats().peak;
    st.buffers_made += c.buffer_allocations;
  }
  return st;
}

// The theoretical per-rank peak of an FSDP step with reshard after forward and prefetch (the
// ideal that the ZeRO/FSDP papers' memory analysis describes, for f32 training with AdamW):
//   state        16 bytes per parameter / F   (parameter, gradient and two moment shards; F = the
//                                               FSDP group: the world, or the fsdp dim of HSDP)
//   activations  A(b)                          (what one process holds after the forward of the
//                                               rank's b = B / world sequences: saved tensors and
//                                               logits; measured here)
//   gathered     2 R + 3 L                     (the root unit's full parameters and gradient buffer,
//                                               held through the step; a layer unit's full
//                                               parameters twice, the current and the prefetched,
//                                               and its full gradient buffer)
// with R and L the bytes of the root unit (everything outside model.layers) and of the largest
// layer unit, as llama_fsdp and llama_hsdp lay them out. Padding and the backward's temporaries
// (gradients of activations, the softmax of the loss) are what the measured peak adds.
struct Theory {
  int64_t param_bytes = 0, root = 0, layer = 0, activations = 0;
  // f32: the parameter, gradient and two moment shards are four times the parameter bytes.
  int64_t peak(int64_t group) const { return 4 * param_bytes / group + activations + 2 * root + 3 * layer; }
};

Theory theory(CausalLM& model, int64_t rank_batch, int64_t T) {
  const ModelConfig& cfg = model.config();
  Theory th;
  std::map<std::string, int64_t> layer_bytes;
  for (const auto& [path, p] : model.named_parameters()) {
    const int64_t bytes = p.numel() * static_cast<int64_t>(dtype_size(p.dtype()));
    th.param_bytes += bytes;
    static const std::regex layer(R"(model\.layers\.(\d+)\..*)");
    std::smatch m;
    if (std::regex_match(path, m, layer))
      layer_bytes[m[1]] += bytes;
    else
      th.root += bytes;
  }
  for (const auto& [i, bytes] : layer_bytes) th.layer = std::max(th.layer, bytes);
  Generator g(7);
  Tensor t = randint(0, cfg.vocab_size, {rank_batch, T + 1}, DType::kI64, &g);
  Tensor ids = t.narrow(1, 0, T).contiguous(), tg = t.narrow(1, 1, T).contiguous();
  const int64_t before = cpu_memory_stats().current;
  Tensor loss = model.loss(ids, tg);
  th.activations = cpu_memory_stats().current - before;
  return th;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "plans";
  const int steps = argc > 2 ? std::stoi(argv[2]) : 5;
  const int64_t B = argc > 3 ? std::stoll(argv[3]) : 8, T = argc > 4 ? std::stoll(argv[4]) : 64;
  const ModelConfig cfg = resolve_config(argc > 5 ? argv[5] : "llama-tiny");
  const int n = world().size();
  const bool root = world().rank() == 0;
  StepStats single;
  Theory th;
  if (root) {
    // One process's model serves the theory's activation figure (a forward, no backward: nothing
    // it keeps) and then the one-process baseline.
    auto ref = bench::build_model(cfg, bench::Materialize::kNow);
    th = theory(*ref, (B + n - 1) / n, T);
    const double mib = 1 << 20;
    fmt::print("theoretical per-rank peak of llama_fsdp (F = {}): {:.1f} MiB = state {:.1f} (16 bytes x {} "
               "parameters / F) + activations {:.1f} (one process, batch {}) + gathered {:.1f} (2 x root unit "
               "{:.2f} + 3 x layer unit {:.2f})\n",
               n, th.peak(n) / mib, (4 * th.param_bytes / n) / mib, th.param_bytes / 4, th.activations / mib, (B + n - 1) / n,
               (2 * th.root + 3 * th.layer) / mib, th.root / mib, th.layer / mib);
    single = run(*ref, nullptr, nullptr, steps, B, T);
    fmt::print("one process: {:.2f} steps/s, peak {:.1f} MiB in the step (batch {} x {})\n", 1 / single.seconds,
               static_cast<double>(single.peak) / (1 << 20), B, T);
    fmt::print("| plan | np | steps/s | vs one process | collectives/step (rank 0) | MiB moved/step | DBuffer bytes "
               "copied/step (forward + backward) | DBuffer buffers made after step 1 | step peak vs one process | "
               "process peak MiB (one process {:.1f}) | process peak vs theoretical |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n",
               static_cast<double>(single.peak_abs) / (1 << 20));
  }
  bench::world_barrier();
  struct Case {
    const char* label;
    const char* plan;
    const char* dbuffer;   // MT_FSDP_DBUFFER
    const char* prefetch;  // MT_FSDP_PREFETCH
    const char* zero_copy = "1";  // MT_FSDP_ZERO_COPY
    const char* async = "1";      // MT_FSDP_ASYNC_REDUCE
  };
  for (const Case& c : {Case{"llama_zero3", "llama_zero3", "1", "1"},
                        Case{"llama_fsdp, per-parameter gathers", "llama_fsdp", "0", "1"},
                        Case{"llama_fsdp, DBuffer, no prefetch", "llama_fsdp", "1", "0"},
                        Case{"llama_fsdp, DBuffer + prefetch, gradients copied in", "llama_fsdp", "1", "1", "0"},
                        Case{"llama_fsdp, DBuffer + prefetch, each reduction waited for", "llama_fsdp", "1", "1", "1", "0"},
                        Case{"llama_fsdp, DBuffer + prefetch", "llama_fsdp", "1", "1"},
                        Case{"llama_hsdp, each reduction waited for", "llama_hsdp", "1", "1", "1", "0"},
                        Case{"llama_hsdp", "llama_hsdp", "1", "1"}}) {
    if (std::string(c.plan) == "llama_hsdp" && n % 2 != 0) continue;  // fsdp=2 inside dp
    setenv("MT_FSDP_ASYNC_REDUCE", c.async, 1);
    setenv("MT_FSDP_ZERO_COPY", c.zero_copy, 1);
    setenv("MT_FSDP_DBUFFER", c.dbuffer, 1);
    setenv("MT_FSDP_PREFETCH", c.prefetch, 1);
    Plan plan = load_plan(dir + "/" + c.plan + ".plan");
    PlanMesh pm = plan.resolve_mesh(n);
    DeviceMesh mesh(pm.shape, pm.names);
    auto model = bench::build_model(cfg, bench::Materialize::kOnMeta);
    StepStats st;
    {
      Parallelized par = parallelize(*model, plan, mesh);
      st = run(*model, &par, &mesh, steps, B, T);
    }
    if (root) {
      const bool dbuf = std::string(c.dbuffer) == "1" && std::string(c.plan) != "llama_zero3";
      const int64_t group = std::string(c.plan) == "llama_hsdp" ? 2 : n;
      fmt::print("| {} | {} | {:.2f} | {:.2f} | {} | {:.2f} | {} | {} | {:.2f} | {:.1f} | {:.2f} |\n", c.label, n,
                 1 / st.seconds,
                 single.seconds / st.seconds, st.calls, static_cast<double>(st.bytes) / (1 << 20),
                 dbuf ? fmt::format("{} + {}", st.forward_copied, st.backward_copied)
                      : std::string("n/a (inside redistribute)"),
                 dbuf ? fmt::format("{}", st.buffers_made) : std::string("n/a"),
                 static_cast<double>(st.peak) / static_cast<double>(std::max<int64_t>(1, single.peak)),
                 static_cast<double>(st.peak_abs) / (1 << 20),
                 static_cast<double>(st.peak_abs) / static_cast<double>(th.peak(group)));
    }
  }
  return 0;
}
