// --plan helpers for the meshtrain subcommands (see parallel.h).
#include "tools/cli/parallel.h"

#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "mesh/communicator.h"
#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "plan/check.h"
#include "runtime/error.h"
#include "tensor/module.h"
#include "tensor/ops_nn.h"
#include "tools/cli/args.h"

namespace mt::cli {

PlanContext load_plan_context(const std::string& path) {
  PlanContext ctx;
  ctx.path = path;
  ctx.rank = world().rank();
  ctx.world = world().size();
  ctx.plan = load_plan(path);
  try {
    ctx.plan_mesh = ctx.plan.resolve_mesh(ctx.world);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.find(path) != std::string::npos) throw;
    MT_FAIL("{}: {} (mpirun -np {})", path, what, ctx.world);
  }
  ctx.mesh = std::make_shared<DeviceMesh>(ctx.plan_mesh.shape, ctx.plan_mesh.names);
  if (ctx.plan.is_pipeline()) {
    // Each stage runs the plan without the pipeline dim on its own sub-mesh (docs/pipeline.md).
    ctx.full_plan = ctx.plan;
    ctx.full_mesh = ctx.plan_mesh;
    ctx.world_mesh = ctx.mesh;
    std::vector<std::string> others;
    for (const auto& n : ctx.full_mesh.names)
      if (n != ctx.full_plan.pipeline_dim()) others.push_back(n);
    if (others.empty()) {
      // `mesh pp=*`: each stage is one rank, a mesh of one dim of size 1 (Plan::without_pipeline).
      Shape shape = ctx.full_mesh.shape;
      shape.push_back(1);
      std::vector<std::string> names = ctx.full_mesh.names;
      names.push_back(kStageDim);
      ctx.world_mesh = std::make_shared<DeviceMesh>(shape, names);
      others.push_back(kStageDim);
    }
    ctx.mesh = std::make_shared<DeviceMesh>(ctx.world_mesh->select(others));
    ctx.plan = ctx.full_plan.without_pipeline();
    ctx.plan_mesh = ctx.plan.resolve_mesh(ctx.mesh->size());
    ctx.stage = ctx.world_mesh->coordinate(ctx.full_plan.pipeline_dim());
  }
  return ctx;
}

namespace {

// A pipeline plan's stages for the whole `model` (resolve_pipeline), after the model checks of
// pipelines.
PipelineLayout pipeline_of(const PlanContext& ctx, CausalLM& model) {
  return resolve_pipeline(ctx.full_plan, ctx.full_mesh, pipeline_units_of(model, model.pipeline_units()));
}

}  // namespace

void check_pipeline_accum(const PipelineLayout& layout, int64_t accum, const std::string& command,
                          const std::string& plan_path) {
  const int64_t stages = layout.size();
  MT_CHECK(layout.schedule != PipelineScheduleKind::kOneFOneB || accum >= stages,
           "meshtrain {}: --accum {} gives fewer micro-batches than the {} pipeline stages of {}: 1F1B needs at "
           "least one per stage (raise --accum, or 'schedule {}=gpipe' in the plan)",
           command, accum, stages, plan_path, layout.dim);
  MT_CHECK(layout.schedule != PipelineScheduleKind::kInterleaved || accum % stages == 0,
           "meshtrain {}: --accum {} is not a multiple of the {} pipeline stages of {}: interleaved 1F1B runs the "
           "micro-batches in groups of one per stage", command, accum, stages, plan_path);
}

void check_plan_on_meta(const PlanContext& ctx, const ModelConfig& cfg, int64_t batch, int64_t seq,
                        const std::string& command, const std::string& source, int64_t accum) {
  std::shared_ptr<CausalLM> model;
  {
    InitDeviceGuard meta(Device::meta());
    model = build_causal_lm(cfg);
  }
  if (ctx.is_pipeline()) {
    const PipelineLayout layout = pipeline_of(ctx, *model);
    if (accum > 0) check_pipeline_accum(layout, accum, command, ctx.path);
  }
  // A pipeline stage runs ctx.plan (without the pipeline dim) on its modules: lowered here on
  // every stage's modules at once, as parallelize_run does.
  const HookIR ir = lower(ctx.plan, *model, *ctx.mesh);
  check_input_split(ir, ctx, batch, seq, command, source);
  // Then one forward on meta under the plan: what only the ops find (these errors came from the
  // first step's forward, with MPI_Abort, until 2026-12-07).
  check_forward_on_meta(ctx.plan, ctx.plan_mesh, ir, *model, cfg, batch, seq);
}

