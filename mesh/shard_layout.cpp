// Local shard geometry: per tensor dim, a list of segments mapping local to global indices,
// refined placement by placement (each mesh dim selects index ranges of what the previous mesh
// dims left). Pieces are the cartesian product of the per-dim segments. local_shard is an
// independent narrow/cat implementation of the same rules, so tests can check one against the other.
#include "mesh/shard_layout.h"

#include <algorithm>
#include <functional>
#include <string>

#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops_index.h"
#include "tensor/ops_pointwise.h"
#include "tensor/random.h"

namespace mt {

IndexRange chunk_range(int64_t n, int64_t k, int64_t i) {
  MT_ASSERT(n >= 0 && k >= 1 && i >= 0 && i < k, "chunk_range({}, {}, {})", n, k, i);
  const int64_t size = (n + k - 1) / k;
  const int64_t start = std::min(i * size, n);
  return {start, std::min(size, n - start)};
}

namespace {

std::string context(const Shape& global_shape, const Placements& placements, const Shape& mesh_shape,
                    const Shape& coord) {
  return fmt::format("global shape {}, placements {}, mesh shape {}, coord {}", global_shape,
                     placements_str(placements), mesh_shape, coord);
}

void check_mesh(const char* op, const Shape& global_shape, const Placements& placements,
                const Shape& mesh_shape, const Shape& coord) {
  MT_CHECK(static_cast<int>(placements.size()) == mesh_shape.size(),
           "{}: {} placements for a {}-D mesh ({})", op, placements.size(), mesh_shape.size(),
           context(global_shape, placements, mesh_shape, coord));
  MT_CHECK(coord.size() == mesh_shape.size(), "{}: coord has {} dims, mesh has {} ({})", op,
           coord.size(), mesh_shape.size(), context(global_shape, placements, mesh_shape, coord));
  for (int i = 0; i < mesh_shape.size(); ++i) {
    MT_CHECK(mesh_shape[i] >= 1, "{}: mesh dim {} has size {} ({})", op, i, mesh_shape[i],
             context(global_shape, placements, mesh_shape, coord));
    MT_CHECK(coord[i] >= 0 && coord[i] < mesh_shape[i], "{}: coord {} is outside mesh shape {} ({})",
             op, coord, mesh_shape, context(global_shape, placements, mesh_shape, coord));
  }
  for (int64_t s : global_shape)
    MT_CHECK(s >= 0, "{}: negative size in global shape {}", op, global_shape);
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    if (!p.splits()) continue;
    MT_CHECK(p.dim() < global_shape.size(), "{}: {} on mesh dim {} names tensor dim {} of a {}-D tensor ({})",
             op, p.str(), i, p.dim(), global_shape.size(),
             context(global_shape, placements, mesh_shape, coord));
  }
}

// The context of an error message, formatted only when one is thrown (local_layout runs for every
// parameter at every coordinate of a plan: formatting it each time cost more than the layout).
struct LayoutCtx {
  const Shape& global_shape;
  const Placements& placements;
  const Shape& mesh_shape;
  const Shape& coord;
  std::string str() const { return context(global_shape, placements, mesh_shape, coord); }
};

// The index ranges (in the current local index space of a dim of size n) that coordinate c of k
// keeps under split placement p; concatenated in order they form the new local dim.
std::vector<IndexRange> split_ranges(const char* op, const Placement& p, int mesh_dim, int64_t n, int64_t k,
                                     int64_t c, const LayoutCtx& ctx) {
  switch (p.kind()) {
    case PlacementKind::kShard: return {chunk_range(n, k, c)};
    case PlacementKind::kInterleavedShard: {
      const int64_t g = p.groups();
      MT_CHECK(n % g == 0,
               "{}: {} on mesh dim {}: tensor dim {} has size {} here, not divisible by {} groups ({})", op,
               p.str(), mesh_dim, p.dim(), n, g, ctx.str());
      const int64_t m = n / g;
      std::vector<IndexRange> out;
      for (int64_t j = 0; j < g; ++j) {
        const IndexRange r = chunk_range(m, k, p.group_chunk(j, k, c));
        out.push_back({j * m + r.start, r.length});
      }
      return out;
    }
    case PlacementKind::kRaggedShard: {
      const auto& units = p.units();
      MT_CHECK(static_cast<int64_t>(units.size()) == k,
               "{}: {} on mesh dim {} gives units for {} ranks, the mesh dim has {} ({})", op, p.str(),
               mesh_dim, units.size(), k, ctx.str());
      int64_t total = 0, before = 0;
      for (size_t r = 0; r < units.size(); ++r) {
        if (static_cast<int64_t>(r) < c) before += units[r];
        total += units[r];
      }
      MT_CHECK(total * p.block() == n,
               "{}: {} on mesh dim {}: units per rank [{}] sum to {} units of {} rows = {}, but tensor "
               "dim {} has size {} here ({})",
               op, p.str(), mesh_dim, fmt::join(units, ","), total, p.block(), total * p.block(), p.dim(),
               n, ctx.str());
      return {{before * p.block(), units[static_cast<size_t>(c)] * p.block()}};
    }
    default: MT_ASSERT(false, "split_ranges on {}", p.str());
  }
  return {};
}

// Selects `ranges` (in current local indices) of a dim mapped by `segs`; returns the new segments.
std::vector<DimSegment> select(const std::vector<DimSegment>& segs, const std::vector<IndexRange>& ranges) {
  std::vector<DimSegment> out;
  int64_t pos = 0;
  for (const IndexRange& r : ranges) {
    for (const DimSegment& s : segs) {
      const int64_t lo = std::max(r.start, s.local_start);
      const int64_t hi = std::min(r.start + r.length, s.local_start + s.length);
      if (hi <= lo) continue;
      DimSegment n{pos + (lo - r.start), s.global_start + (lo - s.local_start), hi - lo};
      if (!out.empty() && out.back().local_start + out.back().length == n.local_start &&
          out.back().global_start + out.back().length == n.global_start)
        out.back().length += n.length;  // contiguous in both: one segment
      else
        out.push_back(n);
    }
    pos += r.length;
  }
  return out;
}

}  // namespace

