// Muon (optim/muon.h): Newton-Schulz orthogonalized Nesterov momentum for hidden 2-D matrices,
// AdamW for the rest; split matrices (FSDP) orthogonalized on one root rank each.
#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "kernels/registry.h"
#include "mesh/dtensor.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace mt {

namespace {

// Keller Jordan's quintic coefficients (https://kellerjordan.github.io/posts/muon/).
constexpr double kNsA = 3.4445, kNsB = -4.7750, kNsC = 2.0315;

// How a DTensor Muon matrix is split: -1 whole on every rank; d >= 0 split along tensor dim 0 on
// mesh dim d only (RaggedShard(0) or Shard(0): gathered to a root); kGeneral any other split
// (tensor parallelism's S(1), splits on two mesh dims: replicated, orthogonalized on every rank).
constexpr int kGeneral = -2;

int split_dim_of(const std::string& name, const Tensor& p) {
  const DTensorSpec& spec = dtensor_spec(p, "Muon");
  int dim = -1;
  for (size_t j = 0; j < spec.placements().size(); ++j) {
    const Placement& pl = spec.placements()[j];
    if (pl.is_replicate()) continue;
    MT_CHECK(!pl.is_partial(), "Muon: parameter '{}' is {}: a Partial parameter cannot be updated", name, p.desc());
    const bool rows = pl.dim() == 0 && pl.kind() != PlacementKind::kInterleavedShard;
    if (!rows || dim != -1) return kGeneral;
    dim = static_cast<int>(j);
  }
  return dim;
}

// Rows of tensor dim 0 that each rank of mesh dim `dim` holds (this rank's coordinates elsewhere).
std::vector<int64_t> rows_per_rank(const Tensor& p, int dim) {
  const DTensorSpec& spec = dtensor_spec(p, "Muon");
  const Shape mesh_shape = spec.mesh().shape();
  std::vector<int64_t> coord = spec.mesh().coordinates();
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < mesh_shape[dim]; ++r) {
    coord[static_cast<size_t>(dim)] = r;
    rows.push_back(local_layout(p.shape(), spec.placements(), mesh_shape, Shape(coord)).local_shape[0]);
  }
  return rows;
}

// A matrix split otherwise (kGeneral: over several mesh dims, or not by rows): the mesh dims that
// split it (non-Replicate, in mesh order). Its group is those dims flattened; group rank g is the
// row-major index of the coordinates over them (DeviceMesh::flatten, mesh/device_mesh.h).
struct GeneralSplit {
  std::vector<std::string> names;  // the splitting mesh dims
  Placements placements;           // the parameter's placements on them
  Shape mesh_shape;                // their sizes
  int64_t group = 1;
  std::string key;                 // names joined: one load vector per group
  // Coordinates (over the splitting dims) of group rank g.
  Shape coord(int64_t g) const {
    std::vector<int64_t> c(mesh_shape.size());
    for (size_t k = mesh_shape.size(); k-- > 0;) {
      c[k] = g % mesh_shape[k];
      g /= mesh_shape[k];
    }
    return Shape(c);
  }
};

GeneralSplit general_split(const Tensor& p) {
  const DTensorSpec& spec = dtensor_spec(p, "Muon");
  GeneralSplit gs;
  const Shape shape = spec.mesh().shape();
  for (size_t j = 0; j < spec.placements().size(); ++j) {
    if (spec.placements()[j].is_replicate()) continue;
    gs.names.push_back(spec.mesh().names()[j]);
    gs.placements.push_back(spec.placements()[j]);
    std::vector<int64_t> dims(gs.mesh_shape.begin(), gs.mesh_shape.end());
    dims.push_back(shape[static_cast<int>(j)]);
    gs.mesh_shape = Shape(dims);
    gs.group *= shape[static_cast<int>(j)];
    gs.key += (gs.key.empty() ? "" : ",") + gs.names.back();
  }
  return gs;
}

double ns_flops(int64_t rows, int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  return steps * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n);  // x x^T, A A, B x
}

}  // namespace

Tensor newton_schulz5(const Tensor& g, int steps) {
  MT_CHECK(g.dim() == 2 && g.dtype() == DType::kF32, "newton_schulz5: expected a 2-D f32 tensor, got {}", g.desc());
  NoGradGuard no_grad;
  const bool tall = g.shape()[0] > g.shape()[1];
  Tensor x = tall ? g.t().contiguous() : g.contiguous();
  const double norm = std::sqrt(sum(mul(x, x)).item());
  x = mul(x, 1.0 / (norm + 1e-7));
  for (int k = 0; k < steps; ++k) {
    Tensor a = matmul(x, x.t());
    Tensor b = add(mul(a, kNsB), mul(matmul(a, a), kNsC));
    x = add(mul(x, kNsA), matmul(b, x));
  }
  return tall ? x.t().contiguous() : x;
}