void check_forward_on_meta(const Plan& plan, const PlanMesh& mesh, const HookIR& ir, CausalLM& model,
                           const ModelConfig& cfg, int64_t batch, int64_t seq) {
  InitDeviceGuard meta(Device::meta());
  const Tensor ids = zeros(Shape{batch, seq}, TensorOptions(DType::kI64).with_device(Device::meta()));
  check_io_shapes(plan, ir, model, {ids});
  // The training loss after each forward (the MoE router losses too, where the flags turn them
  // on), with the targets placed as the trainer places them (place_input).
  auto loss = [&ids, &cfg](const std::vector<Tensor>& out, const Parallelized& par, const DeviceMesh& sim) {
    const Placements placed = par.input_placements("model");
    try {
      (void)causal_lm_loss(cfg, out, distribute_tensor(ids, sim, placed));
    } catch (const Error& e) {
      MT_FAIL("the loss: {}; the targets are placed as the plan places the input of module 'model' ({})", e.what(),
              placements_str(placed));
    }
  };
  check_plan_forward(plan, mesh, [&]() -> std::shared_ptr<Module> { return build_causal_lm(cfg); }, {ids}, loss);
}

void agree_on_start(const std::string& command, int code, const std::function<void()>& step) {
  constexpr int kAgreementTag = 0x7a17;  // the start-up communicator's tag (no other group uses it)
  std::string error;
  try {
    step();
  } catch (const std::exception& e) {  // mt::Error, and whatever a library reading a file throws
    error = e.what();
  }
  int64_t failed = error.empty() ? 0 : 1;
  if (world().size() > 1) {
    std::vector<int> ranks(static_cast<size_t>(world().size()));
    for (int r = 0; r < world().size(); ++r) ranks[static_cast<size_t>(r)] = r;
    Communicator comm = Communicator::create(ranks, kAgreementTag, fmt::format("meshtrain {} start-up (every rank)", command));
    Tensor t = from_vector<int64_t>({failed}, Shape{1});
    comm.all_reduce(t, CommReduceOp::kMax);
    failed = t.to_vector<int64_t>()[0];
  }
  if (failed)
    throw ExitError(error.empty() ? fmt::format("meshtrain {}: stopped: another rank could not start (its error is "
                                                "above)", command)
                                  : error,
                    code, true);
}

Parallelized parallelize_run(CausalLM& model, PlanContext& ctx) {
  if (ctx.is_pipeline()) {
    const ModelConfig& cfg = model.config();
    ctx.pipeline = std::make_shared<PipelineLayout>(pipeline_of(ctx, model));
    const PipelineStage& st = ctx.pipeline->stages[static_cast<size_t>(ctx.stage)];
    // Tied embeddings: the last stage keeps the embedding too (its weight makes the logits); the
    // two copies start equal (the same init record or checkpoint tensor) and stay equal because
    // their gradients are summed over the two stages (Trainer).
    std::vector<std::string> keep;
    if (cfg.tie_word_embeddings && ctx.pipeline->size() > 1) {
      ctx.tied_param = "model.embed_tokens.weight";
      if (ctx.stage + 1 == ctx.pipeline->size()) keep.push_back("model.embed_tokens");
    }
    // Every entry is lowered on the whole (meta) model first, before pruning hides the other
    // stages: an entry may match only another stage's modules (that stage applies it, this one
    // skips it: plan/lower.cpp), but one matching nothing in the whole model is the usual error,
    // and every rank finds it here, whatever its stage.
    {
      const HookIR whole = lower(ctx.plan, model, *ctx.mesh);
      // Tied embeddings: the last stage's lm_head reads the embedding weight, but the stage never
      // runs the embedding module whose unit would gather it (without stages the head reads it
      // after the embedding ran: Module::declare_shared_use), and the two stages' units would lay
      // it out differently; refused here with the unit's plan line rather than as a shape error
      // inside the forward.
      for (const FsdpUnit& u : whole.fsdp_units)
        for (const std::string& p : u.params)
          MT_CHECK(!(cfg.tie_word_embeddings && p == "model.embed_tokens.weight"),
                   "{}: the FSDP unit {} holds the tied embedding weight {}, which lm_head also reads outside "
                   "the unit's module; tied word embeddings inside an FSDP unit are not supported (expected the "
                   "unit's parameter regex to leave it out, e.g. 'fsdp () model\\.norm\\.weight dp=rows')",
                   u.from.empty() ? ctx.path : u.from.front().str(), u.module.empty() ? "()" : u.module, p);
    }
    prune_to_stage(model, *ctx.pipeline, ctx.stage, keep);
    model.set_pipeline_span(st.first, st.last);
  }
  if (!ctx.is_pipeline()) return parallelize(model, ctx.plan, *ctx.mesh);
  // Under a pipeline the model's input is the hidden state the chunk before sent, placed as that
  // chunk's last layer left it (as in the model without stages, where no hook stands between two
  // layers), except on the first chunk, whose token ids the runner places as the plan places them
  // (place_input). So the plan's placement of the model input is left out on every stage: it
  // turned a sequence-parallel S(1) hidden state into R under pp x tp+sp until 2026-12-07 (on
  // every stage but the first, and on the first stage's later chunks under interleaving), which the
  // next layer's hooks refused in the first step.
  return parallelize(model, ctx.plan, *ctx.mesh, Device::cpu(), [](const HookRecord& r) {
    return !(r.module == "model" && r.io_input && r.io_index == 0);
  });
}

