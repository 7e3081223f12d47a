// The estimate of `meshtrain plan --estimate` for pipeline plans (plan/estimate.h, docs/estimate.md
// "Pipeline plans") against a real pipeline step under mpirun: each rank estimates its own
// coordinate (its stage) on meta tensors, then runs the step the way `meshtrain train` runs it
// (tools/cli/parallel.cpp parallelize_run and tools/cli/trainer.cpp pipeline_gradients, repeated
// here with the same plan/ pieces: the stage sub-mesh, resolve_pipeline, prune_to_stage, the span,
// parallelize without the pipeline dim, a GradReducer, PipelineRunner::run over --accum
// micro-batches, the tied-embedding all-reduce between the first and last stage, the loss
// broadcast, AdamW) and checks
//   - the bytes alive when the step starts equal to the prediction;
//   - the host allocator's peak during the measured step within 10% of the predicted peak;
//   - the collectives counted during the step (calls and bytes per kind and mesh dims: the
//     activation and gradient sends/receives over pp, the headers, the reducer's buckets, the
//     tensor-parallel all-reduces) equal to the predicted ones.
// Prints one table row per plan and rank (docs/estimate.md).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "mesh/collective_count.h"
#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "plan/estimate.h"
#include "plan/grad_reducer.h"
#include "plan/parallelize.h"
#include "plan/pipeline.h"
#include "plan/pipeline_run.h"
#include "plan/roofline.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "mesh_testing.h"
#include "testing.h"

using namespace mt;
using mt::testing::counts_str;
using mt::testing::plans_dir;

