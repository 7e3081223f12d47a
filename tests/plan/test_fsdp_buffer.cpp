// The FSDP DBuffer (plan/fsdp_buffer.h) under llama_fsdp on every rank of the world: the unit's
// parameters are views of one shard buffer at the planned offsets; one forward and backward
// run one all-gather (two with reshard after forward) and one reduce-scatter per unit, copy
// nothing outside collectives in forward and backward (zero-copy gradients); resharding
// lowers the step's peak memory without changing a gradient; the gradients equal the single-device ones
// and the per-parameter path's; a parameter whose storage was moved (as Module::to does) is
// adopted again at the next gather; a weight used twice (tied embeddings) sums in place;
// prefetching the next unit's gather changes no collective
// count and no gradient bit; each unit's reduction runs while the units before it compute, with
// the bits of completing it at once; under HSDP (llama_hsdp) each unit's gradient shard is
// all-reduced over dp once; over training steps the DBuffers make no new buffer after the first step, copy no byte,
// hold the same memory after every step, and accumulate gradients over two backwards exactly;
// activation recomputation (full and selective, also in pipeline orders) adds no gather and keeps
// the gradient bits; bias gradients are written in place too.
#include <cmath>
#include <cstdlib>

#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/llama.h"
#include "models/recompute.h"
#include "plan/fsdp_buffer.h"
#include "plan/grad_reducer.h"
#include "optim/adamw.h"
#include "plan/parallelize.h"
#include "runtime/allocator.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "testing.h"

using namespace mt;
using mt::testing::plans_dir;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

namespace {

std::shared_ptr<CausalLM> build(const ModelConfig& c, bool meta) {
  manual_seed(77);
  if (!meta) return build_causal_lm(c);
  InitDeviceGuard g(Device::meta());
  return build_causal_lm(c);
}

// One forward and backward of the global batch; the gradients as full tensors, by name.
NamedTensors grads_of(CausalLM& model, const Parallelized* par, const DeviceMesh* mesh, int64_t B, int64_t T) {
  Generator g(5);
  Tensor t = randint(0, model.config().vocab_size, {B, T + 1}, DType::kI64, &g);
  Tensor ids = t.narrow(1, 0, T).contiguous(), tg = t.narrow(1, 1, T).contiguous();
  std::unique_ptr<GradReducer> reducer;
  if (par) {
    reducer = std::make_unique<GradReducer>(model, *mesh);
    Placements ps = par->input_placements("model");
    ids = distribute_tensor(ids, *mesh, ps);
    tg = distribute_tensor(tg, *mesh, ps);
  }
  model.loss(ids, tg).backward();
  if (reducer) reducer->finish();
  NamedTensors out;
  for (auto& [name, p] : model.named_parameters()) {
    out.emplace_back(name, p.grad().is_distributed() ? full_tensor(p.grad()) : p.grad().clone());
    p.set_grad(Tensor());
  }
  return out;
}

double max_diff(const NamedTensors& a, const NamedTensors& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    REQUIRE(a[i].first == b[i].first);
    const Tensor x = a[i].second.contiguous().to(DType::kF64), y = b[i].second.contiguous().to(DType::kF64);
    REQUIRE(x.shape() == y.shape());
    const auto* px = static_cast<const double*>(x.data_ptr());
    const auto* py = static_cast<const double*>(y.data_ptr());
    for (int64_t k = 0; k < x.numel(); ++k) worst = std::max(worst, std::abs(px[k] - py[k]));
  }
  return worst;
}

// The parameters of all the plan's FSDP units.
int64_t unit_param_count(const HookIR& ir) {
  int64_t n = 0;
  for (const FsdpUnit& u : ir.fsdp_units) n += static_cast<int64_t>(u.params.size());
  return n;
}

