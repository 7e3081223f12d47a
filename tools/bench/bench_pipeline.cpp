// Pipeline schedules (docs/pipeline.md): for GPipe, 1F1B and interleaved 1F1B (2 chunks per stage) over the mpirun world as pp stages
// (the layers of the model split evenly), and micro-batch counts m, the forward/backward part of
// a training step (no optimizer: the schedules differ only there) timed per step, and the bubble
// fraction measured as 1 - (time in this stage's forward and backward) / (step time), averaged
// over the stages, against the ideal (p-1)/(m+p-1) (interleaved: (p-1)/(2m+p-1)) of equal stages with
// free communication. Also
// the most micro-batches whose activations a stage keeps at once (1F1B: p - stage, GPipe: m).
// Printed ratios, not timed tests. One process running the same micro-batches is the reference.
// `mpirun -np P ./bench_pipeline [steps] [batch] [seq] [layers] [hidden]`
#include <chrono>
#include <cstdlib>
#include <string>

#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/llama.h"
#include "plan/parallelize.h"
#include "plan/pipeline.h"
#include "plan/pipeline_run.h"
#include "tensor/ops.h"
#include "tensor/ops_nn.h"
#include "tensor/random.h"
#include "tools/bench/bench_world.h"

using namespace mt;

namespace {

using Clock = std::chrono::steady_clock;

Tensor ids(int64_t B, int64_t T, int64_t vocab, int64_t salt) {
  std::vector<int64_t> v(static_cast<size_t>(B * T));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7 + static_cast<size_t>(salt) * 13) % static_cast<size_t>(vocab));
  return from_vector<int64_t>(v, Shape{B, T});
}

// Best step time of one process running m micro-batches forward and backward.
double single_step(const ModelConfig& cfg, int steps, int64_t m, int64_t B, int64_t T) {
  auto model = bench::build_model(cfg, bench::Materialize::kNow);
  double best = 1e30;
  for (int s = 0; s <= steps; ++s) {
    const auto t0 = Clock::now();
    for (int64_t k = 0; k < m; ++k) div(model->loss(ids(B, T, cfg.vocab_size, k), ids(B, T, cfg.vocab_size, k + 1)),
                                        static_cast<double>(m)).backward();
    model->zero_grad();
    if (s > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::stoi(argv[1]) : 3;
  const int64_t B = argc > 2 ? std::stoll(argv[2]) : 4, T = argc > 3 ? std::stoll(argv[3]) : 64;
  ModelConfig cfg = builtin_config("llama-tiny");
  cfg.num_hidden_layers = argc > 4 ? std::stoll(argv[4]) : 8;
  cfg.hidden_size = argc > 5 ? std::stoll(argv[5]) : 256;
  cfg.intermediate_size = cfg.hidden_size * 3;
  const int p = world().size();
  const bool root = world().rank() == 0;
  const PlanMesh pm = parse_plan("mesh pp=*\nstages pp=even\n", "bench_pipeline.plan").resolve_mesh(p);
  // The world mesh with a size-1 dim for the stage meshes (as the CLI builds it).
  DeviceMesh mesh(Shape{p, 1}, {"pp", kStageDim});
  const DeviceMesh stage_mesh = mesh.select({kStageDim});
  if (root)
    fmt::print("pipeline over {} stages: llama {} layers, hidden {}, micro-batch {} x {}, best of {} steps\n"
               "| schedule | m | steps/s | vs one process | vs GPipe | bubble measured | bubble theory (p-1)/(m+p-1) | "
               "micro-batches held (stage 0) |\n|---|---|---|---|---|---|---|---|\n",
               p, cfg.num_hidden_layers, cfg.hidden_size, B, T, steps);
  for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}}) {
    const double one = root ? single_step(cfg, steps, m, B, T) : 0;
    double gpipe_s = 0;
    for (PipelineScheduleKind kind :
         {PipelineScheduleKind::kGPipe, PipelineScheduleKind::kOneFOneB, PipelineScheduleKind::kInterleaved}) {
      if (kind != PipelineScheduleKind::kGPipe && m < p) continue;
      const int64_t V = kind == PipelineScheduleKind::kInterleaved ? 2 : 1;
      if (kind == PipelineScheduleKind::kInterleaved && (m % p != 0 || cfg.num_hidden_layers % (p * V) != 0)) continue;
      Plan plan = parse_plan(fmt::format("mesh pp=*\nstages pp=even\nschedule pp={}\n",
                                         V > 1 ? "interleaved(2)" : schedule_name(kind)),
                             "bench_pipeline.plan");
      auto model = bench::build_model(cfg, bench::Materialize::kOnMeta);
      PipelineLayout layout = resolve_pipeline(plan, pm, pipeline_units_of(*model, model->pipeline_units()));
      const int64_t stage = mesh.coordinate("pp");
      const PipelineStage& st = layout.stages[static_cast<size_t>(stage)];
      prune_to_stage(*model, layout, stage);
      model->set_pipeline_span(st.first, st.last);
      Parallelized par = parallelize(*model, plan.without_pipeline(), stage_mesh);
      PipelineRunner runner(mesh, "pp", stage_mesh, kind, Device::cpu(), V);
      PipelineRunner::Step s;
      s.micros = m;
      const Placements rep(1, Placement::replicate());
      s.input = [&](int64_t k) { return distribute_tensor(ids(B, T, cfg.vocab_size, k), stage_mesh, rep); };
      s.forward = [&](int64_t k, int64_t v, const std::vector<Tensor>& x) -> std::vector<Tensor> {
        const PipelineStage& ch = layout.chunk(stage, v);
        model->set_pipeline_span(ch.first, ch.last);
        Tensor y = (*model)(std::vector<Tensor>{x[0]})[0];
        if (!runner.makes_loss(v)) return {y};
        Tensor l = cross_entropy(y, distribute_tensor(ids(B, T, cfg.vocab_size, k + 1), stage_mesh, rep));
        return {div(l, static_cast<double>(m))};
      };
      double best = 1e30, bubble = 0;
      for (int i = 0; i <= steps; ++i) {
        bench::world_barrier();
        const auto t0 = Clock::now();
        runner.run(s);
        model->zero_grad();
        bench::world_barrier();
        const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        if (i > 0 && sec < best) {
          best = sec;
          Tensor b = from_vector<double>({runner.stats().bubble()}, Shape{1});
          mesh.comm("pp").all_reduce(b);
          bubble = b.to_vector<double>()[0] / p;
        }
      }
      if (kind == PipelineScheduleKind::kGPipe) gpipe_s = best;
      int64_t live = 0, most = 0;
      for (const auto& a : pipeline_schedule(kind, p, 0, m, V)) most = std::max(most, live += a.forward ? 1 : -1);
      if (root)
        fmt::print("| {}{} | {} | {:.2f} | {:.2f}x | {:.2f}x | {:.3f} | {:.3f} | {}{} |\n", schedule_name(kind),
                   V > 1 ? "(2)" : "", m, 1 / best, one / best, gpipe_s / best, bubble,
                   bubble_fraction_theory(p, m, V), most, V > 1 ? " chunks" : "");
    }
  }
  return 0;
}