namespace {

// Names, dtypes and shapes of `t` as one line each: "name dtype d0 d1 ..".
std::string describe(const NamedTensors& t) {
  std::string s;
  for (const auto& [name, x] : t) {
    s += fmt::format("{} {}", name, static_cast<int>(x.dtype()));
    for (int64_t d : x.shape()) s += fmt::format(" {}", d);
    s += "\n";
  }
  return s;
}

// `text` of group rank `root`, on every rank of `comm` (collective).
std::string broadcast_text(Communicator& comm, int root, const std::string& text) {
  Tensor len = from_vector<int64_t>({static_cast<int64_t>(text.size())}, Shape{1});
  comm.broadcast(len, root);
  const int64_t n = len.to_vector<int64_t>()[0];
  std::vector<int64_t> chars(text.begin(), text.end());
  Tensor bytes = root == comm.rank() ? from_vector<int64_t>(chars, Shape{n}) : empty(Shape{n}, DType::kI64);
  if (n > 0) comm.broadcast(bytes, root);
  std::string got;
  for (int64_t c : bytes.to_vector<int64_t>()) got += static_cast<char>(c);
  return got;
}

}  // namespace

Communicator world_comm(const PlanContext& ctx) {
  return ctx.is_pipeline() ? ctx.world_mesh->comm() : ctx.mesh->comm();
}

int64_t max_over_job(int64_t value, const PlanContext* plan) {
  if (!plan) return value;
  Tensor t = from_vector<int64_t>({value}, Shape{1});
  world_comm(*plan).all_reduce(t, CommReduceOp::kMax);
  return t.to_vector<int64_t>()[0];
}

namespace {

// Each pipeline stage's `keys` (every rank of the pipeline dim passes its own), on every rank of
// that dim (collective).
std::vector<std::set<std::string>> keys_of_stages(const PlanContext& ctx, const std::vector<std::string>& keys) {
  Communicator comm = ctx.world_mesh->comm(ctx.full_plan.pipeline_dim());
  std::string mine;
  for (const std::string& k : keys) mine += k + "\n";
  std::vector<std::set<std::string>> held(static_cast<size_t>(comm.size()));
  for (int s = 0; s < comm.size(); ++s) {
    std::istringstream lines(broadcast_text(comm, s, s == comm.rank() ? mine : ""));
    for (std::string line; std::getline(lines, line);) held[static_cast<size_t>(s)].insert(line);
  }
  return held;
}

}  // namespace

std::set<std::string> keys_over_stages(const PlanContext& ctx, const std::vector<std::string>& keys) {
  if (!ctx.is_pipeline()) return {keys.begin(), keys.end()};
  std::set<std::string> out;
  for (const std::set<std::string>& held : keys_of_stages(ctx, keys)) out.insert(held.begin(), held.end());
  return out;
}

std::vector<std::vector<int64_t>> stages_holding(const PlanContext& ctx, const std::vector<std::string>& keys) {
  if (!ctx.is_pipeline()) return std::vector<std::vector<int64_t>>(keys.size(), std::vector<int64_t>{0});
  Communicator comm = ctx.world_mesh->comm(ctx.full_plan.pipeline_dim());
  const std::vector<std::set<std::string>> held = keys_of_stages(ctx, keys);
  std::vector<std::vector<int64_t>> out;
  for (const std::string& k : keys) {
    std::vector<int64_t> stages;
    for (int s = 0; s < comm.size(); ++s)
      if (held[static_cast<size_t>(s)].count(k)) stages.push_back(s);
    out.push_back(std::move(stages));
  }
  return out;
}