// M micro-batches of B x T random tokens (inputs and targets), placed as the plan places the
// model's input.
struct MicroBatches {
  std::vector<Tensor> ids, tg;
};
MicroBatches micro_batches(const Parallelized& par, const DeviceMesh& mesh, int64_t vocab, int64_t M, int64_t B,
                           int64_t T, uint64_t seed) {
  Generator g(seed);
  Placements ps = par.input_placements("model");
  MicroBatches mb;
  for (int64_t m = 0; m < M; ++m) {
    Tensor t = randint(0, vocab, {B, T + 1}, DType::kI64, &g);
    mb.ids.push_back(distribute_tensor(t.narrow(1, 0, T).contiguous(), mesh, ps));
    mb.tg.push_back(distribute_tensor(t.narrow(1, 1, T).contiguous(), mesh, ps));
  }
  return mb;
}

// Runs the micro-batches in `order` ('F' the next micro-batch's forward, 'B' the oldest pending
// backward), each loss divided by their count; the gradients as full tensors (then cleared).
NamedTensors run_order(CausalLM& model, const MicroBatches& mb, const std::string& order) {
  const auto M = static_cast<double>(mb.ids.size());
  std::vector<Tensor> losses;
  size_t next_f = 0, next_b = 0;
  for (char c : order) {
    if (c == 'F') {
      losses.push_back(div(model.loss(mb.ids[next_f], mb.tg[next_f]), M));
      ++next_f;
    } else {
      losses[next_b++].backward();
    }
  }
  NamedTensors out;
  for (auto& [name, p] : model.named_parameters()) {
    out.emplace_back(name, full_tensor(p.grad()));
    p.set_grad(Tensor());
  }
  return out;
}

}  // namespace