LocalLayout local_layout(const Shape& global_shape, const Placements& placements, const Shape& mesh_shape,
                         const Shape& coord) {
  const char* op = "local_layout";
  check_mesh(op, global_shape, placements, mesh_shape, coord);
  LocalLayout L;
  L.global_shape = global_shape;
  L.global_strides = global_shape.contiguous_strides();
  L.local_shape = global_shape;
  const int nd = global_shape.size();
  L.segments.resize(static_cast<size_t>(nd));
  for (int d = 0; d < nd; ++d)
    if (global_shape[d] > 0) L.segments[static_cast<size_t>(d)].push_back({0, 0, global_shape[d]});

  for (int i = 0; i < mesh_shape.size(); ++i) {
    const Placement& p = placements[static_cast<size_t>(i)];
    if (!p.splits()) continue;
    const int d = p.dim();
    auto ranges = split_ranges(op, p, i, L.local_shape[d], mesh_shape[i], coord[i],
                               LayoutCtx{global_shape, placements, mesh_shape, coord});
    int64_t len = 0;
    for (const IndexRange& r : ranges) len += r.length;
    L.segments[static_cast<size_t>(d)] = select(L.segments[static_cast<size_t>(d)], ranges);
    L.local_shape[d] = len;
  }

  if (L.local_shape.numel() == 0) return L;
  // Cartesian product of the per-dim segments, last dim fastest.
  std::vector<size_t> idx(static_cast<size_t>(nd), 0);
  while (true) {
    ShardPiece piece;
    piece.local_offset.resize(nd);
    piece.sizes.resize(nd);
    piece.global_offset.resize(nd);
    for (int d = 0; d < nd; ++d) {
      const DimSegment& s = L.segments[static_cast<size_t>(d)][idx[static_cast<size_t>(d)]];
      piece.local_offset[d] = s.local_start;
      piece.sizes[d] = s.length;
      piece.global_offset[d] = s.global_start;
      piece.global_base += s.global_start * L.global_strides[d];
    }
    L.pieces.push_back(piece);
    int d = nd - 1;
    for (; d >= 0; --d) {
      auto& k = idx[static_cast<size_t>(d)];
      if (++k < L.segments[static_cast<size_t>(d)].size()) break;
      k = 0;
    }
    if (d < 0) break;
  }
  return L;
}

