// The sharding rules, one function per DistRule family. Each decides one mesh dim at a time (a
// placement list is applied mesh dim by mesh dim, and the rules below are independent per dim);
// `why` receives the reason when the inputs cannot be taken.
#include "mesh/sharding_rules.h"

#include <fmt/format.h>

#include "kernels/params.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"

namespace mt {

Placement with_dim(const Placement& p, int dim) {
  switch (p.kind()) {
    case PlacementKind::kShard: return Placement::shard(dim);
    case PlacementKind::kInterleavedShard:
      return p.mirrored() ? Placement::zigzag_shard(dim) : Placement::interleaved_shard(dim, p.groups());
    case PlacementKind::kRaggedShard: return Placement::ragged_shard(dim, p.units(), p.block());
    default: return p;
  }
}

namespace {

// Same split kind and parameters, whatever the dim.
bool same_split(const Placement& a, const Placement& b) { return with_dim(a, 0) == with_dim(b, 0); }

bool is_psum(const Placement& p) { return p.is_partial() && p.reduce_op() == PartialOp::kSum; }
bool is_linear_partial(const Placement& p) {
  return p.is_partial() && (p.reduce_op() == PartialOp::kSum || p.reduce_op() == PartialOp::kAvg);
}

// What one mesh dim decides: output placements, and inputs that only coordinate 0 contributes.
struct DimCtx {
  const DistOp& op;
  const std::vector<const DTensorSpec*>& in;
  const std::vector<Shape>& out_shapes;
  int mesh_dim;
  std::vector<Placement> out;  // per output
  uint32_t root_only = 0;      // bit i: input i
  std::string why;