TEST_CASE("fsdp buffer: one collective per unit, no forward copies, single-device gradients", "[mpi][fsdp]") {
  const int64_t n = world().size();
  ModelConfig cfg = builtin_config("llama-tiny");
  cfg.attention_dropout = cfg.residual_dropout = 0;
  const int64_t B = 2 * n + 1, T = 8;
  auto ref = build(cfg, false);
  const NamedTensors want = grads_of(*ref, nullptr, nullptr, B, T);

  Plan plan = load_plan(plans_dir() + "/llama_fsdp.plan");
  PlanMesh pm = plan.resolve_mesh(n);
  DeviceMesh mesh(pm.shape, pm.names);
  auto model = build(cfg, true);
  Parallelized par = parallelize(*model, plan, mesh);
  const HookIR& ir = par.ir();
  REQUIRE(ir.fsdp_units.size() == static_cast<size_t>(cfg.num_hidden_layers + 1));

  // Every unit's parameters share one storage, at the planned offsets of this rank's shard.
  const int64_t rank = mesh.coordinate_shape()[0];
  int64_t unit_elements = 0;
  for (const FsdpUnit& u : ir.fsdp_units) {
    const Storage* storage = nullptr;
    int64_t base = -1;
    for (const PlacedTensor& t : u.layout.tensors) {
      const Tensor p = model->get_parameter(u.params[static_cast<size_t>(t.index)]);
      if (t.blocks_on(rank) == 0) continue;
      int64_t before = 0;
      for (int64_t r = 0; r < rank; ++r) before += t.blocks_on(r);
      const int64_t in_shard = t.offset + before * u.tensors[static_cast<size_t>(t.index)].block_numel() -
                               rank * u.layout.shard_size;
      if (!storage) {
        storage = p.impl()->storage.get();
        base = p.impl()->offset - in_shard;
      }
      INFO(u.params[static_cast<size_t>(t.index)]);
      CHECK(p.impl()->storage.get() == storage);
      CHECK(p.impl()->offset == base + in_shard);
    }
    for (const LayoutTensor& t : u.tensors) unit_elements += t.numel();
  }

  reset_fsdp_counters();
  const NamedTensors got = grads_of(*model, &par, &mesh, B, T);
  const FsdpCounters c = fsdp_counters();
  // Every unit but the root reshards after forward and gathers again for its backward.
  CHECK(c.all_gathers == 2 * static_cast<int64_t>(ir.fsdp_units.size()) - 1);
  CHECK(c.reduce_scatters == static_cast<int64_t>(ir.fsdp_units.size()));
  CHECK(c.forward_bytes_copied == 0);
  CHECK(c.adoption_bytes == 0);
  // Zero-copy gradients: every weight-gradient formula wrote straight into its unit's buffer.
  CHECK(c.backward_bytes_copied == 0);
  const int64_t unit_params = unit_param_count(ir);
  CHECK(c.zero_copy_grads == unit_params);
  // Prefetch: in the forward every layer's gather starts while the unit before it computes (the
  // root's is the first); in the backward every layer's but the last one's, and all are used.
  const int64_t layers = cfg.num_hidden_layers;
  CHECK(c.prefetches == 2 * layers - 1);
  CHECK(c.prefetch_hits == c.prefetches);
  // Every unit's reduce-scatter was left running when its backward returned (and done when the
  // backward pass returned: the gradients below are complete).
  CHECK(c.reductions_in_flight == static_cast<int64_t>(ir.fsdp_units.size()));
  const double d = max_diff(got, want);
  if (world().rank() == 0)
    fmt::print("fsdp buffer np {}: max |grad diff| vs one device {:.2e}; {} all-gathers, {} reduce-scatters, "
               "{} bytes copied in backward, {} gradients written in place ({} unit elements)\n", n, d, c.all_gathers,
               c.reduce_scatters, c.backward_bytes_copied, c.zero_copy_grads, unit_elements);
  CHECK(d <= 1e-5);

  // A parameter moved to new storage (what Module::to does) is adopted again at the next gather.
  {
    Tensor q = model->get_parameter("model.layers.0.self_attn.q_proj.weight");
    Tensor moved = local_view(q.detach()).clone();
    TensorImpl* impl = q.impl();
    impl->storage = moved.impl()->storage;
    impl->offset = moved.offset();
  }
  reset_fsdp_counters();
  CHECK(max_diff(grads_of(*model, &par, &mesh, B, T), want) <= 1e-5);
  CHECK(fsdp_counters().adoption_bytes > 0);
  reset_fsdp_counters();
  CHECK(max_diff(grads_of(*model, &par, &mesh, B, T), want) <= 1e-5);
  CHECK(fsdp_counters().adoption_bytes == 0);  // adopted once, then zero-copy again

  // Without reshard after forward: one all-gather per unit, the same gradients, a higher peak.
  setenv("MT_FSDP_RESHARD", "0", 1);
  {
    auto model3 = build(cfg, true);
    Parallelized par3 = parallelize(*model3, plan, mesh);
    reset_fsdp_counters();
    reset_cpu_peak();
    const int64_t before_keep = cpu_memory_stats().current;
    CHECK(max_diff(grads_of(*model3, &par3, &mesh, B, T), got) == 0);
    const int64_t peak_keep = cpu_memory_stats().peak - before_keep;
    CHECK(fsdp_counters().all_gathers == static_cast<int64_t>(ir.fsdp_units.size()));
    reset_cpu_peak();
    const int64_t before_reshard = cpu_memory_stats().current;
    (void)grads_of(*model, &par, &mesh, B, T);
    const int64_t peak_reshard = cpu_memory_stats().peak - before_reshard;
    if (world().rank() == 0)
      fmt::print("fsdp buffer np {}: step peak {} B with reshard after forward, {} B without\n", n, peak_reshard,
                 peak_keep);
    if (n > 1) CHECK(peak_reshard < peak_keep);
  }
  unsetenv("MT_FSDP_RESHARD");

  // Without prefetch (MT_FSDP_PREFETCH=0): the same collectives, the same gradients bit for bit.
  setenv("MT_FSDP_PREFETCH", "0", 1);
  {
    auto model4 = build(cfg, true);
    Parallelized par4 = parallelize(*model4, plan, mesh);
    reset_fsdp_counters();
    CHECK(max_diff(grads_of(*model4, &par4, &mesh, B, T), got) == 0);
    CHECK(fsdp_counters().prefetches == 0);
    CHECK(fsdp_counters().all_gathers == 2 * static_cast<int64_t>(ir.fsdp_units.size()) - 1);
  }
  unsetenv("MT_FSDP_PREFETCH");

  // The same two choices per unit in the plan: the layers with `reshard=no prefetch=no`, the root
  // unit as before. One all-gather per unit (none again in backward, no refill) and no prefetch:
  // no layer is started ahead, and the root, which never reshards, has no regather to start. The
  // same gradients, bit for bit.
  {
    Plan per_unit = parse_plan("mesh dp=*\n"
                               "fsdp () .* dp=rows\n"
                               "fsdp model\\.layers\\.\\d+ .* dp=rows reshard=no prefetch=no\n"
                               "place model <in>:0 dp=S(0)\n"
                               "factory model rope dp=R\n",
                               "per_unit.plan");
    auto model6 = build(cfg, true);
    Parallelized par6 = parallelize(*model6, per_unit, mesh);
    reset_fsdp_counters();
    CHECK(max_diff(grads_of(*model6, &par6, &mesh, B, T), got) == 0);
    CHECK(fsdp_counters().all_gathers == static_cast<int64_t>(ir.fsdp_units.size()));
    CHECK(fsdp_counters().prefetches == 0);
    CHECK(fsdp_counters().buffer_refills == 0);
  }

  // Gradients copied in (MT_FSDP_ZERO_COPY=0, the path before zero-copy): the same bits, and the
  // counter sees each gradient copied once.
  setenv("MT_FSDP_ZERO_COPY", "0", 1);
  {
    auto model5 = build(cfg, true);
    Parallelized par5 = parallelize(*model5, plan, mesh);
    reset_fsdp_counters();
    CHECK(max_diff(grads_of(*model5, &par5, &mesh, B, T), got) == 0);
    CHECK(fsdp_counters().backward_bytes_copied == unit_elements * 4);
    CHECK(fsdp_counters().zero_copy_grads == 0);
  }
  unsetenv("MT_FSDP_ZERO_COPY");

  // Every reduction completed before its unit's backward returns (MT_FSDP_ASYNC_REDUCE=0, the
  // path before reductions in flight): the same collectives, the same bits.
  setenv("MT_FSDP_ASYNC_REDUCE", "0", 1);
  {
    auto model7 = build(cfg, true);
    Parallelized par7 = parallelize(*model7, plan, mesh);
    reset_fsdp_counters();
    CHECK(max_diff(grads_of(*model7, &par7, &mesh, B, T), got) == 0);
    CHECK(fsdp_counters().reductions_in_flight == 0);
    CHECK(fsdp_counters().reduce_scatters == static_cast<int64_t>(ir.fsdp_units.size()));
  }
  unsetenv("MT_FSDP_ASYNC_REDUCE");

  // The per-parameter path (MT_FSDP_DBUFFER=0) gives the same gradients.
  setenv("MT_FSDP_DBUFFER", "0", 1);
  auto model2 = build(cfg, true);
  {
    Parallelized par2 = parallelize(*model2, plan, mesh);
    reset_fsdp_counters();
    CHECK(max_diff(grads_of(*model2, &par2, &mesh, B, T), got) <= 1e-6);
    CHECK(fsdp_counters().all_gathers == 0);
  }
  unsetenv("MT_FSDP_DBUFFER");
}

