// 8-bit AdamW (optim/adamw8bit.h): block-wise quantized moments updated by the `adamw8bit` kernel
// family (kernels/cpu/optim.cpp); small tensors through the f32 `adamw` kernel.
#include "optim/adamw8bit.h"

#include <algorithm>
#include <cmath>

#include "kernels/registry.h"
#include "mesh/dtensor.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"

namespace mt {

namespace {

// A tensor like `like` (its placements, or plain) with local shape `local` and global `global`.
Tensor state_tensor(const Tensor& like, const Shape& local, const Shape& global, DType dtype) {
  Tensor t = zeros(local, TensorOptions(dtype).with_device(like.device()));
  if (like.is_distributed()) {
    const DTensorSpec& spec = dtensor_spec(like, "AdamW8bit");
    t.impl()->dist = intern_spec(spec.mesh(), spec.placements(), global);
  }
  return t;
}

// Every shard of a DTensor parameter must hold whole blocks: split along dim 0 only, every shard
// starting on a block edge and ending on one (or at the last row). Checked over every mesh
// coordinate, so that all ranks agree.
void check_blocks(const std::string& name, const Tensor& p, int64_t block_rows) {
  const DTensorSpec& spec = dtensor_spec(p, "AdamW8bit");
  const Placements& ps = spec.placements();
  for (const Placement& pl : ps)
    MT_CHECK(!pl.is_partial() && (!pl.splits() || pl.dim() == 0),
             "AdamW8bit: parameter '{}' is {}: 8-bit AdamW quantizes blocks of whole rows, so a parameter may be "
             "split along tensor dim 0 only (Shard(0) or RaggedShard(0), e.g. FSDP), not {}",
             name, p.desc(), pl.str());
  const Shape mesh_shape = spec.mesh().shape();
  const int64_t rows = p.shape()[0];
  std::vector<int64_t> coord(mesh_shape.size(), 0);
  for (;;) {
    const LocalLayout l = local_layout(p.shape(), ps, mesh_shape, Shape(coord));
    for (const DimSegment& s : l.segments[0]) {
      const int64_t end = s.global_start + s.length;
      MT_CHECK(s.global_start % block_rows == 0 && (end % block_rows == 0 || end == rows),
               "AdamW8bit: parameter '{}' ({}, placements {}) has a shard of rows [{}, {}) at mesh coordinate {}, "
               "which cuts a block of {} rows: every shard must hold whole blocks (FSDP: use granularity "
               "rows({}) or a multiple of it, or `whole`, for this parameter)",
               name, p.desc(), spec.placements_str(), s.global_start, end, Shape(coord), block_rows, block_rows);
    }
    size_t d = coord.size();
    while (d > 0 && ++coord[d - 1] == mesh_shape[static_cast<int>(d - 1)]) coord[--d] = 0;
    if (d == 0) break;
  }
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
        s.row_numel = p.shape().numel() / p.shape()[0];
        if (p.is_distributed()) check_blocks(name, p, s.block_rows);
        s.m = state_tensor(p, local.shape(), p.shape(), DType::kU8);
        s.v = state_tensor(p, local.shape(), p.shape(), DType::kU8);
        s.absmax = state_tensor(p, Shape{local.shape()[0], 2}, Shape{p.shape()[0], 2}, DType::kF32);
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
    if (p.numel() > 0) MT_KERNEL(p.device().type, adamw8bit, c);
    bump_version(absmax);
  }
  bump_version(p);
  bump_version(m);
  bump_version(v);
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