NamedTensors gather_stages(const PlanContext& ctx, const NamedTensors& tensors) {
  NamedTensors mine = mt::full_tensors(tensors);
  for (auto& [name, t] : mine) t = t.detach().to(Device::cpu());
  if (!ctx.is_pipeline()) return mine;
  Communicator comm = ctx.world_mesh->comm(ctx.full_plan.pipeline_dim());
  NamedTensors out;
  std::set<std::string> seen;
  for (int s = 0; s < comm.size(); ++s) {
    const std::string got = broadcast_text(comm, s, s == comm.rank() ? describe(mine) : "");
    size_t i = 0;
    std::istringstream lines(got);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream f(line);
      std::string name;
      int dtype = 0;
      f >> name >> dtype;
      Shape shape;
      int64_t d = 0;
      while (f >> d) shape.push_back(d);
      Tensor t = s == comm.rank() ? mine[i].second.contiguous() : empty(shape, static_cast<DType>(dtype));
      comm.broadcast(t, s);
      // A name every stage holds (the optimizer's "step") is kept once.
      if (seen.insert(name).second) out.emplace_back(name, t);
      ++i;
    }
  }
  return out;
}

void quiet_non_root(const PlanContext& ctx) {
  if (ctx.is_root()) return;
  std::fflush(stdout);
  if (!std::freopen("/dev/null", "w", stdout)) MT_FAIL("cannot redirect stdout of rank {}", ctx.rank);
}

void check_input_split(const HookIR& ir, const PlanContext& ctx, int64_t batch, int64_t seq,
                       const std::string& command, const std::string& source) {
  const std::string where = source.empty() ? "" : source + ": ";
  const HookRecord* dispatch = nullptr;
  for (const HookRecord& r : ir.records)
    if (r.action == HookAction::kDispatch) dispatch = &r;
  for (const HookRecord& r : ir.records) {
    if (r.hook != HookPoint::kForwardPre || !r.io_input || r.module != "model" || r.io_index != 0 || !r.dst) continue;
    const Placements& ps = *r.dst;
    const std::string line = r.from.empty() ? ctx.path : r.from.back().str();
    int64_t batch_ways = 1, batch_dims = 0;
    std::string batch_names;
    for (size_t d = 0; d < ps.size(); ++d) {
      const Placement& p = ps[d];
      const int64_t k = ctx.mesh->size(static_cast<int>(d));
      const std::string name = ctx.mesh->names()[d];
      if (p.splits() && p.dim() == 0 && k > 1) {
        batch_ways *= k;
        batch_names += (batch_dims++ ? " x " : "") + name;
      }
      if (!(p.splits() && p.dim() == 1 && p.mirrored())) continue;
      MT_CHECK(seq % (2 * k) == 0,
               "meshtrain {}: {}{} {} is not divisible by 2 x {} = {}: the load-balanced sequence layout {}={} ({}) "
               "cuts the sequence in 2 x {} chunks, rank r holding chunks r and {}-r (use {} multiple of {})",
               command, where, source.empty() ? "--seq" : "the input length (a line's tokens but the last)", seq,
               name, 2 * k, name, p.str(),
               line, name, 2 * k - 1, source.empty() ? "a --seq" : "an input length", 2 * k);
    }
    MT_CHECK(!dispatch || batch_dims < 2 || batch % batch_ways == 0,
             "meshtrain {}: {}{} {} is not divisible by {} = {}: the batch is split over {} ({}) and the MoE layers' "
             "token dispatch ({}) needs even shards over more than one mesh dim (use {} multiple of {})",
             command, where, source.empty() ? "--batch" : "a batch of", batch, batch_names, batch_ways, batch_names,
             line, dispatch->from.empty() ? ctx.path : dispatch->from.back().str(),
             source.empty() ? "a --batch" : "a batch", batch_ways);
  }
}

Tensor place_input(const Tensor& global, const Parallelized& par, const PlanContext& ctx) {
  return distribute_tensor(global, *ctx.mesh, par.input_placements("model"));
}

NamedTensors shard_like(const NamedTensors& full, const NamedTensors& live) {
  std::map<std::string, Tensor> by_name(full.begin(), full.end());
  NamedTensors out;
  for (const auto& [name, l] : live) {
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;
    if (!l.is_distributed()) {
      out.emplace_back(name, it->second);
      continue;
    }
    const DTensorSpec& spec = dtensor_spec(l, "--resume");
    MT_CHECK(it->second.shape() == spec.global_shape(), "--resume: checkpoint tensor {} has shape {}, expected {}",
             name, it->second.shape(), spec.global_shape());
    out.emplace_back(name, distribute_tensor(it->second.to(l.dtype()), spec.mesh(), spec.placements()));
  }
  return out;
}