// Tied embeddings (llama-1b's layout on llama-tiny): the root unit's embedding is also the head, so
// its gradient has two terms in one backward. The head's GEMM writes into the unit's gradient
// buffer, the engine adds the lookup's term there in place: nothing is copied in, with the bits of
// copying the engine's sum in (MT_FSDP_ZERO_COPY=0).
TEST_CASE("fsdp buffer: a weight used twice (tied embeddings) sums in place", "[mpi][fsdp]") {
  const int64_t n = world().size();
  ModelConfig cfg = builtin_config("llama-tiny");
  cfg.attention_dropout = cfg.residual_dropout = 0;
  cfg.tie_word_embeddings = true;
  const int64_t B = 2 * n + 1, T = 8;
  auto ref = build(cfg, false);
  const NamedTensors want = grads_of(*ref, nullptr, nullptr, B, T);

  Plan plan = load_plan(plans_dir() + "/llama_fsdp.plan");
  PlanMesh pm = plan.resolve_mesh(n);
  DeviceMesh mesh(pm.shape, pm.names);
  auto model = build(cfg, true);
  Parallelized par = parallelize(*model, plan, mesh);
  const int64_t unit_params = unit_param_count(par.ir());
  reset_fsdp_counters();
  const NamedTensors got = grads_of(*model, &par, &mesh, B, T);
  CHECK(fsdp_counters().backward_bytes_copied == 0);
  CHECK(fsdp_counters().zero_copy_grads == unit_params);
  const double d = max_diff(got, want);
  if (world().rank() == 0)
    fmt::print("fsdp buffer np {}, tied embeddings: max |grad diff| vs one device {:.2e}, {} bytes copied in "
               "backward\n", n, d, fsdp_counters().backward_bytes_copied);
  CHECK(d <= 1e-5);

  setenv("MT_FSDP_ZERO_COPY", "0", 1);
  {
    auto model2 = build(cfg, true);
    Parallelized par2 = parallelize(*model2, plan, mesh);
    reset_fsdp_counters();
    CHECK(max_diff(grads_of(*model2, &par2, &mesh, B, T), got) == 0);
    CHECK(fsdp_counters().backward_bytes_copied > 0);
  }
  unsetenv("MT_FSDP_ZERO_COPY");

  // The embedding in a unit of its own: the head reads it after that unit's forward has ended, so
  // the unit keeps its gathered buffer until its backward (no reshard: one all-gather, not two)
  // and the gradients are the single-device ones. (Before, its memory was freed under the head.)
  Plan own = parse_plan("mesh dp=*\n"
                        "fsdp () .* dp=rows\n"
                        "fsdp model\\.embed_tokens .* dp=rows\n"
                        "fsdp model\\.layers\\.\\d+ .* dp=rows\n"
                        "place model <in>:0 dp=S(0)\n"
                        "factory model rope dp=R\n",
                        "own.plan");
  auto model3 = build(cfg, true);
  Parallelized par3 = parallelize(*model3, own, mesh);
  const int64_t units = static_cast<int64_t>(par3.ir().fsdp_units.size());
  REQUIRE(units == cfg.num_hidden_layers + 2);
  reset_fsdp_counters();
  const double d3 = max_diff(grads_of(*model3, &par3, &mesh, B, T), want);
  if (world().rank() == 0) fmt::print("fsdp buffer np {}, tied embedding in its own unit: {:.2e}\n", n, d3);
  CHECK(d3 <= 1e-5);
  CHECK(fsdp_counters().all_gathers == 2 * units - 2);  // the root and the embedding gather once
  CHECK(fsdp_counters().backward_bytes_copied == 0);
}

