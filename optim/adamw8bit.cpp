// 8-bit AdamW (optim/adamw8bit.h): block-wise quantized moments updated by the `adamw8bit` kernel
// family (kernels/cpu/optim.cpp); small tensors through the f32 `adamw` kernel.
#include "optim/adamw8bit.h"

#include <algorithm>
#include <cmath>

#include "kernels/quant8.h"
#include "kernels/registry.h"
#include "mesh/dtensor.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"

namespace mt {

namespace {

// A tensor like `like` (its placements, or `placements` if given; or plain) with local shape
// `local` and global `global`.
Tensor state_tensor(const Tensor& like, const Shape& local, const Shape& global, DType dtype,
                    const Placements* placements = nullptr) {
  Tensor t = zeros(local, TensorOptions(dtype).with_device(like.device()));
  if (like.is_distributed()) {
    const DTensorSpec& spec = dtensor_spec(like, "AdamW8bit");
    t.impl()->dist = intern_spec(spec.mesh(), placements ? *placements : spec.placements(), global);
  }
  return t;
}

// How the shards of a DTensor parameter meet its blocks (checked over every mesh coordinate, so
// that all ranks agree on `shared` and so on the collectives): each shard must be one rectangle
// of the tensor; blocks are shared when a shard is cut by columns or starts or ends off a block
// edge. Fills s.shared and, for this rank, s.row_offset.
void place_blocks(const std::string& name, const Tensor& p, const DTensorSpec& spec, int64_t block_rows, bool& shared,
                  int64_t& row_offset) {
  const Placements& ps = spec.placements();
  for (const Placement& pl : ps)
    MT_CHECK(!pl.is_partial(),
             "AdamW8bit: parameter '{}' is {}: a Partial parameter has no values of its own to update; reduce it "
             "first", name, p.desc());
  const Shape shape = p.shape(), mesh_shape = spec.mesh().shape();
  const int64_t rows = shape[0];
  const std::vector<int64_t> mine = spec.mesh().coordinates();
  std::vector<int64_t> coord(mesh_shape.size(), 0);
  shared = false;
  row_offset = 0;
  for (;;) {
    const LocalLayout l = local_layout(shape, ps, mesh_shape, Shape(coord));
    MT_CHECK(l.pieces.size() <= 1,
             "AdamW8bit: parameter '{}' ({}, placements {}) has a shard of {} pieces at mesh coordinate {}: 8-bit "
             "AdamW needs each rank's shard to be one rectangle of the tensor (whole rows, or rows cut by columns; "
             "FSDP at row granularity)",
             name, p.desc(), spec.placements_str(), l.pieces.size(), Shape(coord));
    if (!l.pieces.empty()) {
      const ShardPiece& piece = l.pieces[0];
      const int64_t r0 = piece.global_offset[0], r1 = r0 + piece.sizes[0];
      bool whole_rows = true;
      for (int d = 1; d < shape.size(); ++d) whole_rows = whole_rows && piece.sizes[d] == shape[d];
      if (!whole_rows || r0 % block_rows != 0 || (r1 % block_rows != 0 && r1 != rows)) shared = true;
      if (coord == mine) row_offset = r0;
    }
    size_t d = coord.size();
    while (d > 0 && ++coord[d - 1] == mesh_shape[static_cast<int>(d - 1)]) coord[--d] = 0;
    if (d == 0) break;
  }
}

// The absmax's placements ([rows, 2], one pair per row): the parameter's, except that a split of
// dim 1 or later (columns) replicates it: every rank of those holds the same rows' absmax.
Placements absmax_placements(const Placements& ps) {
  Placements out = ps;
  for (Placement& pl : out)
    if (pl.splits() && pl.dim() != 0) pl = Placement::replicate();
  return out;
}

}  // namespace

AdamW8bit::AdamW8bit(std::vector<ParamGroup> groups, const AdamWOptions& opts)
    : Optimizer(std::move(groups), opts.lr, {}, "AdamW8bit"), opts_(opts) {
  MT_CHECK(opts.beta1 >= 0 && opts.beta1 < 1, "AdamW8bit: beta1 {} must be in [0, 1)", opts.beta1);
  MT_CHECK(opts.beta2 >= 0 && opts.beta2 < 1, "AdamW8bit: beta2 {} must be in [0, 1)", opts.beta2);
  MT_CHECK(std::isfinite(opts.eps) && opts.eps >= 0, "AdamW8bit: eps {} must be finite and >= 0", opts.eps);
  for (const ParamGroup& g : param_groups())
    for (const auto& [name, p] : g.params) {
      const Tensor local = local_view(p);
      MT_CHECK(p.dtype() == DType::kF32 && local.is_contiguous(),
               "AdamW8bit: parameter '{}' is {}; 8-bit AdamW takes contiguous f32 parameters (keep f32 masters "
               "for 16-bit models)", name, p.desc());
      State s;
      s.quantized = quantized(p.shape());
      if (s.quantized) {
        s.block_rows = block_rows(p.shape());
        const int64_t local_rows = local.dim() > 0 ? local.shape()[0] : 0;
        s.row_numel = local_rows > 0 ? local.numel() / local_rows : 1;
        Placements am_placements;
        if (p.is_distributed()) {
          const DTensorSpec& spec = dtensor_spec(p, "AdamW8bit");
          place_blocks(name, p, spec, s.block_rows, s.shared, s.row_offset);
          am_placements = absmax_placements(spec.placements());
          if (s.shared) {
            s.first_block = s.row_offset / s.block_rows;
            s.local_blocks = quant8::local_blocks(local_rows, s.row_offset, s.block_rows);
            s.global_blocks = (p.shape()[0] + s.block_rows - 1) / s.block_rows;
            s.comm = spec.mesh().comm();
            s.mesh_key = spec.mesh().world_ranks_key();
          }
        }
        s.m = state_tensor(p, local.shape(), p.shape(), DType::kU8);
        s.v = state_tensor(p, local.shape(), p.shape(), DType::kU8);
        s.absmax = state_tensor(p, Shape{local_rows, 2}, Shape{p.shape()[0], 2}, DType::kF32,
                                p.is_distributed() ? &am_placements : nullptr);
      } else {
        s.m = zeros_like(p);
        s.v = zeros_like(p);
      }
      names_.push_back(name);
      state_.emplace(name, std::move(s));
    }
}

int64_t AdamW8bit::state_bytes() const {
  int64_t n = 0;
  for (const auto& [name, s] : state_)
    for (const Tensor* t : {&s.m, &s.v, &s.absmax})
      if (t->defined()) n += local_view(*t).numel() * static_cast<int64_t>(dtype_size(t->dtype()));
  return n;
}

void AdamW8bit::update(Slot& slot, const Tensor& grad_in, double lr, double weight_decay) {
  State& s = state_.at(slot.name);
  const Tensor& p = slot.param;
  const Tensor grad = grad_in.is_contiguous() ? grad_in : grad_in.contiguous();
  const Tensor m = local_view(s.m), v = local_view(s.v);
  const double t = static_cast<double>(slot.steps);
  const double decay = 1 - lr * weight_decay, step_size = lr / (1 - std::pow(opts_.beta1, t));
  const double bc2_sqrt = std::sqrt(1 - std::pow(opts_.beta2, t));
  if (!s.quantized) {
    AdamWParams c;
    c.param = p.view_info();
    c.grad = grad.view_info();
    c.exp_avg = m.view_info();
    c.exp_avg_sq = v.view_info();
    c.decay = decay;
    c.beta1 = opts_.beta1;
    c.beta2 = opts_.beta2;
    c.step_size = step_size;
    c.bc2_sqrt = bc2_sqrt;
    c.eps = opts_.eps;
    MT_KERNEL(p.device().type, adamw, c);
  } else {
    const Tensor absmax = local_view(s.absmax);
    AdamW8bitParams c;
    c.param = p.view_info();
    c.grad = grad.view_info();
    c.exp_avg = m.view_info();
    c.exp_avg_sq = v.view_info();
    c.absmax = absmax.view_info();
    c.row_numel = s.row_numel;
    c.block_rows = s.block_rows;
    c.decay = decay;
    c.beta1 = opts_.beta1;
    c.beta2 = opts_.beta2;
    c.step_size = step_size;
    c.bc2_sqrt = bc2_sqrt;
    c.eps = opts_.eps;
    if (s.shared) {  // kMax now; kApply in finish_step, after the blocks' absmax is reduced
      Pending q;
      q.state = &s;
      q.block_absmax = zeros(Shape{s.local_blocks, 2}, TensorOptions(DType::kF32).with_device(p.device()));
      c.row_offset = s.row_offset;
      c.block_absmax = q.block_absmax.view_info();
      c.phase = Q8Phase::kMax;
      if (p.numel() > 0) MT_KERNEL(p.device().type, adamw8bit, c);
      c.phase = Q8Phase::kApply;
      q.call = c;
      q.param = p;
      q.grad = grad;
      q.m = m;
      q.v = v;
      q.absmax = absmax;
      pending_.push_back(std::move(q));
      return;
    }
    if (p.numel() > 0) MT_KERNEL(p.device().type, adamw8bit, c);
    bump_version(absmax);
  }
  bump_version(p);
  bump_version(m);
  bump_version(v);
}

// The shared blocks' absmax: per mesh (in the order of first use, the same on every rank), one
// [sum of the parameters' blocks, 2] buffer in which each rank writes its part of every block it
// holds (0 elsewhere: an absmax is >= 0), reduced by max over the mesh's ranks; then kApply.
void AdamW8bit::finish_step(bool apply) {
  std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  if (!apply) return;  // kMax changed nothing
  std::vector<bool> done(pending.size(), false);
  for (size_t a = 0; a < pending.size(); ++a) {
    if (done[a]) continue;
    const State& first = *pending[a].state;
    std::vector<size_t> members;
    int64_t total = 0;
    for (size_t b = a; b < pending.size(); ++b)
      if (!done[b] && pending[b].state->mesh_key == first.mesh_key) {
        done[b] = true;
        members.push_back(b);
        total += pending[b].state->global_blocks;
      }
    Tensor all = zeros(Shape{total, 2}, TensorOptions(DType::kF32).with_device(pending[a].block_absmax.device()));
    int64_t at = 0;
    for (size_t b : members) {
      const State& s = *pending[b].state;
      if (s.local_blocks > 0)
        all.narrow(0, at + s.first_block, s.local_blocks).copy_(pending[b].block_absmax);
      at += s.global_blocks;
    }
    Communicator comm = first.comm;
    comm.all_reduce(all, CommReduceOp::kMax);
    at = 0;
    for (size_t b : members) {
      Pending& q = pending[b];
      const State& s = *q.state;
      if (s.local_blocks > 0) {
        q.block_absmax.copy_(all.narrow(0, at + s.first_block, s.local_blocks));
        MT_KERNEL(q.param.device().type, adamw8bit, q.call);
      }
      at += s.global_blocks;
      for (const Tensor* t : {&q.param, &q.m, &q.v, &q.absmax}) bump_version(*t);
    }
  }
}

std::vector<std::string> AdamW8bit::shared_block_params() const {
  std::vector<std::string> out;
  for (const std::string& name : names_)
    if (state_.at(name).shared) out.push_back(name);
  return out;
}

NamedTensors AdamW8bit::own_state() const {
  NamedTensors own;
  for (const std::string& name : names_) {
    const State& s = state_.at(name);
    if (s.quantized) {
      own.emplace_back("exp_avg_q." + name, s.m);
      own.emplace_back("exp_avg_sq_q." + name, s.v);
      own.emplace_back("absmax." + name, s.absmax);
    } else {
      own.emplace_back("exp_avg." + name, s.m);
      own.emplace_back("exp_avg_sq." + name, s.v);
    }
  }
  return own;
}

NamedTensors AdamW8bit::state_dict() const { return state_dict_with(own_state()); }

void AdamW8bit::load_state_dict(const NamedTensors& state) { load_state_dict_with(state, own_state()); }

}  // namespace mt