double scalar_value(const Tensor& t) { return full_item(t); }

constexpr int kTiedTag = 0x7ed1;  // the tied-embedding pair's communicator

TiedPair::TiedPair(const PlanContext& ctx, Module& model, PipelineRunner& pipe, const std::string& command) {
  if (ctx.tied_param.empty() || !(pipe.is_first() || pipe.is_last())) return;
  const std::vector<int>& pp = pipe.comm().world_ranks();
  comm_ = Communicator::create({pp.front(), pp.back()}, kTiedTag, "tied embeddings (first and last pipeline stage)",
                               ctx.pipeline->dim);
  param_ = ctx.tied_param;
  // The gradient is summed over the two stages' local tensors: both must hold the same piece of
  // the weight (parallelize_run refuses it inside an FSDP unit; this catches any other sharding
  // that differs between the stages).
  const Tensor w = model.get_parameter(param_);
  std::string mine = "unsharded";
  if (w.is_distributed()) {
    mine.clear();
    for (const Placement& p : dtensor_spec(w, "tied embeddings").placements()) mine += p.str() + " ";
    mine += fmt::format("local {}", to_local(w.detach()).shape());
  }
  constexpr int64_t kLen = 512;
  std::vector<int64_t> v(kLen, 0);
  for (size_t i = 0; i < mine.size() && i < static_cast<size_t>(kLen); ++i) v[i] = mine[i];
  Tensor both = empty(Shape{2 * kLen}, DType::kI64);
  comm_.all_gather(from_vector<int64_t>(v, Shape{kLen}), both);
  std::vector<int64_t> got = both.to_vector<int64_t>();
  auto text = [&](int64_t r) {
    std::string t;
    for (int64_t i = r * kLen; i < (r + 1) * kLen && got[static_cast<size_t>(i)] != 0; ++i)
      t += static_cast<char>(got[static_cast<size_t>(i)]);
    return t;
  };
  const std::string first = text(0), last = text(1);
  MT_CHECK(first == last,
           "meshtrain {}: {}: the tied weight {} is laid out differently on the first pipeline stage ({}) and the "
           "last ({}), so its gradient cannot be summed over the two stages piece by piece; expected one layout of "
           "it on both stages",
           command, ctx.path, param_, first, last);
}

void TiedPair::sum_gradient(Module& model, int64_t stage, const std::string& command) {
  if (!defined()) return;
  Tensor g = model.get_parameter(param_).grad();
  MT_CHECK(g.defined(), "meshtrain {}: tied parameter {} got no gradient on pipeline stage {}", command, param_, stage);
  Tensor local = g.is_distributed() ? to_local(g) : g;
  comm_.all_reduce(local);
}

double pipeline_cross_entropy(PipelineRunner& pipe, const PlanContext& ctx, const Parallelized& par, CausalLM& model,
                              const std::vector<TokenBatch>& batches, bool backward) {
  std::vector<double> losses(batches.size(), 0.0);
  PipelineRunner::Step step;
  step.micros = static_cast<int64_t>(batches.size());
  step.forward_only = !backward;
  step.input = [&](int64_t m) { return place_input(batches[static_cast<size_t>(m)].inputs, par, ctx); };
  step.forward = [&](int64_t m, int64_t v, const std::vector<Tensor>& x) -> std::vector<Tensor> {
    const PipelineStage& ch = ctx.pipeline->chunk(ctx.stage, v);
    if (pipe.virtual_stages() > 1) model.set_pipeline_span(ch.first, ch.last);
    Tensor y = model(std::vector<Tensor>{x[0]})[0];  // the router logits after it are not needed here
    if (!pipe.makes_loss(v)) return {y};
    Tensor l = cross_entropy(y, place_input(batches[static_cast<size_t>(m)].targets, par, ctx));
    losses[static_cast<size_t>(m)] = scalar_value(l);
    return {l};
  };
  pipe.run(step);
  double sum = 0;
  for (double l : losses) sum += l;  // batch order
  Tensor t = from_vector<double>({sum}, Shape{1});
  pipe.comm().broadcast(t, static_cast<int>(pipe.stages() - 1));
  return t.to_vector<double>()[0];
}

}  // namespace mt::cli