TEST_CASE("hsdp: units sharded over fsdp, replicated over dp, one all-reduce per unit", "[mpi][fsdp]") {
  const int64_t n = world().size();
  if (n % 2 != 0) {
    WARN("llama_hsdp needs an even world (fsdp=2): not run at np " << n);
    return;
  }
  ModelConfig cfg = builtin_config("llama-tiny");
  cfg.attention_dropout = cfg.residual_dropout = 0;
  const int64_t B = 2 * n, T = 8;
  auto ref = build(cfg, false);
  const NamedTensors want = grads_of(*ref, nullptr, nullptr, B, T);

  Plan plan = load_plan(plans_dir() + "/llama_hsdp.plan");
  PlanMesh pm = plan.resolve_mesh(n);
  DeviceMesh mesh(pm.shape, pm.names);
  auto model = build(cfg, true);
  Parallelized par = parallelize(*model, plan, mesh);
  const int64_t units = static_cast<int64_t>(par.ir().fsdp_units.size());
  reset_fsdp_counters();
  const NamedTensors got = grads_of(*model, &par, &mesh, B, T);
  const FsdpCounters c = fsdp_counters();
  CHECK(c.reduce_scatters == units);
  CHECK(c.replica_all_reduces == units);  // each unit's gradient shard over dp, once
  CHECK(c.all_gathers == 2 * units - 1);
  // Each unit's reduce-scatter, then its all-reduce over dp, ran while the units before it computed.
  CHECK(c.reductions_in_flight == units);
  const double d = max_diff(got, want);
  if (world().rank() == 0)
    fmt::print("hsdp np {} (dp {} x fsdp {}): max |grad diff| vs one device {:.2e}; {} reduce-scatters, {} "
               "all-reduces over dp\n", n, mesh.size(0), mesh.size(1), d, c.reduce_scatters, c.replica_all_reduces);
  CHECK(d <= 1e-5);

  // Completed within each unit's backward instead (MT_FSDP_ASYNC_REDUCE=0): the same bits.
  setenv("MT_FSDP_ASYNC_REDUCE", "0", 1);
  {
    auto model2 = build(cfg, true);
    Parallelized par2 = parallelize(*model2, plan, mesh);
    reset_fsdp_counters();
    CHECK(max_diff(grads_of(*model2, &par2, &mesh, B, T), got) == 0);
    CHECK(fsdp_counters().reductions_in_flight == 0);
    CHECK(fsdp_counters().replica_all_reduces == units);
  }
  unsetenv("MT_FSDP_ASYNC_REDUCE");
}