namespace {

std::shared_ptr<CausalLM> build(const ModelConfig& c) {
  manual_seed(1234);
  InitDeviceGuard g(Device::meta());
  return build_causal_lm(c);
}

EstimateModel estimate_model(const ModelConfig& cfg) {
  EstimateModel em;
  em.build_meta = [cfg] { return std::static_pointer_cast<Module>(build(cfg)); };
  em.loss = [](Module& m, const Tensor& ids, const Tensor& t) { return static_cast<CausalLM&>(m).loss(ids, t); };
  em.pipeline_units = [](Module& m) { return static_cast<CausalLM&>(m).pipeline_units(); };
  em.set_span = [](Module& m, int64_t a, int64_t b) { static_cast<CausalLM&>(m).set_pipeline_span(a, b); };
  em.forward = [](Module& m, const Tensor& x) { return m(std::vector<Tensor>{x}); };
  em.logits_loss = [](const std::vector<Tensor>& out, const Tensor& t) { return cross_entropy(out.at(0), t); };
  em.hidden = cfg.hidden_size;
  em.tied_embeddings = cfg.tie_word_embeddings;
  return em;
}

struct Measured {
  int64_t persistent = 0, peak = 0;
  CollectiveCounts comm;
  double step_s = 0;  // best of 3 further steps (wall), printed next to the roofline's
};

constexpr int kTiedTag = 0x7ed2;

Measured run_real(const ModelConfig& cfg, const Plan& plan, const PlanMesh& pm, const EstimateOptions& o) {
  const std::string pp = plan.pipeline_dim();
  Shape shape = pm.shape;
  std::vector<std::string> names = pm.names, others;
  for (const auto& n : names)
    if (n != pp) others.push_back(n);
  if (others.empty()) {  // `mesh pp=*`: each stage one rank
    shape.push_back(1);
    names.push_back(kStageDim);
    others.push_back(kStageDim);
  }
  DeviceMesh world_mesh(shape, names);
  DeviceMesh stage_mesh = world_mesh.select(others);
  const Plan sp = plan.without_pipeline();
  std::shared_ptr<CausalLM> model = build(cfg);
  const PipelineLayout layout = resolve_pipeline(plan, pm, pipeline_units_of(*model, model->pipeline_units()));
  const int64_t stage = world_mesh.coordinate(pp);
  const bool tied = cfg.tie_word_embeddings && layout.size() > 1;
  std::vector<std::string> keep;
  if (tied && stage + 1 == layout.size()) keep.push_back("model.embed_tokens");
  prune_to_stage(*model, layout, stage, keep);
  const PipelineStage& st = layout.stages[static_cast<size_t>(stage)];
  model->set_pipeline_span(st.first, st.last);
  Measured m;
  {
    Parallelized par = parallelize(*model, sp, stage_mesh);
    GradReducerOptions ro;
    ro.bucket_bytes = o.bucket_bytes;
    GradReducer reducer(*model, stage_mesh, ro);
    AdamWOptions ao;
    ao.lr = 1e-3;
    AdamW opt(make_param_groups(model->named_parameters(), 0.0), ao);
    PipelineRunner pipe(world_mesh, pp, stage_mesh, layout.schedule, Device::cpu(), layout.virtual_stages);
    Communicator tied_comm;
    if (tied && (pipe.is_first() || pipe.is_last())) {
      const std::vector<int>& r = pipe.comm().world_ranks();
      tied_comm = Communicator::create({r.front(), r.back()}, kTiedTag, "tied embeddings (test)", pp);
    }
    const Placements in_ps = par.input_placements("model");
    auto step = [&](int s) {
      std::vector<Tensor> ids, targets;
      for (int64_t k = 0; k < o.accum; ++k) {
        Generator g(1000 + 100 * s + k);
        Tensor t = randint(0, cfg.vocab_size, {o.batch, o.seq + 1}, DType::kI64, &g);
        ids.push_back(t.narrow(1, 0, o.seq).contiguous());
        targets.push_back(t.narrow(1, 1, o.seq).contiguous());
      }
      PipelineRunner::Step ps;
      ps.micros = o.accum;
      ps.input = [&](int64_t k) { return distribute_tensor(ids[static_cast<size_t>(k)], stage_mesh, in_ps); };
      ps.forward = [&](int64_t k, int64_t v, const std::vector<Tensor>& x) -> std::vector<Tensor> {
        const PipelineStage& ch = layout.chunk(stage, v);
        if (layout.virtual_stages > 1) model->set_pipeline_span(ch.first, ch.last);
        Tensor y = (*model)(std::vector<Tensor>{x[0]})[0];
        if (!pipe.makes_loss(v)) return {y};
        Tensor loss = cross_entropy(y, distribute_tensor(targets[static_cast<size_t>(k)], stage_mesh, in_ps));
        return {o.accum > 1 ? div(loss, static_cast<double>(o.accum)) : loss};
      };
      ps.before_backward = [&](int64_t k) { reducer.set_sync(k + 1 == o.accum); };
      pipe.run(ps);
      if (layout.virtual_stages > 1) model->set_pipeline_span(st.first, st.last);
      reducer.finish();
      if (tied_comm.defined()) {
        Tensor g = model->get_parameter("model.embed_tokens.weight").grad();
        Tensor local = g.is_distributed() ? to_local(g) : g;
        tied_comm.all_reduce(local);
      }
      Tensor l = from_vector<double>({0.0}, Shape{1});
      pipe.comm().broadcast(l, static_cast<int>(pipe.stages() - 1));
      opt.step();
      opt.zero_grad();
      model->zero_grad();
    };
    step(0);
    m.persistent = cpu_memory_stats().current;
    reset_cpu_peak();
    {
      CollectiveCountScope count;
      step(1);
      m.comm = CollectiveCountScope::counts();
    }
    m.peak = cpu_memory_stats().peak;
    // Best of 3 further steps only when a profile asks for the time (MT_ESTIMATE_HARDWARE); 0 otherwise.
    const char* hw = std::getenv("MT_ESTIMATE_HARDWARE");
    m.step_s = hw && *hw ? 1e30 : 0;
    for (int s = 2; hw && *hw && s < 5; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      step(s);
      m.step_s = std::min(m.step_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return m;
}

}  // namespace

TEST_CASE("estimate: pipeline plans: predicted peak and collective bytes match a real pipeline step", "[mpi]") {
  const int np = world().size();
  if (np < 2) return;
  struct Case {
    const char* plan;
    bool tied;
  };
  const std::vector<Case> cases = {{"llama_pp", false},    {"llama_pp", true},         {"llama_pp_dp", false},
                                   {"llama_pp_tp", false}, {"llama_pp_interleaved", false},
                                   {"llama_pp_fsdp", false}, {"llama_pp_cp", false}};
  EstimateOptions o;
  o.batch = 4;
  const char* seq = std::getenv("MT_ESTIMATE_SEQ");  // larger: activations dominate the peak
  o.seq = seq && *seq ? std::atoi(seq) : 16;
  o.accum = 4;
  o.precision = DType::kF32;
  o.bucket_bytes = int64_t{1} << 16;
  // MT_ESTIMATE_HARDWARE: a profile whose roofline step time is printed next to the measured one
  // (docs/estimate.md, validation; speed is measured, not asserted).
  std::optional<HardwareProfile> hw;
  if (const char* h = std::getenv("MT_ESTIMATE_HARDWARE"); h && *h) hw = load_hardware_profile(h);
  int checked = 0;
  for (const Case& c : cases) {
    const std::string name = c.plan;
    Plan plan = load_plan(plans_dir() + "/" + name + ".plan");
    PlanMesh pm;
    try {
      pm = plan.resolve_mesh(np);
    } catch (const Error&) {
      continue;  // the mesh does not fit this world
    }
    ModelConfig cfg = builtin_config("llama-tiny");
    cfg.tie_word_embeddings = c.tied;
    if (name.find("tp") != std::string::npos) cfg.num_key_value_heads = cfg.num_attention_heads;
    const std::vector<int64_t> coord = pm.coordinate_of(world().rank());
    const RankEstimate est = estimate_rank(estimate_model(cfg), plan, pm, coord, o);
    const Measured m = run_real(cfg, plan, pm, o);
    const double err = static_cast<double>(est.peak_bytes - m.peak) / static_cast<double>(m.peak);
    int64_t comm_bytes = 0;
    bool same = est.comm.size() == m.comm.size();
    for (const auto& [k, t] : m.comm) {
      comm_bytes += t.bytes;
      same = same && est.comm.count(k) == 1 && est.comm.at(k).bytes == t.bytes && est.comm.at(k).calls == t.calls;
    }
    std::string predicted_time = "-";
    if (hw) {
      const double p = roofline(est, pm, *hw, o.precision).total_s;
      predicted_time = fmt::format("{:.4f} | {:+.0f}%", p, 100 * (p - m.step_s) / m.step_s);
    }
    // | plan | tied | np | rank (stage) | predicted peak | measured peak | error | collective bytes | equal |
    //   measured step s (best of 3) | roofline step s | roofline error |
    fmt::print("| {} | {} | {} | {} ({}) | {} | {} | {:+.2f}% | {} | {} | {:.4f} | {} |\n", name, c.tied ? "tied" : "-",
               np, world().rank(), est.stage, est.peak_bytes, m.peak, 100 * err, comm_bytes, same ? "equal" : "DIFFER",
               m.step_s, predicted_time);
    INFO("plan " << name << (c.tied ? " (tied)" : "") << " np " << np << " rank " << world().rank()
                 << ": predicted " << counts_str(est.comm) << " | counted " << counts_str(m.comm));
    CHECK(est.persistent_bytes == m.persistent);
    CHECK(std::abs(err) <= 0.10);
    CHECK(est.comm.size() == m.comm.size());
    for (const auto& [k, t] : m.comm) {
      INFO(k.kind << " over " << k.dims);
      REQUIRE(est.comm.count(k) == 1);
      CHECK(est.comm.at(k).calls == t.calls);
      CHECK(est.comm.at(k).bytes == t.bytes);
    }
    if (c.tied && (est.stage == 0 || est.stage + 1 == est.stages)) {
      CHECK(m.comm.count({"all_reduce", plan.pipeline_dim()}) == 1);
    }
    ++checked;
  }
  CHECK(checked >= 1);
}