Tensor block_view(const Tensor& t, const Shape& offset, const Shape& sizes) {
  MT_ASSERT(offset.size() == t.dim() && sizes.size() == t.dim(), "block_view: offset {} sizes {} of {}",
            offset, sizes, t.shape());
  Tensor v = t;
  for (int d = 0; d < t.dim(); ++d)
    if (offset[d] != 0 || sizes[d] != t.size(d)) v = v.narrow(d, offset[d], sizes[d]);
  return v;
}

Tensor local_shard(const Tensor& global, const Placements& placements, const Shape& mesh_shape,
                   const Shape& coord) {
  const char* op = "local_shard";
  MT_CHECK(global.defined(), "{}: undefined tensor", op);
  const Shape& shape = global.shape();
  check_mesh(op, shape, placements, mesh_shape, coord);
  Tensor t = global;
  bool zero_term = false;
  for (int i = 0; i < mesh_shape.size(); ++i) {
    const Placement& p = placements[static_cast<size_t>(i)];
    const int64_t k = mesh_shape[i], c = coord[i];
    if (p.is_partial()) {
      if (p.reduce_op() == PartialOp::kSum && c != 0) zero_term = true;
      continue;
    }
    if (!p.splits()) continue;
    const int d = p.dim();
    const int64_t n = t.size(d);
    const LayoutCtx ctx{shape, placements, mesh_shape, coord};
    if (p.kind() == PlacementKind::kShard) {
      const IndexRange r = chunk_range(n, k, c);
      t = t.narrow(d, r.start, r.length);
    } else if (p.kind() == PlacementKind::kInterleavedShard) {
      MT_CHECK(n % p.groups() == 0,
               "{}: {} on mesh dim {}: tensor dim {} has size {} here, not divisible by {} groups ({})", op,
               p.str(), i, d, n, p.groups(), ctx.str());
      // [.., n, ..] -> [.., g, n/g, ..], shard the inner dim, flatten back.
      Shape grouped = t.shape();
      grouped[d] = n / p.groups();
      grouped.insert(d, p.groups());
      Tensor whole = t.contiguous().view(grouped);
      std::vector<Tensor> parts;
      int64_t len = 0;
      for (int64_t j = 0; j < p.groups(); ++j) {
        const IndexRange r = chunk_range(n / p.groups(), k, p.group_chunk(j, k, c));
        parts.push_back(whole.narrow(d, j, 1).narrow(d + 1, r.start, r.length).contiguous());
        len += r.length;
      }
      Shape flat = t.shape();
      flat[d] = len;
      t = cat(parts, d + 1).view(flat);
    } else {
      // Validation (unit count and sum) is shared with local_layout; the slice is computed here.
      split_ranges(op, p, i, n, k, c, ctx);
      int64_t before = 0;
      for (int64_t r = 0; r < c; ++r) before += p.units()[static_cast<size_t>(r)];
      t = t.narrow(d, before * p.block(), p.units()[static_cast<size_t>(c)] * p.block());
    }
  }
  return zero_term ? zeros(t.shape(), global.options().with_grad(false)) : t.clone();
}