TEST_CASE("fsdp buffer: zero-copy gradients, buffers made once, deterministic memory", "[mpi][fsdp]") {
  const int64_t n = world().size();
  ModelConfig cfg = builtin_config("llama-tiny");
  cfg.attention_dropout = cfg.residual_dropout = 0;
  const int64_t B = 2 * n, T = 8;
  Plan plan = load_plan(plans_dir() + "/llama_fsdp.plan");
  PlanMesh pm = plan.resolve_mesh(n);
  DeviceMesh mesh(pm.shape, pm.names);
  auto model = build(cfg, true);
  Parallelized par = parallelize(*model, plan, mesh);
  const HookIR& ir = par.ir();
  const int64_t unit_params = unit_param_count(ir);
  GradReducer reducer(*model, mesh);
  AdamWOptions o;
  o.lr = 1e-3;
  AdamW opt(make_param_groups(model->named_parameters(), 0.1), o);
  const MicroBatches mb = micro_batches(par, mesh, cfg.vocab_size, 1, B, T, 11);
  const Tensor& ids = mb.ids[0];
  const Tensor& tg = mb.tg[0];
  std::vector<int64_t> made, live;
  for (int step = 0; step < 4; ++step) {
    reset_fsdp_counters();
    model->loss(ids, tg).backward();
    reducer.finish();
    opt.step();
    opt.zero_grad();
    const FsdpCounters c = fsdp_counters();
    INFO("step " << step);
    CHECK(c.forward_bytes_copied == 0);
    CHECK(c.backward_bytes_copied == 0);
    CHECK(c.adoption_bytes == 0);
    CHECK(c.zero_copy_grads == unit_params);
    made.push_back(c.buffer_allocations);
    live.push_back(cpu_memory_stats().current);
  }
  // Step 1 makes each unit's gathered, gradient and gradient-shard buffers (3 per unit); later
  // steps reuse them, and the process holds the same bytes after every step.
  CHECK(made[0] == 3 * static_cast<int64_t>(ir.fsdp_units.size()));
  for (size_t k = 1; k < made.size(); ++k) {
    INFO("step " << k);
    CHECK(made[k] == 0);
    if (k >= 2) CHECK(live[k] == live[1]);
  }
  if (world().rank() == 0)
    fmt::print("fsdp buffer np {}: buffers made per step {} {} {} {}; bytes held after steps 2-4: {} {} {}\n", n,
               made[0], made[1], made[2], made[3], live[1], live[2], live[3]);

  // Two backwards without zero_grad: the second reduce-scatter goes to the scratch shard and is
  // added into .grad (which views the first), giving twice one backward's gradient.
  reset_fsdp_counters();
  model->loss(ids, tg).backward();
  reducer.finish();
  NamedTensors once, twice;
  for (auto& [name, p] : model->named_parameters()) once.emplace_back(name, full_tensor(p.grad()));
  model->loss(ids, tg).backward();
  reducer.finish();
  for (auto& [name, p] : model->named_parameters()) twice.emplace_back(name, mul(full_tensor(p.grad()), 0.5));
  CHECK(max_diff(once, twice) <= 1e-6);
  CHECK(fsdp_counters().buffer_allocations == static_cast<int64_t>(ir.fsdp_units.size()));  // the scratch shards
  CHECK(fsdp_counters().backward_bytes_copied == 0);
  opt.zero_grad();
}