bool Muon::uses_muon(const std::string& name, const Shape& shape) {
  return shape.size() == 2 && name.find("embed") == std::string::npos && name.find("lm_head") == std::string::npos;
}

int64_t Muon::state_bytes() const {
  int64_t n = 0;
  for (const auto& [name, s] : state_)
    for (const Tensor* t : {&s.buf, &s.m, &s.v})
      if (t->defined()) n += local_view(*t).numel() * static_cast<int64_t>(dtype_size(t->dtype()));
  return n;
}

double Muon::shape_scale(int64_t rows, int64_t cols) {
  return 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
}

Muon::Muon(std::vector<ParamGroup> groups, const MuonOptions& opts)
    : Optimizer(std::move(groups), opts.lr, {}, "Muon"), opts_(opts) {
  MT_CHECK(opts.momentum >= 0 && opts.momentum < 1, "Muon: momentum {} must be in [0, 1)", opts.momentum);
  MT_CHECK(opts.ns_steps >= 1 && opts.ns_steps <= 100, "Muon: ns_steps {} must be in [1, 100]", opts.ns_steps);
  MT_CHECK(opts.beta1 >= 0 && opts.beta1 < 1 && opts.beta2 >= 0 && opts.beta2 < 1,
           "Muon: AdamW betas ({}, {}) must be in [0, 1)", opts.beta1, opts.beta2);
  MT_CHECK(std::isfinite(opts.eps) && opts.eps >= 0, "Muon: eps {} must be finite and >= 0", opts.eps);
  NamedTensors matrices;  // the Muon matrices, for the root assignment
  for (const ParamGroup& g : param_groups())
    for (const auto& [name, p] : g.params) {
      MT_CHECK(p.dtype() == DType::kF32 && local_view(p).is_contiguous(),
               "Muon: parameter '{}' is {}; Muon takes contiguous f32 parameters (keep f32 masters for 16-bit models)",
               name, p.desc());
      State s;
      s.muon = uses_muon(name, p.shape());
      s.param = p;
      if (s.muon) {
        s.buf = zeros_like(p);
        matrices.emplace_back(name, p);
      } else {
        s.m = zeros_like(p);
        s.v = zeros_like(p);
      }
      names_.push_back(name);
      state_.emplace(name, std::move(s));
    }
  RootPlan plan = plan_roots(matrices, opts.ns_steps);
  roots_ = std::move(plan.roots);
  general_ = std::move(plan.general);
}

Muon::RootPlan Muon::plan_roots(const NamedTensors& matrices, int ns_steps) {
  // Split matrices: (flops, name, group size) for the root assignment.
  struct Job {
    double flops;
    std::string name;
    int64_t group;
    std::string key;  // the group's mesh dims
  };
  std::vector<Job> jobs;
  RootPlan plan;
  for (const auto& [name, p] : matrices) {
    if (!p.is_distributed()) continue;
    const int dim = split_dim_of(name, p);
    const double flops = ns_flops(p.shape()[0], p.shape()[1], ns_steps);
    const DeviceMesh& mesh = dtensor_spec(p, "Muon").mesh();
    if (dim == kGeneral) {
      plan.general.insert(name);
      const GeneralSplit gs = general_split(p);
      jobs.push_back({flops, name, gs.group, gs.key});
    } else if (dim >= 0) {
      jobs.push_back({flops, name, mesh.shape()[dim], mesh.names()[static_cast<size_t>(dim)]});
    }
  }
  // Greedy load balancing: the costliest matrix first, each to the least loaded rank (ties: the
  // lowest rank). The same on every rank (a function of the shapes and names only).
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.flops > b.flops; });
  std::unordered_map<std::string, std::vector<double>> load;  // per group (its mesh dims)
  for (const Job& j : jobs) {
    std::vector<double>& l = load[j.key];
    if (l.empty()) l.assign(static_cast<size_t>(j.group), 0.0);
    const auto it = std::min_element(l.begin(), l.end());
    *it += j.flops;
    plan.roots[j.name] = it - l.begin();
  }
  return plan;
}

