#include "mesh/dist_composites.h"

#include "mesh/dtensor.h"
#include "mesh/ring_attention.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt {

namespace {


const DTensorSpec* spec_if_dist(const Tensor& t) { return t.is_distributed() ? &dtensor_spec(t, "dispatch") : nullptr; }

// Mesh dims whose placement splits tensor dim `dim` (bitmask).
uint32_t dims_splitting(const DTensorSpec* s, int dim) {
  uint32_t m = 0;
  if (!s) return 0;
  for (size_t d = 0; d < s->placements().size(); ++d)
    if (s->placements()[d].splits() && s->placements()[d].dim() == dim) m |= 1u << d;
  return m;
}

// This rank's rows [lo, lo + n) of tensor dim `dim` under `s` (one contiguous range: Shard only).
std::pair<int64_t, int64_t> local_range(const DTensorSpec& s, int dim, const char* op) {
  for (const auto& p : s.placements())
    MT_CHECK(!(p.splits() && p.dim() == dim) || p.is_shard(),
             "{}: the split of dim {} must be a Shard, got {} (placements {})", op, dim, p.str(),
             placements_str(s.placements()));
  LocalLayout lay = local_layout(s.global_shape(), s.placements(), s.mesh().shape(), s.mesh().coordinate_shape());
  const auto& segs = lay.segments[static_cast<size_t>(dim)];
  if (segs.empty()) return {0, 0};
  return {segs[0].global_start, lay.local_shape[dim]};
}

// Partial(max|min|sum) -> Replicate: the all-reduce of a rule's Partial result.
Tensor settle(const Tensor& t) {
  const DTensorSpec& s = dtensor_spec(t, "settle");
  Placements ps = s.placements();
  bool any = false;
  for (auto& p : ps)
    if (p.is_partial()) {
      p = Placement::replicate();
      any = true;
    }
  return any ? redistribute(t, ps) : t;
}

// A local [.., n] index tensor shifted into [0, n_local): (index, valid mask).
std::pair<Tensor, Tensor> local_index(const Tensor& ids, int64_t lo, int64_t n) {
  Tensor shifted = sub(ids, static_cast<double>(lo)).to(ids.dtype());
  Tensor valid = logical_and(ge(shifted, 0.0), lt(shifted, static_cast<double>(n)));
  return {where(valid, shifted, 0.0), valid};
}

Tensor vocab_parallel_embedding(const Tensor& weight, const Tensor& ids, uint32_t vocab_dims) {
  const DTensorSpec& ws = *spec_if_dist(weight);
  const DTensorSpec* is = spec_if_dist(ids);
  const int nd = ws.mesh().ndim();
  Placements out(static_cast<size_t>(nd));
  for (int d = 0; d < nd; ++d) {
    const Placement& w = ws.placements()[d];
    const Placement ip = is ? is->placements()[d] : Placement::replicate();
    if ((vocab_dims >> d) & 1) {
      MT_CHECK(ip.is_replicate(), "embedding: the table is split over the vocabulary on mesh dim {} ({}), so the ids "
               "must be Replicate there, got {}", d, w.str(), ip.str());
      out[d] = Placement::partial(PartialOp::kSum);
      continue;
    }
    MT_CHECK(w.is_replicate() && !ip.is_partial(),
             "embedding: on mesh dim {} the table {} must be Replicate and the ids not Partial (got ids {})", d,
             w.str(), ip.str());
    out[d] = ip;  // ids dim j is output dim j
  }
  // The table's local gradient: its own rows on the vocabulary dims; on a dim that splits the ids
  // (data parallel), this rank's term of a sum over the ranks' ids, as for any replicated input of
  // a split output (dispatch.cpp, input_grad_placements). Labelled Replicate there until
  // 2026-12-07, so a plan with both a batch split and a vocabulary-split embedding never summed
  // the embedding's gradient over the batch split (a reviewer: 0.72 relative error, exit 0).
  Placements grad = ws.placements();
  for (int d = 0; d < nd; ++d)
    if (!((vocab_dims >> d) & 1) && !out[d].is_replicate()) grad[d] = Placement::partial(PartialOp::kSum);
  auto [lo, n] = local_range(ws, 0, "embedding");
  Tensor wl = to_local(weight, grad);
  Tensor il = is ? to_local(ids) : ids;
  Shape os = il.local_shape();
  os.push_back(wl.local_shape()[1]);
  Tensor local;
  if (n == 0) {
    // A rank whose shard of the table is empty (a vocabulary smaller than the split) still joins
    // the autograd graph through it (a sum over no rows, zeros): the collectives of the backward
    // pass that follow the output (the all-gather of a reduce-scatter) must run on every rank.
    // Plain zeros left this rank out of them, and the ranks' collectives no longer matched.
    local = add(zeros(os, wl.options()), sum(wl, {0}));
  } else {
    auto [idx, valid] = local_index(il, lo, n);
    local = mul(embedding(wl, idx), valid.unsqueeze(-1).to(wl.dtype()));
  }
  Shape gs = ids.shape();
  gs.push_back(weight.shape()[1]);
  return from_local(local, ws.mesh(), out, gs);
}

// Per-row losses (vocabulary split): lse - logit[target], masked where target == ignore_index.
Tensor vocab_parallel_rows(const Tensor& logits0, const Tensor& target, int64_t ignore, uint32_t vocab_dims) {
  Tensor logits = logits0.dtype() == DType::kF64 ? logits0 : logits0.to(DType::kF32);
  const DTensorSpec& ls = *spec_if_dist(logits);
  const DTensorSpec* ts = spec_if_dist(target);
  const int last = logits.dim() - 1;
  for (int d = 0; d < ls.mesh().ndim(); ++d) {
    const Placement tp = ts ? ts->placements()[d] : Placement::replicate();
    const Placement& lp = ls.placements()[d];
    const Placement want = ((vocab_dims >> d) & 1) ? Placement::replicate() : lp;
    MT_CHECK(tp == want, "cross_entropy: logits {} are split over the vocabulary; the target must be {} on mesh dim {}, "
             "got {}", placements_str(ls.placements()), want.str(), d, tp.str());
  }
  Tensor m = settle(max(logits.detach(), last, KeepDim::kYes));
  Tensor z = sub(logits, m);
  Tensor lse = log(settle(sum(exp(z), {last})));
  auto [lo, n] = local_range(ls, last, "cross_entropy");
  Tensor zl = to_local(z);
  Tensor tl = ts ? to_local(target) : target;
  Tensor picked;
  if (n == 0) {
    picked = sum(zl, {last});  // zeros, in the graph as in vocab_parallel_embedding
  } else {
    auto [idx, valid] = local_index(tl, lo, n);
    picked = mul(gather(zl, -1, idx.unsqueeze(-1)).squeeze(-1), valid.to(zl.dtype()));
  }
  Placements rows = ls.placements();
  for (size_t d = 0; d < rows.size(); ++d)
    if ((vocab_dims >> d) & 1) rows[d] = Placement::partial(PartialOp::kSum);
  Tensor zt = settle(from_local(picked, ls.mesh(), rows, target.shape()));
  return where(ne(target, static_cast<double>(ignore)), sub(lse, zt), 0.0);
}

// scaled_dot_product_attention with the sequence (dim 2) split over one mesh dim: ring attention
// (mesh/ring_attention.h) on the local rows. Other mesh dims may split batch or heads as the
// attention rule allows.
std::optional<Tensor> context_parallel_composite(const DistOp& op, const std::vector<Tensor>& in) {
  const DTensorSpec* qs = spec_if_dist(in[0]);
  if (!qs) return std::nullopt;
  int cp = -1;
  for (int d = 0; d < qs->mesh().ndim(); ++d) {
    const Placement& p = qs->placements()[static_cast<size_t>(d)];
    if (!p.splits() || p.dim() != 2) continue;
    MT_CHECK(cp < 0, "scaled_dot_product_attention: the sequence dim of q {} is split over two mesh dims ({} and {}); "
             "context parallelism takes one", placements_str(qs->placements()), cp, d);
    cp = d;
  }
  const auto& args = *static_cast<const AttentionArgs*>(op.extra);
  const bool with_dropout = op.args[1] != 0;
  if (cp < 0) {
    if (with_dropout) return eager_attention_dropout(in[0], in[1], in[2], args.scale, args.dropout, args.gen);
    return std::nullopt;
  }
  const DTensorSpec* ks = spec_if_dist(in[1]);
  const DTensorSpec* vs = spec_if_dist(in[2]);
  MT_CHECK(ks && vs && ks->placements() == qs->placements() && vs->placements() == qs->placements(),
           "scaled_dot_product_attention: context parallelism needs q, k and v placed alike, got q {}, k {}, v {}",
           placements_str(qs->placements()), ks ? placements_str(ks->placements()) : "local",
           vs ? placements_str(vs->placements()) : "local");
  for (int d = 0; d < qs->mesh().ndim(); ++d) {
    const Placement& p = qs->placements()[static_cast<size_t>(d)];
    MT_CHECK(!p.is_partial() && (!p.splits() || d == cp || (p.is_shard() && p.dim() <= 1)),
             "scaled_dot_product_attention: with the sequence split over mesh dim {}, the other mesh dims may split "
             "only batch S(0) or heads S(1), got {}", cp, placements_str(qs->placements()));
  }
  MT_CHECK(qs->global_shape()[2] == ks->global_shape()[2],
           "scaled_dot_product_attention: context parallelism is self-attention: q has {} positions, k has {}",
           qs->global_shape()[2], ks->global_shape()[2]);
  const DeviceMesh& mesh = qs->mesh();
  const int64_t k = mesh.size(cp);
  std::vector<std::vector<DimSegment>> segs;
  Shape coord = mesh.coordinate_shape();
  for (int64_t c = 0; c < k; ++c) {
    coord[cp] = c;
    segs.push_back(local_layout(ks->global_shape(), ks->placements(), mesh.shape(), coord).segments[2]);
  }
  CpDropout drop;
  if (with_dropout && args.dropout > 0) {
    // Every rank reserves the blocks of the global probabilities [B, Hq, T, T], as dropout does.
    const Shape& g = qs->global_shape();
    const Shape ps{g[0], g[1], g[2], g[2]};
    Generator& gen = args.gen ? *args.gen : default_generator();
    drop.p = args.dropout;
    drop.seed = gen.seed();
    drop.offset = gen.reserve(random_blocks(RandomDist::kBernoulli, in[0].dtype(), ps.numel(), 1 - args.dropout, 0));
    drop.strides = ps.contiguous_strides();
    const LocalLayout ql = local_layout(g, qs->placements(), mesh.shape(), mesh.coordinate_shape());
    for (int d = 0; d < 2; ++d)
      if (!ql.segments[static_cast<size_t>(d)].empty())
        drop.base += ql.segments[static_cast<size_t>(d)][0].global_start * drop.strides[d];
  }
  // A simulated mesh (estimates): a simulated communicator at this coordinate, so that the ring's
  // shifts are counted over the cp dim as the real ones are.
  Communicator comm = mesh.is_simulated()
                          ? Communicator::simulated(static_cast<int>(k), static_cast<int>(mesh.coordinate(cp)),
                                                    "context-parallel ring (simulated)", mesh.dim_label(cp))
                          : mesh.comm(cp);
  Tensor out = context_parallel_attention(to_local(in[0]), to_local(in[1]), to_local(in[2]), segs, comm,
                                          op.args[0] != 0, args.scale, drop.p > 0 ? &drop : nullptr);
  Shape gs = qs->global_shape();
  gs[3] = vs->global_shape()[3];
  return from_local(out, mesh, qs->placements(), gs);
}

Tensor all_replicate(const Tensor& t) {
  if (!t.is_distributed()) return t;
  const DTensorSpec& s = dtensor_spec(t, "cross_entropy");
  return redistribute(t, Placements(s.placements().size()));
}

Tensor cross_entropy_composite(const Tensor& logits, const Tensor& target, int64_t ignore, Reduction red,
                               uint32_t vocab_dims) {
  Tensor rows = vocab_dims ? vocab_parallel_rows(logits, target, ignore, vocab_dims)
                           : cross_entropy(logits, target, ignore, Reduction::kNone);
  if (red == Reduction::kNone) return rows;
  Tensor total = all_replicate(sum(rows));
  if (red == Reduction::kSum) return total;
  Tensor count = all_replicate(sum(ne(target, static_cast<double>(ignore)).to(total.dtype())));
  return div(total, local_view(count).detach());
}

// max/min over a split dim with a gradient: the local winners are not the global ones, so the
// value is recomputed as sum(x * hit) / ties with hit = (x == global max), which gives the
// single-device gradient (ties share it evenly).
Tensor minmax_composite(const Tensor& x, ReduceOp op, int64_t mask, bool keep) {
  std::vector<int64_t> dims;
  for (int d = 0; d < x.dim(); ++d)
    if (mask == 0 || ((mask >> d) & 1)) dims.push_back(d);
  Tensor m = x.detach();
  for (int64_t d : dims) m = op == ReduceOp::kMax ? max(m, d, KeepDim::kYes) : min(m, d, KeepDim::kYes);
  m = settle(m);
  Tensor hit = eq(x, m).to(x.dtype());
  Tensor n = settle(sum(hit, dims, KeepDim::kYes));
  Tensor out = sum(mul(x, hit), dims, keep ? KeepDim::kYes : KeepDim::kNo);
  if (!keep) n = n.reshape(out.shape());
  return div(out, n);
}

}  // namespace