// Under a pipeline schedule a unit's forward runs for micro-batch m+1 (and more) before micro-batch
// m's backward, so several of its gather nodes are alive at once (docs/fsdp.md, "Under a
// pipeline"). Three micro-batches in GPipe order (F0 F1 F2 B0 B1 B2) and in 1F1B order (F0 F1 B0
// F2 B1 B2) accumulate the same gradient bits as one after the other (F0 B0 F1 B1 F2 B2), with
// every gradient still written in place (zero-copy) and one reduce-scatter per unit and backward.
TEST_CASE("fsdp buffer: micro-batches in flight (pipeline orders) give the sequential gradients bitwise",
          "[mpi][fsdp]") {
  const int64_t n = world().size();
  ModelConfig cfg = builtin_config("llama-tiny");
  cfg.attention_dropout = cfg.residual_dropout = 0;
  const int64_t B = 2 * n, T = 8, M = 3;
  Plan plan = load_plan(plans_dir() + "/llama_fsdp.plan");
  PlanMesh pm = plan.resolve_mesh(n);
  DeviceMesh mesh(pm.shape, pm.names);
  auto model = build(cfg, true);
  Parallelized par = parallelize(*model, plan, mesh);
  const HookIR& ir = par.ir();
  const int64_t unit_params = unit_param_count(ir);
  const int64_t units = static_cast<int64_t>(ir.fsdp_units.size());
  const MicroBatches mb = micro_batches(par, mesh, cfg.vocab_size, M, B, T, 13);
  auto run = [&](const std::string& order) {
    reset_fsdp_counters();
    return run_order(*model, mb, order);
  };
  const NamedTensors seq = run("FBFBFB");
  for (const std::string order : {"FFFBBB", "FFBFBB"}) {
    INFO(order);
    const NamedTensors got = run(order);
    const FsdpCounters c = fsdp_counters();
    CHECK(max_diff(seq, got) == 0);
    CHECK(c.backward_bytes_copied == 0);
    CHECK(c.zero_copy_grads == M * unit_params);
    CHECK(c.reduce_scatters == M * units);
    if (world().rank() == 0)
      fmt::print("fsdp buffer np {}: {} vs one after the other: max diff {}; {} all-gathers, {} reduce-scatters\n", n,
                 order, max_diff(seq, got), c.all_gathers, c.reduce_scatters);
  }
}