Tensor assemble(const std::vector<Tensor>& locals_by_rank, const Shape& global_shape, const Placements& placements,
                const Shape& mesh_shape) {
  const char* op = "assemble";
  const int64_t world = mesh_shape.numel();
  MT_CHECK(static_cast<int64_t>(locals_by_rank.size()) == world,
           "{}: {} local tensors for mesh shape {} ({} ranks)", op, locals_by_rank.size(), mesh_shape, world);
  MT_CHECK(world >= 1 && locals_by_rank[0].defined(), "{}: no local tensors", op);
  const DType dtype = locals_by_rank[0].dtype();
  auto coord_of = [&](int64_t rank) {
    Shape c = Shape::filled(mesh_shape.size(), 0);
    for (int i = mesh_shape.size() - 1; i >= 0; --i) {
      c[i] = rank % mesh_shape[i];
      rank /= mesh_shape[i];
    }
    return c;
  };
  auto rank_of = [&](const Shape& c) {
    int64_t r = 0;
    for (int i = 0; i < mesh_shape.size(); ++i) r = r * mesh_shape[i] + c[i];
    return r;
  };

  NoGradGuard no_grad;  // a testing/checkpoint utility: never part of a graph
  Tensor global = zeros(global_shape, dtype);
  for (int64_t rank = 0; rank < world; ++rank) {
    const Shape coord = coord_of(rank);
    const LocalLayout L = local_layout(global_shape, placements, mesh_shape, coord);
    const Tensor& local = locals_by_rank[static_cast<size_t>(rank)];
    MT_CHECK(local.defined() && local.shape() == L.local_shape && local.dtype() == dtype,
             "{}: rank {} (coord {}) holds {} {}, expected {} {} ({})", op, rank, coord,
             local.defined() ? dtype_name(local.dtype()) : "undefined", local.defined() ? local.shape() : Shape{},
             dtype_name(dtype), L.local_shape, context(global_shape, placements, mesh_shape, coord));
    // One representative per group of ranks that differ only in Replicate/Partial coordinates.
    bool representative = true;
    for (int i = 0; i < mesh_shape.size(); ++i)
      if (!placements[static_cast<size_t>(i)].splits() && coord[i] != 0) representative = false;
    if (!representative) continue;

    Tensor value;
    {
      // Enumerate all partial coordinates (row-major) and reduce with each mesh dim's op, innermost
      // Partial dim first.
      std::vector<int> pdims;
      for (int i = 0; i < mesh_shape.size(); ++i)
        if (placements[static_cast<size_t>(i)].is_partial()) pdims.push_back(i);
      // reduce(level, c): the value of the group with partial dims pdims[level..] free.
      std::function<Tensor(size_t, Shape)> reduce = [&](size_t level, Shape c) -> Tensor {
        if (level == pdims.size()) return locals_by_rank[static_cast<size_t>(rank_of(c))];
        const int i = pdims[level];
        const PartialOp rop = placements[static_cast<size_t>(i)].reduce_op();
        Tensor acc;
        for (int64_t j = 0; j < mesh_shape[i]; ++j) {
          c[i] = j;
          Tensor term = reduce(level + 1, c);
          if (j == 0) acc = term;
          else if (rop == PartialOp::kMax) acc = maximum(acc, term);
          else if (rop == PartialOp::kMin) acc = minimum(acc, term);
          else acc = add(acc, term);
        }
        if (rop == PartialOp::kAvg) acc = div(acc, static_cast<double>(mesh_shape[i])).to(dtype);
        return acc;
      };
      value = reduce(0, coord);
    }
    for (const ShardPiece& piece : L.pieces) {
      Tensor dst = block_view(global, piece.global_offset, piece.sizes);
      dst.copy_(block_view(value, piece.local_offset, piece.sizes));
    }
  }
  return global;
}

void fill_random_sharded(Tensor& local, RandomDist dist, double a, double b, uint64_t seed, uint64_t offset,
                         const Shape& global_shape, const Placements& placements, const Shape& mesh_shape,
                         const Shape& coord) {
  const char* op = "fill_random_sharded";
  MT_CHECK(local.defined(), "{}: undefined tensor", op);
  check_mesh(op, global_shape, placements, mesh_shape, coord);
  for (size_t i = 0; i < placements.size(); ++i)
    MT_CHECK(!(placements[i].is_partial() && placements[i].reduce_op() == PartialOp::kSum),
             "{}: {} on mesh dim {}: a Partial(sum) random tensor is not meaningful (the sum of the "
             "terms would not be the single-device tensor); generate it Replicate ({})",
             op, placements[i].str(), i, context(global_shape, placements, mesh_shape, coord));
  const LocalLayout L = local_layout(global_shape, placements, mesh_shape, coord);
  MT_CHECK(local.shape() == L.local_shape, "{}: local tensor {} has shape {}, the shard has {} ({})", op,
           local.desc(), local.shape(), L.local_shape, context(global_shape, placements, mesh_shape, coord));
  for (const ShardPiece& piece : L.pieces) {
    Tensor v = block_view(local, piece.local_offset, piece.sizes);
    fill_random(v, dist, a, b, seed, offset, piece.global_base, L.global_strides);
  }
}

}  // namespace mt