std::optional<Tensor> dist_composite(const DistOp& op, const std::vector<Tensor>& in) {
  if (op.rule == DistRule::kAttention) return context_parallel_composite(op, in);
  if (op.rule == DistRule::kEmbedding) {
    uint32_t v = dims_splitting(spec_if_dist(in[0]), 0);
    if (v) return vocab_parallel_embedding(in[0], in[1], v);
    return std::nullopt;
  }
  if (op.rule == DistRule::kReduce) {
    const auto rop = static_cast<ReduceOp>(op.args[2]);
    if ((rop != ReduceOp::kMax && rop != ReduceOp::kMin) || !needs_grad(in[0])) return std::nullopt;
    const DTensorSpec* s = spec_if_dist(in[0]);
    bool split_reduced = false;
    for (const auto& p : s->placements())
      split_reduced = split_reduced || (p.splits() && (op.args[0] == 0 || ((op.args[0] >> p.dim()) & 1)));
    if (!split_reduced) return std::nullopt;
    return minmax_composite(in[0], rop, op.args[0], op.args[1] != 0);
  }
  if (op.rule == DistRule::kCrossEntropy) {
    const auto red = static_cast<Reduction>(op.args[1]);
    uint32_t v = dims_splitting(spec_if_dist(in[0]), in[0].dim() - 1);
    if (!v && red == Reduction::kNone) return std::nullopt;
    return cross_entropy_composite(in[0], in[1], op.args[0], red, v);
  }
  return std::nullopt;
}

Tensor dist_random_fill(const DistOp& op, const Tensor& t) {
  const DTensorSpec& s = dtensor_spec(t, op.name);
  const auto* f = static_cast<const DistRandomFill*>(op.extra);
  Tensor l = local_view(t);
  fill_random_sharded(l, f->dist, f->a, f->b, f->seed, f->offset, s.global_shape(), s.placements(), s.mesh().shape(),
                      s.mesh().coordinate_shape());
  return t;
}

}  // namespace mt