// Activation recomputation (models/recompute.h) runs a module's forward again inside the backward,
// where no forward hook fires: the unit's gather then takes views of the buffer its backward
// regathered (no all-gather), and with selective recomputation (the feed-forward block inside a
// unit) the recomputed part's gradients join the forward node's in one reduce-scatter per unit.
// One after the other and in pipeline orders (two forwards before their backwards), full and
// selective recomputation give the gradient bits of keeping every activation, with the same
// collectives and every gradient written in place. (Until 2026-11-27 selective recomputation
// under llama_fsdp crashed, and full recomputation under a pipeline stopped with "backward
// through FsdpUnitGather a second time".)
TEST_CASE("fsdp buffer: activation recomputation gathers nothing more and gives the same gradients",
          "[mpi][fsdp]") {
  const int64_t n = world().size();
  ModelConfig cfg = builtin_config("llama-tiny");
  cfg.attention_dropout = cfg.residual_dropout = 0;
  const int64_t B = 2 * n, T = 8, M = 2;
  Plan plan = load_plan(plans_dir() + "/llama_fsdp.plan");
  PlanMesh pm = plan.resolve_mesh(n);
  DeviceMesh mesh(pm.shape, pm.names);
  auto model = build(cfg, true);
  Parallelized par = parallelize(*model, plan, mesh);
  const HookIR& ir = par.ir();
  const int64_t unit_params = unit_param_count(ir);
  const int64_t units = static_cast<int64_t>(ir.fsdp_units.size());
  const MicroBatches mb = micro_batches(par, mesh, cfg.vocab_size, M, B, T, 17);
  // nested: every layer and, inside it, its MLP (the MLP is replayed within the layer's replay's
  // backward, with views of its own).
  auto run = [&](const std::string& order, RecomputeMode mode, bool nested = false) {
    apply_recompute(*model, mode);
    if (nested)
      for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
        model->get_module(fmt::format("model.layers.{}.mlp", l))->set_recompute(Recompute::kYes);
    reset_fsdp_counters();
    NamedTensors out = run_order(*model, mb, order);
    return std::make_pair(out, fsdp_counters());
  };
  for (const std::string order : {"FBFB", "FFBB"}) {
    const auto [want, kept] = run(order, RecomputeMode::kNone);
    for (int k = 0; k < 3; ++k) {
      const RecomputeMode mode = k == 1 ? RecomputeMode::kSelective : RecomputeMode::kFull;
      const char* name = k == 0 ? "full" : k == 1 ? "selective" : "full + selective (nested)";
      INFO(order << ", recompute " << name);
      const auto [got, c] = run(order, mode, k == 2);
      CHECK(max_diff(want, got) == 0);
      CHECK(c.all_gathers == kept.all_gathers);
      CHECK(c.reduce_scatters == M * units);
      CHECK(c.backward_bytes_copied == 0);
      CHECK(c.zero_copy_grads == M * unit_params);
      if (world().rank() == 0)
        fmt::print("fsdp buffer np {}: {} with recompute {}: max diff {}; {} all-gathers ({} keeping activations), "
                   "{} reduce-scatters, {} bytes copied\n",
                   n, order, name, max_diff(want, got), c.all_gathers, kept.all_gathers,
                   c.reduce_scatters, c.backward_bytes_copied);
    }
  }
  // A module that owns a gathered parameter itself (a Linear) replays without its own hooks: refused
  // at its forward, naming it and the plan line, before anything runs.
  model->get_module("model.layers.1.mlp.down_proj")->set_recompute(Recompute::kYes);
  CHECK_THROWS_WITH(model->loss(mb.ids[0], mb.tg[0]),
                    Catch::Contains("module 'model.layers.1.mlp.down_proj' recomputes its activations") &&
                        Catch::Contains("owns parameter 'weight'") && Catch::Contains("llama_fsdp.plan:"));
  apply_recompute(*model, RecomputeMode::kNone);
  model->get_module("model.layers.1.mlp.down_proj")->set_recompute(Recompute::kNo);
}

// Biases (a config with attention_bias and mlp_bias, as Qwen2-style checkpoints have) are written
// in place too: linear's backward sums the bias gradient straight into the unit's gradient buffer
// (until 2026-11-27 each bias gradient was copied in). The gradients match one device's.
TEST_CASE("fsdp buffer: bias gradients are written in place", "[mpi][fsdp]") {
  const int64_t n = world().size();
  ModelConfig cfg = builtin_config("llama-tiny");
  cfg.attention_dropout = cfg.residual_dropout = 0;
  cfg.attention_bias = cfg.mlp_bias = true;
  const int64_t B = 2 * n + 1, T = 8;
  auto ref = build(cfg, false);
  const NamedTensors want = grads_of(*ref, nullptr, nullptr, B, T);
  Plan plan = load_plan(plans_dir() + "/llama_fsdp.plan");
  PlanMesh pm = plan.resolve_mesh(n);
  DeviceMesh mesh(pm.shape, pm.names);
  auto model = build(cfg, true);
  Parallelized par = parallelize(*model, plan, mesh);
  int64_t unit_params = 0, biases = 0;
  for (const FsdpUnit& u : par.ir().fsdp_units)
    for (const std::string& p : u.params) {
      ++unit_params;
      biases += p.size() > 5 && p.compare(p.size() - 5, 5, ".bias") == 0;
    }
  REQUIRE(biases == 7 * cfg.num_hidden_layers);  // q, k, v, o, gate, up, down
  reset_fsdp_counters();
  const NamedTensors got = grads_of(*model, &par, &mesh, B, T);
  const FsdpCounters c = fsdp_counters();
  CHECK(c.backward_bytes_copied == 0);
  CHECK(c.zero_copy_grads == unit_params);
  const double d = max_diff(got, want);
  CHECK(d <= 1e-5);
  if (world().rank() == 0)
    fmt::print("fsdp buffer np {}: with biases, {} of {} gradients in place, {} bytes copied, max |grad diff| vs one "
               "device {:.2e}\n", n, c.zero_copy_grads, unit_params, c.backward_bytes_copied, d);
}
