// estimate_rank: a warm-up and a measured training step on meta tensors over a simulated mesh,
// with byte, collective and kernel-cost counting (estimate.h, docs/estimate.md).
#include "plan/estimate.h"

#include <map>
#include <optional>

#include "kernels/registry.h"
#include "mesh/collective_count.h"
#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/shard_layout.h"
#include "plan/grad_reducer.h"
#include "plan/parallelize.h"
#include "plan/pipeline.h"
#include "plan/pipeline_run.h"
#include "tensor/ops_pointwise.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/meta_memory.h"

namespace mt {
namespace {

int64_t bytes_of(const Shape& s, DType dt) { return s.numel() * static_cast<int64_t>(dtype_size(dt)); }

void add_scaled(CollectiveCounts& into, const CollectiveCounts& part, int64_t times) {
  for (const auto& [k, t] : part) {
    CollectiveTally& d = into[k];
    d.calls += t.calls * times;
    d.bytes += t.bytes * times;
    d.group_size = std::max(d.group_size, t.group_size);
  }
}

void add_scaled(KernelCost& into, const KernelCost& part, int64_t times) {
  const double x = static_cast<double>(times);
  into.matmul_flops += part.matmul_flops * x;
  for (int b = 0; b < kGemmDimBuckets; ++b) into.matmul_flops_by_dim[b] += part.matmul_flops_by_dim[b] * x;
  into.matmul_bytes += part.matmul_bytes * x;
  into.other_bytes += part.other_bytes * x;
  into.optimizer_bytes += part.optimizer_bytes * x;
  into.kernels += part.kernels * times;
  into.matmuls += part.matmuls * times;
  into.dist_ops += part.dist_ops * times;
  into.redistributes += part.redistributes * times;
  into.blocking_collectives += part.blocking_collectives * times;
}

}  // namespace

int64_t rank_of(const PlanMesh& mesh, const std::vector<int64_t>& coord) {
  int64_t r = 0;
  for (int d = 0; d < mesh.ndim(); ++d) r = r * mesh.shape[d] + coord[static_cast<size_t>(d)];
  return r;
}

std::vector<std::vector<int64_t>> estimate_coordinates(const PlanMesh& mesh, int64_t all_up_to) {
  std::vector<std::vector<int64_t>> out;
  const int64_t n = mesh.size();
  for (int64_t r = 0; r < n; ++r) {
    if (n > all_up_to && r != 0 && r != n - 1) continue;
    out.push_back(mesh.coordinate_of(r));
  }
  return out;
}

bool same_local_shapes(const RankEstimate& est, const PlanMesh& mesh, const std::vector<int64_t>& other) {
  // Pipeline stages hold different modules and run different schedules: never shared (the layouts
  // are the stage mesh's, not `mesh`'s).
  if (est.pipeline) return false;
  Shape a, b;
  for (int64_t v : est.coord) a.push_back(v);
  for (int64_t v : other) b.push_back(v);
  for (const auto& [shape, ps] : est.layouts)
    if (local_layout(shape, ps, mesh.shape, a).local_shape != local_layout(shape, ps, mesh.shape, b).local_shape)
      return false;
  return true;
}

namespace {
// Muon::uses_muon (optim/muon.h): 2-D, not an embedding, not the output head.
bool muon_matrix(const std::string& name, const Shape& shape) {
  return shape.size() == 2 && name.find("embed") == std::string::npos && name.find("lm_head") == std::string::npos;
}
}  // namespace

RankEstimate estimate_rank(const EstimateModel& em, const Plan& plan, const PlanMesh& pm,
                           const std::vector<int64_t>& coord, const EstimateOptions& o) {
  MT_CHECK(o.batch >= 1 && o.seq >= 1 && o.accum >= 1, "estimate: batch {}, seq {} and accum {} must be >= 1", o.batch,
           o.seq, o.accum);
  MT_CHECK(o.optimizer == "adamw" || o.optimizer == "adamw8bit" || o.optimizer == "muon",
           "estimate: --optimizer {} is not supported: the estimate models adamw, adamw8bit and muon (docs/estimate.md)",
           o.optimizer);
  const bool eight_bit = o.optimizer == "adamw8bit";
  const bool muon = o.optimizer == "muon";
  int64_t muon_elements = 0;  // local elements of the Muon matrices (their optimizer traffic differs)
  MT_CHECK(o.precision == DType::kF32 || o.precision == DType::kBF16 || o.precision == DType::kF16,
           "estimate: precision {} is not supported (f32, bf16 or f16)", o.precision);
  RankEstimate est;
  est.coord = coord;
  est.rank = rank_of(pm, coord);

  std::shared_ptr<Module> model = em.build_meta();  // outside the counting scope: nothing counted
  MT_CHECK(model != nullptr, "estimate: the model builder returned null");
  // Pipeline plans: this coordinate's stage runs the plan without the pipeline dim on its stage's
  // sub-mesh (tools/cli/parallel.cpp load_plan_context / parallelize_run, repeated here on a
  // simulated mesh): the model pruned to the stage, its span set.
  const bool pipe = plan.is_pipeline();
  Plan stage_plan = pipe ? plan.without_pipeline() : plan;
  Shape sim_shape = pm.shape;
  std::vector<std::string> sim_names = pm.names;
  std::vector<int64_t> sim_coord = coord;
  std::optional<PipelineLayout> layout;
  std::string pp_dim;
  if (pipe) {
    MT_CHECK(em.pipeline_units && em.set_span && em.forward && em.logits_loss && em.hidden > 0,
             "estimate: a pipeline plan needs the model's pipeline callbacks (EstimateModel)");
    pp_dim = plan.pipeline_dim();
    est.pipeline = true;
    sim_shape = Shape{};
    sim_names.clear();
    sim_coord.clear();
    for (int d = 0; d < pm.ndim(); ++d) {
      if (pm.names[static_cast<size_t>(d)] == pp_dim) {
        est.stage = coord[static_cast<size_t>(d)];
        continue;
      }
      sim_shape.push_back(pm.shape[d]);
      sim_names.push_back(pm.names[static_cast<size_t>(d)]);
      sim_coord.push_back(coord[static_cast<size_t>(d)]);
    }
    if (sim_shape.empty()) {  // `mesh pp=*`: each stage is one rank (a dim of size 1)
      sim_shape.push_back(1);
      sim_names.push_back(kStageDim);
      sim_coord.push_back(0);
    }
    layout = resolve_pipeline(plan, pm, pipeline_units_of(*model, em.pipeline_units(*model)));
    est.stages = layout->size();
    est.virtual_stages = layout->virtual_stages;
    est.micros = o.accum;
    MT_CHECK(layout->schedule != PipelineScheduleKind::kOneFOneB || o.accum >= est.stages,
             "estimate: --accum {} gives fewer micro-batches than the {} pipeline stages: 1F1B needs at least one per "
             "stage (raise --accum, or 'schedule {}=gpipe' in the plan)", o.accum, est.stages, pp_dim);
    MT_CHECK(layout->schedule != PipelineScheduleKind::kInterleaved || o.accum % est.stages == 0,
             "estimate: --accum {} is not a multiple of the {} pipeline stages (interleaved 1F1B)", o.accum, est.stages);
    est.bubble = bubble_fraction_theory(est.stages, o.accum, est.virtual_stages);
    est.schedule = layout->schedule;
    // Every entry against the whole model first (as parallelize_run): pruned, a stage skips the
    // entries that match only other stages' modules.
    lower(stage_plan, *model, PlanMesh{sim_names, sim_shape});
    std::vector<std::string> keep;
    if (em.tied_embeddings && est.stages > 1 && est.stage + 1 == est.stages) keep.push_back("model.embed_tokens");
    prune_to_stage(*model, *layout, est.stage, keep);
    const PipelineStage& st = layout->stages[static_cast<size_t>(est.stage)];
    em.set_span(*model, st.first, st.last);
  }
  DeviceMesh sim = DeviceMesh::simulated(sim_shape, sim_names, sim_coord);
  MetaKernelsGuard meta_kernels;
  MetaMemoryScope bytes;

  Parallelized par = parallelize(*model, stage_plan, sim, Device::meta());  // local shards, counted
  // (before the parameters become 16-bit: the optimizer works on the f32 masters)
  if (muon && em.optimizer_matmul_flops) est.optimizer_matmul_flops = em.optimizer_matmul_flops(*model);
  const bool master = o.precision != DType::kF32;
  std::vector<Tensor> state;  // master weights and optimizer moments: alive across steps
  for (auto& [name, p] : model->named_parameters()) {
    const Shape local = p.local_shape();
    est.local_params += local.numel();
    if (master && is_floating(p.dtype())) {  // the parameter becomes 16-bit; an f32 master copy stays
      Tensor cast = empty(local, TensorOptions(o.precision).with_device(Device::meta()));
      p.impl()->storage = cast.impl()->storage;
      p.impl()->dtype = o.precision;
      p.impl()->strides = cast.strides();
      p.impl()->offset = 0;
      state.push_back(empty(local, TensorOptions(DType::kF32).with_device(Device::meta())));
      est.master_bytes += bytes_of(local, DType::kF32);
    }
    est.param_bytes += bytes_of(local, p.dtype());
    // 16-bit gradients of several micro-batches summed in f32 (Tensor::set_grad_dtype, as the trainer)
    const bool f32_sum = master && o.accum > 1 && o.accum_dtype == DType::kF32 && is_floating(p.dtype());
    if (f32_sum) p.set_grad_dtype(DType::kF32);
    est.grad_bytes += bytes_of(local, f32_sum ? DType::kF32 : p.dtype());
    // 8-bit AdamW (optim/adamw8bit.h; plan/ does not see optim/, so its rule is repeated here and
    // tests/optim/test_adamw8bit.cpp checks the two agree): tensors of 4096 elements or more hold
    // two u8 codes per element and an f32 [rows, 2] absmax; smaller ones two f32 moments.
    if (muon && muon_matrix(name, p.shape())) {
      // Muon (optim/muon.h; its rule repeated here as for 8-bit AdamW, and tests/plan/
      // test_estimate.cpp checks the two agree): one f32 momentum buffer per hidden matrix.
      state.push_back(empty(local, TensorOptions(DType::kF32).with_device(Device::meta())));
      est.optimizer_bytes += bytes_of(local, DType::kF32);
      muon_elements += local.numel();
    } else if (eight_bit && p.shape().numel() >= 4096) {
      for (int m = 0; m < 2; ++m) state.push_back(empty(local, TensorOptions(DType::kU8).with_device(Device::meta())));
      const Shape am{local.empty() ? 1 : local[0], 2};
      state.push_back(empty(am, TensorOptions(DType::kF32).with_device(Device::meta())));
      est.optimizer_bytes += 2 * bytes_of(local, DType::kU8) + bytes_of(am, DType::kF32);
    } else {
      for (int m = 0; m < 2; ++m) state.push_back(empty(local, TensorOptions(DType::kF32).with_device(Device::meta())));
      est.optimizer_bytes += 2 * bytes_of(local, DType::kF32);
    }
  }
  // FSDP: each unit's shard on this rank (the parameters' storage, and the shard of gradients)
  // also holds the layout's padding: the elements of the shard no parameter covers.
  for (const FsdpUnit& u : par.ir().fsdp_units) {
    const int64_t rank = sim.coordinate(u.mesh_dim);
    int64_t held = 0;
    for (const PlacedTensor& t : u.layout.tensors)
      held += t.blocks_on(rank) * u.tensors[static_cast<size_t>(t.index)].block_numel();
    const DType dt = master ? o.precision : model->get_parameter(u.params.front()).dtype();
    const int64_t pad = (u.layout.shard_size - held) * static_cast<int64_t>(dtype_size(dt));
    est.fsdp_padding_bytes += pad;
    est.param_bytes += pad;
    est.grad_bytes += pad;
  }
  for (auto& [name, p] : model->named_parameters())
    est.layouts.emplace_back(p.shape(), dtensor_spec(p, "estimate").placements());
  GradReducerOptions ro;
  ro.bucket_bytes = o.bucket_bytes;
  GradReducer reducer(*model, sim, ro);
  const Placements in_ps = par.input_placements(o.input_module);
  est.layouts.emplace_back(Shape{o.batch, o.seq}, in_ps);
  const TensorOptions ids_opts = TensorOptions(DType::kI64).with_device(Device::meta());

  const TensorOptions act_opts = TensorOptions(o.precision).with_device(Device::meta());
  const bool tied_pair = pipe && em.tied_embeddings && est.stages > 1 && (est.stage == 0 || est.stage + 1 == est.stages);
  // The pipeline stage's share of a step, as PipelineRunner::run does it (plan/pipeline_run.cpp)
  // with the trainer's step (tools/cli/trainer.cpp pipeline_gradients): every action of the
  // stage's schedule; a forward keeps its graph (outputs) and received leaf until its backward;
  // sent tensors stay alive until the end of the run (the runner's pending sends). Messages are
  // counted as the runner's communicator counts them: a header (PipelineRunner::kHeaderElements
  // i64) and the activation per forward that does not make the loss, the gradient per backward
  // that does not take the ids. (MoE router sums carried beside the activation are not counted.)
  auto pipeline_step = [&](int64_t micros) {
    constexpr int64_t kHeader = PipelineRunner::kHeaderElements;
    const int64_t p = est.stages, V = est.virtual_stages, chunks = p * V;
    const std::string grp = pp_dim;
    // A stage's waits for its neighbours are the schedule's bubble, which the roofline charges
    // apart: its sends and receives are counted, but not as blocking collectives.
    auto p2p = [&](const char* kind, int64_t bytes) {
      OverlappedCollectiveScope bubble;
      count_collective(kind, grp, p, bytes);
    };
    auto takes_input = [&](int64_t v) { return v * p + est.stage == 0; };
    auto makes_loss = [&](int64_t v) { return v * p + est.stage == chunks - 1; };
    const Shape act_global{o.batch, o.seq, em.hidden};
    // The hidden state crosses stages with the token ids' placements on its batch and sequence dims.
    const Shape act_local = local_layout(act_global, in_ps, sim.shape(), Shape(sim_coord)).local_shape;
    std::map<std::pair<int64_t, int64_t>, Tensor> inputs, outputs;
    std::vector<Tensor> pending;
    for (const PipelineAction& a : pipeline_schedule(layout->schedule, p, est.stage, micros, V)) {
      const int64_t m = a.micro, v = a.chunk;
      if (V > 1) {
        const PipelineStage& ch = layout->chunk(est.stage, v);
        em.set_span(*model, ch.first, ch.last);
      }
      if (a.forward) {
        Tensor x, leaf;
        if (takes_input(v)) {
          x = distribute_tensor(empty(Shape{o.batch, o.seq}, ids_opts), sim, in_ps);
        } else {
          {
            Tensor h = empty(Shape{kHeader}, ids_opts);
            p2p("recv", kHeader * 8);
          }
          leaf = empty(act_local, act_opts);
          p2p("recv", leaf.numel() * static_cast<int64_t>(dtype_size(leaf.dtype())));
          leaf.requires_grad_(true);
          x = from_local(leaf, sim, in_ps, act_global);
        }
        Tensor y;
        std::vector<Tensor> ys;
        try {
          ys = em.forward(*model, x);
          y = ys.at(0);
        } catch (const Error& e) {
          if (takes_input(v)) throw;
          // The received hidden state is taken placed like the ids (above); a plan that places it
          // otherwise between stages (sequence parallelism's S(1) over tp) runs (docs/pipeline.md)
          // but is not estimated.
          MT_FAIL("{}; the estimate of a pipeline plan takes the hidden state between stages placed like the token "
                  "ids ({}), which this plan's layers do not take: not estimated (a known limit, "
                  "docs/estimate.md)", e.what(), placements_str(in_ps));
        }
        if (makes_loss(v)) {
          Tensor targets = distribute_tensor(empty(Shape{o.batch, o.seq}, ids_opts), sim, in_ps);
          y = em.logits_loss(ys, targets);
          if (micros > 1) y = div(y, static_cast<double>(micros));
        } else {
          const Tensor local = y.is_distributed() ? to_local(y.detach()) : y.detach();
          pending.push_back(empty(Shape{kHeader}, ids_opts));
          p2p("send", kHeader * 8);
          pending.push_back(local.contiguous());
          p2p("send", local.numel() * static_cast<int64_t>(dtype_size(local.dtype())));
        }
        if (!takes_input(v)) inputs[{m, v}] = leaf;
        outputs[{m, v}] = y;
      } else {
        Tensor y = outputs.at({m, v});
        outputs.erase({m, v});
        Tensor g;
        if (!makes_loss(v)) {
          const Tensor local = y.is_distributed() ? to_local(y.detach()) : y;
          g = empty(local.shape(), TensorOptions(local.dtype()).with_device(Device::meta()));
          p2p("recv", g.numel() * static_cast<int64_t>(dtype_size(g.dtype())));
          if (y.is_distributed()) {
            const DTensorSpec& spec = dtensor_spec(y, "estimate pipeline backward");
            Placements ps = spec.placements();
            for (auto& q : ps)
              if (q.is_partial()) q = Placement::replicate();
            g = from_local(g, spec.mesh(), ps, spec.global_shape());
          }
        }
        reducer.set_sync(m + 1 == micros);
        y.backward(g);
        y = Tensor();
        if (!takes_input(v)) {
          Tensor gx = inputs.at({m, v}).grad();
          inputs.erase({m, v});
          MT_CHECK(gx.defined(), "estimate: pipeline stage {}: micro-batch {}: the input got no gradient", est.stage, m);
          pending.push_back(gx.contiguous());
          p2p("send", gx.numel() * static_cast<int64_t>(dtype_size(gx.dtype())));
        }
      }
    }
    pending.clear();
    if (V > 1) em.set_span(*model, layout->stages[static_cast<size_t>(est.stage)].first,
                           layout->stages[static_cast<size_t>(est.stage)].last);
  };

  // One optimizer step: `micro` micro-batches, the last one synchronized, then what the trainer
  // does before the optimizer (16-bit: gradients cast to f32 for the masters), then zero_grad.
  auto step = [&](int64_t micro, const std::function<void()>& after_first) {
    if (pipe) {
      pipeline_step(micro);
    } else {
      for (int64_t m = 0; m < micro; ++m) {
        reducer.set_sync(m + 1 == micro);
        Tensor ids = distribute_tensor(empty(Shape{o.batch, o.seq}, ids_opts), sim, in_ps);
        Tensor targets = distribute_tensor(empty(Shape{o.batch, o.seq}, ids_opts), sim, in_ps);
        Tensor loss = em.loss(*model, ids, targets);
        loss.backward();
        if (m == 0 && after_first) after_first();
      }
    }
    reducer.finish();
    if (tied_pair) {  // the tied embedding's gradient summed over the first and last stage
      Tensor g = model->get_parameter("model.embed_tokens.weight").grad();
      if (g.defined()) {
        const Tensor local = g.is_distributed() ? to_local(g) : g;
        count_collective("all_reduce", pp_dim, 2, local.numel() * static_cast<int64_t>(dtype_size(local.dtype())));
      }
    }
    if (pipe) count_collective("broadcast", pp_dim, est.stages, 8);  // the loss sum, from the last stage
    std::vector<Tensor> master_grads;
    if (master)
      for (auto& [name, p] : model->named_parameters())
        if (p.grad().defined())
          master_grads.push_back(empty(p.local_shape(), TensorOptions(DType::kF32).with_device(Device::meta())));
    master_grads.clear();
    model->zero_grad();
  };

  // The measured step's micro-batches: the rest repeat the first (unsynchronized) one; a pipeline
  // step runs its whole schedule.
  const int64_t micro = pipe ? o.accum : std::min<int64_t>(o.accum, 2);
  // warm-up: the reducer agrees on its bucket layout (first synchronized step). With accumulation,
  // the measured step's micro-batches: what the steady state keeps between steps (an FSDP unit's
  // scratch gradient shard, made by the first accumulated backward) is then part of the
  // persistent bytes, as in a real run's second step (one micro-batch under-predicted FSDP peaks
  // with --accum > 1 by that shard until 2026-12-07).
  step(micro, nullptr);

  est.persistent_bytes = meta_memory_stats().live;
  reset_meta_peak();
  CollectiveCounts first_comm;
  KernelCost first_cost;
  {
    CollectiveCountScope comm;
    KernelCostScope cost;
    step(micro, [&] {
      first_comm = CollectiveCountScope::counts();
      first_cost = KernelCostScope::totals();
    });
    est.comm = CollectiveCountScope::counts();
    est.cost = KernelCostScope::totals();
  }
  if (o.accum > micro && !pipe) {
    add_scaled(est.comm, first_comm, o.accum - micro);
    add_scaled(est.cost, first_cost, o.accum - micro);
  }
  // The optimizer (modelled: the fused AdamW loop reads p, g, m, v and writes p, m, v in f32; a
  // 16-bit model adds the gradient cast and the master-to-model rounding).
  const double n = static_cast<double>(est.local_params);
  // 8-bit AdamW reads p, g (f32) and two u8 codes, writes p and the codes: 14 bytes, not 28.
  // Muon's matrices: p, g and the momentum read, p and the momentum written (20 bytes), and the
  // Newton-Schulz GEMMs of the matrices this rank iterates (at the full GEMM rate; their gathers
  // to the roots are not counted); AdamW for the rest.
  const double adam_n = n - static_cast<double>(muon_elements);
  est.cost.optimizer_bytes += (eight_bit ? 14 : 7 * 4) * adam_n + 5 * 4 * static_cast<double>(muon_elements) +
                          (master ? n * (2 + 4) + n * (4 + 2) : 0);
  est.cost.matmul_flops += est.optimizer_matmul_flops;
  est.peak_bytes = meta_memory_stats().peak;
  est.activation_bytes = est.peak_bytes - est.persistent_bytes;
  return est;
}

}  // namespace mt