double Muon::rank_newton_schulz_flops(const NamedTensors& matrices, const RootPlan& plan, int ns_steps) {
  double flops = 0;
  for (const auto& [name, p] : matrices) {
    const double f = ns_flops(p.shape()[0], p.shape()[1], ns_steps);
    auto root = plan.roots.find(name);
    if (root == plan.roots.end()) {  // whole here: iterated on every rank
      flops += f;
      continue;
    }
    // This rank's index in the matrix's group, as finish_step's communicator numbers it.
    const DTensorSpec& spec = dtensor_spec(p, "Muon");
    int64_t me = 0;
    if (plan.general.count(name)) {
      for (size_t j = 0; j < spec.placements().size(); ++j)
        if (!spec.placements()[j].is_replicate())
          me = me * spec.mesh().shape()[static_cast<int>(j)] + spec.mesh().coordinate(static_cast<int>(j));
    } else {
      me = spec.mesh().coordinate(split_dim_of(name, p));
    }
    if (me == root->second) flops += f;
  }
  return flops;
}

double Muon::step_newton_schulz_flops() const {
  NamedTensors matrices;
  for (const std::string& name : names_)
    if (state_.at(name).muon) matrices.emplace_back(name, state_.at(name).param);
  return rank_newton_schulz_flops(matrices, {roots_, general_}, opts_.ns_steps);
}

double Muon::planned_newton_schulz_flops(const NamedTensors& params, int ns_steps) {
  NamedTensors matrices;
  for (const auto& [name, p] : params)
    if (uses_muon(name, p.shape())) matrices.emplace_back(name, p);
  return rank_newton_schulz_flops(matrices, plan_roots(matrices, ns_steps), ns_steps);
}

void Muon::update(Slot& slot, const Tensor& grad_in, double lr, double weight_decay) {
  State& s = state_.at(slot.name);
  Tensor& p = slot.param;  // local
  const Tensor grad = grad_in.is_contiguous() ? grad_in : grad_in.contiguous();
  const double decay = 1 - lr * weight_decay;
  if (!s.muon) {
    const double t = static_cast<double>(slot.steps);
    const Tensor m = local_view(s.m), v = local_view(s.v);
    AdamWParams c;
    c.param = p.view_info();
    c.grad = grad.view_info();
    c.exp_avg = m.view_info();
    c.exp_avg_sq = v.view_info();
    c.decay = decay;
    c.beta1 = opts_.beta1;
    c.beta2 = opts_.beta2;
    c.step_size = lr / (1 - std::pow(opts_.beta1, t));
    c.bc2_sqrt = std::sqrt(1 - std::pow(opts_.beta2, t));
    c.eps = opts_.eps;
    MT_KERNEL(p.device().type, adamw, c);
    bump_version(p);
    bump_version(m);
    bump_version(v);
    return;
  }
  Tensor buf = local_view(s.buf);
  buf.mul_(opts_.momentum);
  buf.add_(grad);
  const Tensor u = opts_.nesterov ? add(grad, mul(buf, opts_.momentum)) : buf;
  const int64_t rows = s.param.shape()[0], cols = s.param.shape()[1];
  const double scale = shape_scale(rows, cols);
  if (roots_.count(slot.name)) {  // split: orthogonalized on its root in finish_step()
    queued_.push_back({slot.name, p, u.contiguous(), lr, decay});
    return;
  }
  const Tensor o = newton_schulz5(u, opts_.ns_steps);  // the whole matrix is here
  ns_flops_done_ += ns_flops(rows, cols, opts_.ns_steps);
  if (weight_decay != 0) p.mul_(decay);
  p.add_(o, -lr * scale);
}