  const Placement& p(size_t i) const { return in[i]->placements()[mesh_dim]; }
  const Shape& shape(size_t i) const { return in[i]->global_shape(); }
  int rank(size_t i) const { return in[i]->global_shape().size(); }
  bool has(size_t i) const { return i < in.size() && in[i] != nullptr; }
  void set_all(const Placement& q) { out.assign(out_shapes.size(), q); }
  bool fail(std::string msg) {
    why = std::move(msg);
    return false;
  }
};

std::string pname(const DimCtx& c, size_t i) { return fmt::format("input {} ({})", i, c.p(i).str()); }

// ---- pointwise: broadcasting, linearity --------------------------------------------------------

bool rule_pointwise(DimCtx& c) {
  const int ro = c.out_shapes[0].size();
  const Shape& os = c.out_shapes[0];
  int split_out = -1;
  Placement split;
  std::vector<size_t> partial, repl;
  for (size_t i = 0; i < c.in.size(); ++i) {
    if (!c.has(i)) continue;
    const Placement& q = c.p(i);
    if (q.splits()) {
      const int lead = ro - c.rank(i);
      const int od = q.dim() + lead;
      if (c.shape(i)[q.dim()] != os[od])
        return c.fail(fmt::format("{} splits dim {} of size {}, which broadcasts to {}", pname(c, i), q.dim(),
                                  c.shape(i)[q.dim()], os[od]));
      if (split_out >= 0 && (od != split_out || !same_split(q, split)))
        return c.fail(fmt::format("inputs are split differently: {} and {} (after broadcasting to output dims "
                                  "{} and {})", split.str(), q.str(), split_out, od));
      split_out = od;
      split = q;
    } else if (q.is_partial()) {
      partial.push_back(i);
    } else {
      repl.push_back(i);
    }
  }
  if (split_out >= 0) {
    for (size_t i : partial)
      return c.fail(fmt::format("{} is Partial while another input is split ({}): redistribute it first",
                                pname(c, i), split.str()));
    for (size_t i : repl) {
      const int d = split_out - (ro - c.rank(i));
      if (d >= 0 && c.shape(i)[d] != 1)
        return c.fail(fmt::format("{} is Replicate but its dim {} (size {}) lines up with the split output dim {} "
                                  "({}): redistribute it to {} too",
                                  pname(c, i), d, c.shape(i)[d], split_out, split.str(), with_dim(split, d).str()));
    }
    c.set_all(with_dim(split, split_out));
    return true;
  }
  if (partial.empty()) {
    c.set_all(Placement::replicate());
    return true;
  }
  const Placement& p0 = c.p(partial[0]);
  switch (c.op.rule) {
    case DistRule::kLinear:
      for (size_t i : partial)
        if (c.p(i) != p0 || !is_linear_partial(c.p(i)))
          return c.fail(fmt::format("{} and {}: only equal Partial(sum|avg) terms add up", pname(c, partial[0]),
                                    pname(c, i)));
      if (is_psum(p0))
        for (size_t i : repl) c.root_only |= 1u << i;  // P + R: R is one term of the sum
      c.set_all(p0);
      return true;
    case DistRule::kMulLike:
      if (partial.size() > 1)
        return c.fail(fmt::format("{} and {} are both Partial: a product of sums is not a sum of products; "
                                  "redistribute one to R", pname(c, partial[0]), pname(c, partial[1])));
      if (c.op.args[0] == 1 && partial[0] != 0)
        return c.fail(fmt::format("the divisor {} is Partial: redistribute it to R", pname(c, partial[0])));
      if (!is_linear_partial(p0))
        return c.fail(fmt::format("{} is not linear under multiplication: redistribute it to R", pname(c, 0)));
      c.set_all(p0);
      return true;
    case DistRule::kAffineScalar:
      if (!is_linear_partial(p0)) return c.fail(fmt::format("{}: only Partial(sum|avg) take a constant", pname(c, 0)));
      c.set_all(p0);
      return true;
    default:
      return c.fail(fmt::format("{} is Partial and '{}' is not linear: redistribute it to R (all-reduce) first",
                                pname(c, partial[0]), c.op.name));
  }
}

// ---- reductions --------------------------------------------------------------------------------

bool rule_reduce(DimCtx& c) {
  const Placement& q = c.p(0);
  const int64_t mask = c.op.args[0];
  const bool keep = c.op.args[1] != 0;
  const auto rop = static_cast<ReduceOp>(c.op.args[2]);
  const int r = c.rank(0);
  auto reduced = [&](int d) { return mask == 0 || ((mask >> d) & 1); };
  auto out_dim = [&](int d) {
    if (keep) return d;
    int n = d;
    for (int j = 0; j < d; ++j) n -= reduced(j) ? 1 : 0;
    return n;
  };
  auto partial_for = [&]() -> bool {
    switch (rop) {
      case ReduceOp::kSum: c.set_all(Placement::partial(PartialOp::kSum)); return true;
      case ReduceOp::kMax: c.set_all(Placement::partial(PartialOp::kMax)); return true;
      case ReduceOp::kMin: c.set_all(Placement::partial(PartialOp::kMin)); return true;
      default: return false;
    }
  };
  if (q.splits()) {
    if (r > 0 && !reduced(q.dim())) {
      c.set_all(with_dim(q, out_dim(q.dim())));
      return true;
    }
    if (partial_for()) return true;
    return c.fail(fmt::format("'{}' over dim {}, which is split ({}): redistribute it to R first", c.op.name,
                              q.dim(), q.str()));
  }
  if (q.is_partial()) {
    const bool ok = (rop == ReduceOp::kSum && is_linear_partial(q)) ||
                    (rop == ReduceOp::kMax && q.reduce_op() == PartialOp::kMax) ||
                    (rop == ReduceOp::kMin && q.reduce_op() == PartialOp::kMin);
    if (!ok) return c.fail(fmt::format("'{}' of a {} input: redistribute it to R first", c.op.name, q.str()));
    c.set_all(q);
    return true;
  }
  c.set_all(Placement::replicate());
  return true;
}

// ---- matmul (einsum rule) ----------------------------------------------------------------------

// Role of a tensor dim of an operand: an output dim (batch, M or N), or the contraction (-1).
struct MatmulRoles {
  std::vector<int> a, b;
};

MatmulRoles matmul_roles(int ra, int rb, int ro, bool linear) {
  MatmulRoles m;
  m.a.assign(ra, 0);
  m.b.assign(rb, 0);
  if (linear) {  // x [..., K] @ w [N, K]^T -> [..., N]
    for (int j = 0; j + 1 < ra; ++j) m.a[j] = j;
    m.a[ra - 1] = -1;
    m.b[0] = ro - 1;
    m.b[1] = -1;
    return m;
  }
  const bool av = ra == 1, bv = rb == 1;
  const int core = (av ? 0 : 1) + (bv ? 0 : 1);
  const int nb = ro - core;
  if (av) {
    m.a[0] = -1;
  } else {
    m.a[ra - 1] = -1;
    m.a[ra - 2] = ro - 1 - (bv ? 0 : 1);
    for (int j = 0; j < ra - 2; ++j) m.a[j] = j + nb - (ra - 2);
  }
  if (bv) {
    m.b[0] = -1;
  } else {
    m.b[rb - 2] = -1;
    m.b[rb - 1] = ro - 1;
    for (int j = 0; j < rb - 2; ++j) m.b[j] = j + nb - (rb - 2);
  }
  return m;
}

bool rule_matmul(DimCtx& c) {
  const bool linear = c.op.args[0] == 1;
  const int ro = c.out_shapes[0].size();
  MatmulRoles roles = matmul_roles(c.rank(0), c.rank(1), ro, linear);
  const Placement &pa = c.p(0), &pb = c.p(1);
  Placement out = Placement::replicate();
  const int ra_role = pa.splits() ? roles.a[pa.dim()] : -2;
  const int rb_role = pb.splits() ? roles.b[pb.dim()] : -2;
  // The dim of the other operand that lines up with output dim `od` (batch), or -1.
  auto b_dim_of = [&](int od) {
    for (int j = 0; j < c.rank(1); ++j)
      if (roles.b[j] == od) return j;
    return -1;
  };
  auto a_dim_of = [&](int od) {
    for (int j = 0; j < c.rank(0); ++j)
      if (roles.a[j] == od) return j;
    return -1;
  };
  if (pa.splits() && pb.splits()) {
    if (ra_role == -1 && rb_role == -1) {
      if (!same_split(pa, pb))
        return c.fail(fmt::format("the contraction dim is split differently: a {} and b {}", pa.str(), pb.str()));
      out = Placement::partial(PartialOp::kSum);
    } else if (ra_role == rb_role && same_split(pa, pb)) {
      out = with_dim(pa, ra_role);  // the same batch dim split in both
    } else {
      return c.fail(fmt::format("a {} and b {} split dims that do not line up (output dims {} and {})", pa.str(),
                                pb.str(), ra_role, rb_role));
    }
  } else if (pa.splits() || pb.splits()) {
    const bool a_split = pa.splits();
    const Placement& s = a_split ? pa : pb;
    const Placement& o = a_split ? pb : pa;
    const int role = a_split ? ra_role : rb_role;
    if (role == -1)
      return c.fail(fmt::format("the contraction dim is split in {} ({}) but not in {} ({}): split both or "
                                "neither", a_split ? "a" : "b", s.str(), a_split ? "b" : "a", o.str()));
    if (o.is_partial())
      return c.fail(fmt::format("{} is Partial ({}) while {} is split: redistribute it to R",
                                a_split ? "b" : "a", o.str(), a_split ? "a" : "b"));
    // A Replicate operand must not have a full-size dim lining up with a split batch dim. A size-1
    // dim broadcasts in matmul, but not in bmm (args[1]): there a split batch of 1 leaves the other
    // ranks a batch of 0 against the Replicate operand's 1, which bmm refuses on those ranks only
    // (the job hung until 2026-12-07).
    const int od = a_split ? b_dim_of(role) : a_dim_of(role);
    const Shape& other = a_split ? c.shape(1) : c.shape(0);
    if (od >= 0 && (other[od] != 1 || c.op.args[1] != 0))
      return c.fail(fmt::format("{} splits batch dim {} but {} is Replicate there: split both alike",
                                a_split ? "a" : "b", role, a_split ? "b" : "a"));
    out = with_dim(s, role);
  } else if (pa.is_partial() || pb.is_partial()) {
    if (pa.is_partial() && pb.is_partial())
      return c.fail(fmt::format("a {} and b {} are both Partial: redistribute one to R", pa.str(), pb.str()));
    const Placement& q = pa.is_partial() ? pa : pb;
    if (!is_linear_partial(q)) return c.fail(fmt::format("{} is not linear: redistribute it to R", q.str()));
    out = q;
  }
  if (c.has(2)) {  // linear's bias [N]
    const Placement& pbias = c.p(2);
    if (out.splits() && out.dim() == ro - 1) {
      if (!(pbias.splits() && pbias.dim() == 0 && same_split(pbias, out)))
        return c.fail(fmt::format("bias must be {} like the output features, got {}", with_dim(out, 0).str(),
                                  pbias.str()));
    } else if (!pbias.is_replicate()) {
      return c.fail(fmt::format("bias must be Replicate here (output {}), got {}", out.str(), pbias.str()));
    } else if (is_psum(out)) {
      c.root_only |= 1u << 2;  // added once to the sum
    }
  }
  c.set_all(out);
  return true;
}

// ---- views -------------------------------------------------------------------------------------

struct ViewGroup {
  int i0, i1, o0, o1;  // in dims [i0, i1) and out dims [o0, o1) with equal products
};

std::vector<ViewGroup> view_groups(const Shape& is, const Shape& os) {
  std::vector<ViewGroup> gs;
  int i = 0, o = 0;
  while (i < is.size() || o < os.size()) {
    ViewGroup g{i, i, o, o};
    int64_t pi = 1, po = 1;
    if (i < is.size()) pi *= is[i++];
    if (o < os.size()) po *= os[o++];
    while (pi != po) {
      if (pi < po && i < is.size()) {
        pi *= is[i++];
      } else if (o < os.size()) {
        po *= os[o++];
      } else {
        break;
      }
    }
    g.i1 = i;
    g.o1 = o;
    gs.push_back(g);
  }
  return gs;
}

bool rule_reshape(DimCtx& c, const Placement& q) {
  const Shape& is = c.shape(0);
  const Shape& os = c.out_shapes[0];
  const int j = q.dim();
  // Ranks splitting dim j over all mesh dims: nested splits must divide evenly as a whole.
  int64_t k = 1;
  for (size_t e = 0; e < c.in[0]->placements().size(); ++e) {
    const Placement& pe = c.in[0]->placements()[e];
    if (pe.splits() && pe.dim() == j) k *= c.in[0]->mesh().size(static_cast<int>(e));
  }
  for (const ViewGroup& g : view_groups(is, os)) {
    if (j < g.i0 || j >= g.i1) continue;
    if (g.o0 == g.o1) {
      // Trailing size-1 dims with no out dim left ([2, 4, 1] -> [8]): the split dim is dropped. Over
      // one rank in all it holds the whole tensor, so R; over more, one rank holds the element and
      // the others nothing, which no out dim can say. (It took the out dim past the end, an invalid
      // spec with an error that named no op, until 2026-12-07.)
      if (k == 1) {
        c.set_all(Placement::replicate());
        return true;
      }
      return c.fail(fmt::format("{} splits dim {} of size 1, which the view {} -> {} drops", q.str(), j, is, os));
    }
    int64_t before = 1, after = 1;
    for (int t = g.i0; t < j; ++t) before *= is[t];
    for (int t = j + 1; t < g.i1; ++t) after *= is[t];
    const int64_t n = is[j];
    // Placements apply in mesh order: an earlier mesh dim that splits another dim of this group
    // changes the sizes this mesh dim sees (under [S(0), S(1)], [B, T] -> [B * T] leaves cp B / dp
    // runs of T, not B). Only even Shards keep those sizes equal on every rank. Until 2026-11-28
    // the global sizes were used here: wrong placements, and permuted values with no error.
    int64_t lbefore = 1, lafter = 1;  // `before` and `after` as this mesh dim sees them
    for (int t = g.i0; t < g.i1; ++t) {
      if (t == j) continue;
      int64_t size = is[t];
      for (int e = 0; e < c.mesh_dim; ++e) {
        const Placement& pe = c.in[0]->placements()[static_cast<size_t>(e)];
        if (!pe.splits() || pe.dim() != t) continue;
        const int64_t m = c.in[0]->mesh().size(e);
        if (!pe.is_shard() || size % m != 0)
          return c.fail(fmt::format("{} cannot be viewed {} -> {}: mesh dim '{}' splits dim {} of the merged dims "
                                    "({} of size {} over {} ranks), which needs an even Shard there",
                                    q.str(), is, os, c.in[0]->mesh().names()[static_cast<size_t>(e)], t, pe.str(),
                                    size, m));
        size /= m;
      }
      (t < j ? lbefore : lafter) *= size;
    }
    // First non-unit out dim at or after o (the group's last dim if none).
    auto lead_of = [&](int o) {
      while (o < g.o1 - 1 && os[o] == 1) ++o;
      return o;
    };
    if (before == 1 && after == 1) {  // the dim itself survives (maybe among unit dims): any split kind
      int found = -1, nonunit = 0;
      for (int o = g.o0; o < g.o1; ++o)
        if (os[o] != 1) {
          ++nonunit;
          found = o;
        }
      if (nonunit == 1 && os[found] == n) {
        c.set_all(with_dim(q, found));
        return true;
      }
    }
    if (q.kind() == PlacementKind::kShard) {
      if (before == 1) {
        // The split dim leads its group: the split moves to the first non-unit out dim, which
        // must split the same way (one out dim, or a size divisible by the ranks).
        const int o = lead_of(g.o0);
        int64_t rest = 1;
        for (int t = o + 1; t < g.o1; ++t) rest *= os[t];
        if ((os[o] == n && after == rest) || (os[o] % k == 0 && n % k == 0)) {
          c.set_all(Placement::shard(o));
          return true;
        }
        // Merged into one out dim ([n, a, b] -> [n * a * b]) by an uneven split that only this mesh
        // dim makes: each rank's chunk of n is a run of whole rows of `after`, a ragged split
        // (e.g. a batch of 5 over 2 ranks, flattened with its sequence: the tokens of 3 and 2 rows).
        if (k == c.in[0]->mesh().size(c.mesh_dim) && rest == 1 && os[o] == n * after) {
          std::vector<int64_t> units(static_cast<size_t>(k));
          for (int64_t r = 0; r < k; ++r) units[static_cast<size_t>(r)] = chunk_range(n, k, r).length;
          c.set_all(Placement::ragged_shard(o, std::move(units), lafter));
          return true;
        }
        return c.fail(fmt::format("S({}) of size {} over {} ranks is not a Shard of the view {} -> {}", j, n, k, is,
                                  os));
      }
      if (g.o1 - g.o0 == 1 && after == 1) {  // [.., a, n] merged: each rank holds a chunk of every run of n
        c.set_all(lbefore == 1 ? Placement::shard(g.o0) : Placement::interleaved_shard(g.o0, lbefore));
        return true;
      }
      return c.fail(fmt::format("S({}) cannot be viewed {} -> {}: it is not the leading dim of the merged dims", j,
                                is, os));
    }
    if (q.kind() == PlacementKind::kRaggedShard && before == 1) {
      // RS(j, units, block) with the dims after j in its group: split back into out dims. The
      // units stay whole when the leading out dim's rows are made of whole blocks, or one block
      // is made of whole leading rows.
      const int o = lead_of(g.o0);
      int64_t rest = 1;
      for (int t = o + 1; t < g.o1; ++t) rest *= os[t];
      const int64_t block = q.block() * after;  // elements of the group per unit
      if (block % rest == 0) {
        // The same rows as torch.chunk of the out dim give a plain Shard (S(0) flattened and
        // viewed back is S(0) again).
        const int64_t k1 = c.in[0]->mesh().size(c.mesh_dim);
        bool chunked = static_cast<int64_t>(q.units().size()) == k1;
        for (int64_t r = 0; chunked && r < k1; ++r)
          chunked = q.units()[static_cast<size_t>(r)] * (block / rest) == chunk_range(os[o], k1, r).length;
        c.set_all(chunked ? Placement::shard(o) : Placement::ragged_shard(o, q.units(), block / rest));
        return true;
      }
    }
    if (q.kind() == PlacementKind::kInterleavedShard && !q.mirrored() && before == 1 && after == 1) {
      // IS(j, groups) of n: out dims multiplying to `groups`, then the chunked part.
      int64_t acc = 1;
      for (int o = g.o0; o < g.o1; ++o) {
        if (acc == q.groups()) {
          const int od = lead_of(o);
          int64_t rest = 1;
          for (int t = od; t < g.o1; ++t) rest *= os[t];
          if (rest * q.groups() == n && (rest == os[od] || os[od] % k == 0)) {
            c.set_all(Placement::shard(od));
            return true;
          }
        }
        acc *= os[o];
      }
    }
    return c.fail(fmt::format("{} cannot be viewed {} -> {}", q.str(), is, os));
  }
  return c.fail(fmt::format("{}: no dim {} in {}", q.str(), j, is));
}

bool rule_view(DimCtx& c) {
  const Placement& q = c.p(0);
  if (!q.splits()) {
    c.set_all(q);  // R stays R, Partial stays Partial (a view is linear)
    return true;
  }
  switch (c.op.args[0]) {
    case 1: {  // permute: out dim i is in dim perm[i]
      for (int i = 0; i < c.op.shape.size(); ++i)
        if (c.op.shape[i] == q.dim()) {
          c.set_all(with_dim(q, i));
          return true;
        }
      return c.fail("permute: bad permutation");
    }
    case 2: {  // expand: new leading dims, and size-1 dims broadcast
      const int lead = c.out_shapes[0].size() - c.rank(0);
      // A split dim that broadcasts (size 1 to n) is refused as the elementwise rule refuses it:
      // its shards are the one row on one rank and nothing on the others, which cannot all expand
      // (until 2026-12-07 the rule kept the split, the empty shards failed alone, and the job hung).
      if (c.shape(0)[q.dim()] != c.out_shapes[0][q.dim() + lead])
        return c.fail(fmt::format("expand: {} splits dim {} of size {}, which broadcasts to {}: redistribute it to R "
                                  "over this mesh dim first", q.str(), q.dim(), c.shape(0)[q.dim()],
                                  c.out_shapes[0][q.dim() + lead]));
      c.set_all(with_dim(q, q.dim() + lead));
      return true;
    }
    default:
      return rule_reshape(c, q);
  }
}

// ---- ops over one dim that must not be split ---------------------------------------------------

bool rule_slice(DimCtx& c) {
  const Placement& q = c.p(0);
  const int dim = static_cast<int>(c.op.args[0]);
  const bool removed = c.op.args[1] != 0, linear = c.op.args[2] != 0;
  if (q.splits()) {
    if (q.dim() == dim)
      return c.fail(fmt::format("'{}' works along dim {}, which is split ({}): redistribute it to R over this "
                                "mesh dim first", c.op.name, dim, q.str()));
    c.set_all(with_dim(q, removed && q.dim() > dim ? q.dim() - 1 : q.dim()));
    return true;
  }
  if (q.is_partial() && !linear)
    return c.fail(fmt::format("'{}' of a Partial input ({}) is not the sum of the terms' results: redistribute it "
                              "to R first", c.op.name, q.str()));
  c.set_all(q);
  return true;
}

bool rule_norm(DimCtx& c) {
  const Placement& q = c.p(0);
  if (q.splits() && q.dim() == c.rank(0) - 1)
    return c.fail(fmt::format("'{}' normalizes the last dim, which is split ({}): redistribute x to R there",
                              c.op.name, q.str()));
  if (q.is_partial())
    return c.fail(fmt::format("'{}' of a Partial input ({}): redistribute it to R first", c.op.name, q.str()));
  for (size_t i = 1; i < c.in.size(); ++i)
    if (c.has(i) && !c.p(i).is_replicate())
      return c.fail(fmt::format("the {} of '{}' must be Replicate, got {}", i == 1 ? "weight" : "bias", c.op.name,
                                c.p(i).str()));
  c.set_all(q);
  return true;
}

bool rule_rope(DimCtx& c) {
  const Placement& q = c.p(0);
  const int r = c.rank(0);
  if (q.splits() && q.dim() == r - 1)
    return c.fail(fmt::format("rotary_embedding rotates pairs along the last dim, which is split ({})", q.str()));
  for (size_t i = 1; i < 3; ++i) {
    const Placement& t = c.p(i);
    if (t.is_partial()) return c.fail(fmt::format("the rotary table {} is Partial", pname(c, i)));
    const int lead = r - c.rank(i);
    if (t.splits()) {
      if (!(q.splits() && q.dim() == t.dim() + lead && same_split(q, t)))
        return c.fail(fmt::format("the rotary table {} is split but x is {}", pname(c, i), q.str()));
    } else if (q.splits()) {
      const int d = q.dim() - lead;
      if (d >= 0 && c.shape(i)[d] != 1)
        return c.fail(fmt::format("x is {} but the rotary table {} is Replicate along that dim: split it as {}",
                                  q.str(), pname(c, i), with_dim(q, d).str()));
    }
  }
  c.set_all(q);  // linear in x: Partial passes
  return true;
}

bool rule_attention(DimCtx& c) {
  const Placement& q = c.p(0);
  for (size_t i = 0; i < 3; ++i) {
    const Placement& t = c.p(i);
    if (t.is_partial()) return c.fail(fmt::format("{} is Partial: redistribute it to R", pname(c, i)));
    if (t != q)
      return c.fail(fmt::format("q, k and v must be placed alike (batch or heads split), got q {}, k {}, v {}",
                                c.p(0).str(), c.p(1).str(), c.p(2).str()));
  }
  if (q.splits()) {
    if (q.kind() != PlacementKind::kShard || q.dim() > 1)
      return c.fail(fmt::format("attention splits only batch S(0) or heads S(1), got {}", q.str()));
    const int64_t k = c.in[0]->mesh().size(c.mesh_dim);
    if (q.dim() == 1 && (c.shape(0)[1] % k != 0 || c.shape(1)[1] % k != 0))
      return c.fail(fmt::format("heads split over {} ranks need Hq = {} and Hkv = {} divisible by it", k,
                                c.shape(0)[1], c.shape(1)[1]));
  }
  c.set_all(q);
  return true;
}

// index_add / scatter_add (args[1] = 1) are linear in the updated tensor and the source:
// Partial(sum) sources (and targets) give a Partial result, Replicate ones added by one rank.
bool rule_scatter_partial(DimCtx& c) {
  const int ro = c.out_shapes[0].size();
  for (size_t i = 0; i < c.in.size(); ++i) {
    if (!c.has(i)) continue;
    const Placement& q = c.p(i);
    const bool data = c.rank(i) == ro && i != 1;  // input 1 is the index
    if (!data) {
      if (!q.is_replicate()) return c.fail(fmt::format("the index {} must be Replicate", pname(c, i)));
      continue;
    }
    if (q.is_replicate()) {
      c.root_only |= 1u << i;
    } else if (!is_psum(q)) {
      return c.fail(fmt::format("{}: with a Partial input, the others must be Partial(sum) or Replicate",
                                pname(c, i)));
    }
  }
  c.set_all(Placement::partial(PartialOp::kSum));
  return true;
}

bool rule_gather_like(DimCtx& c) {
  const int dim = static_cast<int>(c.op.args[0]);
  const int ro = c.out_shapes[0].size();
  if (c.op.args[1] == 1)
    for (size_t i = 0; i < c.in.size(); ++i)
      if (c.has(i) && c.p(i).is_partial()) return rule_scatter_partial(c);
  const Placement* common = nullptr;
  size_t first = 0;
  for (size_t i = 0; i < c.in.size(); ++i) {
    if (!c.has(i)) continue;
    const Placement& q = c.p(i);
    const bool full_rank = c.rank(i) == ro || (c.in.size() == 1 && c.rank(i) == ro - 1);  // one_hot
    if (q.is_partial()) return c.fail(fmt::format("{} is Partial: redistribute it to R", pname(c, i)));
    if (!full_rank) {
      if (!q.is_replicate()) return c.fail(fmt::format("the index {} must be Replicate", pname(c, i)));
      continue;
    }
    if (q.splits() && q.dim() == dim)
      return c.fail(fmt::format("'{}' works along dim {}, which {} splits: redistribute it to R there", c.op.name,
                                dim, pname(c, i)));
    if (common && *common != q)
      return c.fail(fmt::format("{} and {} must be placed alike", pname(c, first), pname(c, i)));
    if (common && q.splits() && c.shape(first)[q.dim()] != c.shape(i)[q.dim()])
      return c.fail(fmt::format("{} and {} split dims of different sizes ({} and {})", pname(c, first), pname(c, i),
                                c.shape(first)[q.dim()], c.shape(i)[q.dim()]));
    if (!common) {
      common = &q;
      first = i;
    }
  }
  c.set_all(common ? *common : Placement::replicate());
  return true;
}

bool rule_embedding(DimCtx& c) {  // weight [V, C]; the vocabulary-split case is a composite
  const Placement &w = c.p(0), &ids = c.p(1);
  const int ro = c.out_shapes[0].size();
  if (ids.is_partial()) return c.fail(fmt::format("the ids {} are Partial", ids.str()));
  if (w.splits()) {
    if (!ids.is_replicate())
      return c.fail(fmt::format("weight {} and ids {}: split one of them only", w.str(), ids.str()));
    c.set_all(with_dim(w, ro - 1));
    return true;
  }
  if (w.is_partial()) {
    if (!ids.is_replicate()) return c.fail(fmt::format("weight {} needs Replicate ids, got {}", w.str(), ids.str()));
    c.set_all(w);
    return true;
  }
  c.set_all(ids);
  return true;
}

bool rule_cross_entropy_rows(DimCtx& c) {  // reduction none, vocabulary not split
  const Placement &lg = c.p(0), &tg = c.p(1);
  if (lg.is_partial() || tg.is_partial())
    return c.fail(fmt::format("logits {} / target {}: Partial inputs must be redistributed to R", lg.str(), tg.str()));
  if (lg != tg)
    return c.fail(fmt::format("logits {} and target {} must split the rows alike", lg.str(), tg.str()));
  c.set_all(lg);
  return true;
}

bool decide(DimCtx& c) {
  switch (c.op.rule) {
    case DistRule::kElementwise:
    case DistRule::kLinear:
    case DistRule::kMulLike:
    case DistRule::kAffineScalar: return rule_pointwise(c);
    case DistRule::kReduce: return rule_reduce(c);
    case DistRule::kMatmul: return rule_matmul(c);
    case DistRule::kView: return rule_view(c);
    case DistRule::kSlice: return rule_slice(c);
    case DistRule::kNorm: return rule_norm(c);
    case DistRule::kRope: return rule_rope(c);
    case DistRule::kAttention: return rule_attention(c);
    case DistRule::kGatherLike: return rule_gather_like(c);
    case DistRule::kEmbedding: return rule_embedding(c);
    case DistRule::kCrossEntropy: return rule_cross_entropy_rows(c);
    case DistRule::kRandomFill: break;
  }
  return c.fail("no sharding rule");
}

}  // namespace

RuleResult propagate(const DistOp& op, const std::vector<const DTensorSpec*>& in, const std::vector<Shape>& out_shapes) {
  RuleResult r;
  const DTensorSpec* any = nullptr;
  for (const DTensorSpec* s : in)
    if (s) any = s;
  MT_ASSERT(any, "propagate({}) without inputs", op.name);
  const int ndim = any->mesh().ndim();
  r.outputs.assign(out_shapes.size(), Placements(static_cast<size_t>(ndim)));
  r.root_only.assign(in.size(), 0);
  for (int d = 0; d < ndim; ++d) {
    DimCtx c{op, in, out_shapes, d, {}, 0, {}};
    if (!decide(c)) {
      std::vector<std::string> ps;
      for (size_t i = 0; i < in.size(); ++i)
        if (in[i]) ps.push_back(fmt::format("{} {}", in[i]->global_shape(), placements_str(in[i]->placements())));
      r.error = fmt::format("{}: no sharding without communication on mesh dim {} ('{}') for inputs {}: {}",
                            op.name, d, any->mesh().names()[d], fmt::join(ps, ", "), c.why);
      return r;
    }
    for (size_t k = 0; k < out_shapes.size(); ++k) r.outputs[k][d] = c.out[k];
    for (size_t i = 0; i < in.size(); ++i)
      if ((c.root_only >> i) & 1) r.root_only[i] |= 1u << d;
    if (!out_shapes.empty() && is_psum(c.out[0])) r.partial_sum_dims |= 1u << d;
  }
  return r;
}

}  // namespace mt