void Muon::finish_step(bool apply) {
  std::vector<Queued> q;
  q.swap(queued_);
  if (!apply || q.empty()) return;
  NoGradGuard no_grad;
  // A matrix split by rows on one mesh dim moves rows (its pieces are row ranges in rank order);
  // one split otherwise (FSDP x TP: S(0) or S(1) on tp and a RaggedShard on dp) moves each rank's
  // local block as a flat run of elements over the flattened group of its splitting dims, and the
  // root assembles the matrix from the blocks (and cuts the update into them) by the placements.
  // Either way the root's matrix is a one-hot RaggedShard of it: gathered on one rank, iterated
  // there once, the update sent back.
  struct Move {
    Communicator comm;
    std::vector<int64_t> counts, none, mine;  // rows (or elements) per rank; zeros; mine at the root
    int64_t me = 0, root = 0;
    Work gather, scatter;
    Tensor ortho;
    bool general = false;
    GeneralSplit split;
  };
  std::vector<Move> moves(q.size());
  // 1. Every rank sends its part of each matrix to that matrix's root: all the matrices'
  //    all-to-allv are started at once (the receive counts are known from the placements: no exchange).
  for (size_t i = 0; i < q.size(); ++i) {
    const State& s = state_.at(q[i].name);
    Move& mv = moves[i];
    const DTensorSpec& spec = dtensor_spec(s.param, "Muon");
    Tensor send = q[i].u;
    if (general_.count(q[i].name)) {
      mv.general = true;
      mv.split = general_split(s.param);
      mv.comm = spec.mesh().flatten(mv.split.names).comm();
      for (int64_t g = 0; g < mv.split.group; ++g)
        mv.counts.push_back(
            local_layout(s.param.shape(), mv.split.placements, mv.split.mesh_shape, mv.split.coord(g)).local_shape.numel());
      send = send.reshape(Shape{send.numel()});
    } else {
      const int dim = split_dim_of(q[i].name, s.param);
      mv.comm = spec.mesh().comm(dim);
      mv.counts = rows_per_rank(s.param, dim);
    }
    mv.me = mv.comm.rank();
    mv.root = roots_.at(q[i].name);
    mv.none.assign(mv.counts.size(), 0);
    mv.mine = mv.none;
    mv.mine[static_cast<size_t>(mv.root)] = mv.counts[static_cast<size_t>(mv.me)];
    mv.gather = mv.comm.all_to_allv_async(send, mv.mine, mv.me == mv.root ? mv.counts : mv.none);
  }
  // 2. Each root orthogonalizes its matrices as their parts arrive (the roots at the same time, the
  //    later gathers in flight meanwhile), and starts sending each rank its part of the update.
  for (size_t i = 0; i < q.size(); ++i) {
    Move& mv = moves[i];
    const Shape& shape = state_.at(q[i].name).param.shape();
    mv.gather.wait();
    const bool root = mv.me == mv.root;
    if (root) ns_flops_done_ += ns_flops(shape[0], shape[1], opts_.ns_steps);
    if (!mv.general) {
      mv.ortho = root ? newton_schulz5(mv.gather.result(), opts_.ns_steps) : empty(Shape{0, shape[1]}, q[i].u.options());
    } else if (root) {
      const Tensor flat = mv.gather.result();
      std::vector<Tensor> blocks;
      int64_t at = 0;
      for (int64_t g = 0; g < mv.split.group; ++g) {
        const Shape local =
            local_layout(shape, mv.split.placements, mv.split.mesh_shape, mv.split.coord(g)).local_shape;
        blocks.push_back(flat.narrow(0, at, local.numel()).view(local));
        at += local.numel();
      }
      const Tensor o = newton_schulz5(assemble(blocks, shape, mv.split.placements, mv.split.mesh_shape), opts_.ns_steps);
      std::vector<Tensor> parts;
      for (int64_t g = 0; g < mv.split.group; ++g)
        parts.push_back(local_shard(o, mv.split.placements, mv.split.mesh_shape, mv.split.coord(g)).reshape(Shape{-1}));
      mv.ortho = cat(parts, 0);
    } else {
      mv.ortho = empty(Shape{0}, q[i].u.options());
    }
    mv.scatter = mv.comm.all_to_allv_async(mv.ortho, root ? mv.counts : mv.none, mv.mine);
  }
  // 3. Every rank applies its part of each update as it arrives.
  for (size_t i = 0; i < q.size(); ++i) {
    Move& mv = moves[i];
    const Shape& shape = state_.at(q[i].name).param.shape();
    mv.scatter.wait();
    Tensor p = q[i].p;
    const Tensor o = mv.general ? mv.scatter.result().view(p.shape()) : mv.scatter.result();
    if (q[i].decay != 1) p.mul_(q[i].decay);
    p.add_(o, -q[i].lr * shape_scale(shape[0], shape[1]));
  }
}

NamedTensors Muon::own_state() const {
  NamedTensors own;
  for (const std::string& name : names_) {
    const State& s = state_.at(name);
    if (s.muon) {
      own.emplace_back("momentum_buffer." + name, s.buf);
    } else {
      own.emplace_back("exp_avg." + name, s.m);
      own.emplace_back("exp_avg_sq." + name, s.v);
    }
  }
  return own;
}

NamedTensors Muon::state_dict() const { return state_dict_with(own_state()); }

void Muon::load_state_dict(const NamedTensors& state) { load_state_dict_with(state, own_state()); }

}  // namespace mt
