// redistribute_local: one mesh dim at a time (docs/placements.md, "Redistribute").
//
// The "level j" tensor of a rank is what placements 0..j-1 leave it (the global tensor narrowed by
// the earlier mesh dims at this rank's coordinates); placement j splits or holds terms of it. A
// change on mesh dim j is done with the collectives of mesh dim j's group while every later mesh
// dim is Replicate, so the local tensor before the step is the whole level-j tensor (or a term).
#include "mesh/redistribute.h"

#include <fmt/format.h>

#include <exception>
#include <string>
#include <vector>

#include "mesh/collective_count.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"
#include "tensor/autograd.h"

namespace mt {
namespace {

// A fresh contiguous copy (never sharing storage with t).
Tensor fresh(const Tensor& t) { return t.is_contiguous() ? t.clone() : t.contiguous(); }

// Dim d first, the others in order; contiguous.
Tensor to_front(const Tensor& t, int d) {
  if (d == 0) return t.contiguous();
  std::vector<int64_t> perm{d};
  for (int i = 0; i < t.dim(); ++i)
    if (i != d) perm.push_back(i);
  return t.permute(perm).contiguous();
}

// Inverse of to_front: dim 0 goes back to position d; contiguous.
Tensor from_front(const Tensor& t, int d) {
  if (d == 0) return t.contiguous();
  std::vector<int64_t> perm;
  for (int i = 1; i <= d; ++i) perm.push_back(i);
  perm.push_back(0);
  for (int i = d + 1; i < t.dim(); ++i) perm.push_back(i);
  return t.permute(perm).contiguous();
}

struct Ctx {
  const Shape& global_shape;
  const DeviceMesh& mesh;
  Shape mesh_shape;
  Shape coord;
  std::string what;  // "redistribute([..] -> [..], global shape [..], DeviceMesh(..))"
};

// Shape of the level-j tensor under placements `cur` (only cur[0..j) matter).
Shape level_shape(const Ctx& c, const Placements& cur, int j) {
  if (j == 0) return c.global_shape;
  Placements head(cur.begin(), cur.begin() + j);
  Shape ms, co;
  for (int i = 0; i < j; ++i) {
    ms.push_back(c.mesh_shape[i]);
    co.push_back(c.coord[i]);
  }
  return local_layout(c.global_shape, head, ms, co).local_shape;
}

// Rows of the level dim (size n) that group rank r holds under split placement p on k ranks, as
// a list of (start, length) ranges in local order.
std::vector<IndexRange> split_ranges(const Placement& p, int64_t n, int64_t k, int64_t r) {
  switch (p.kind()) {
    case PlacementKind::kShard: return {chunk_range(n, k, r)};
    case PlacementKind::kRaggedShard: {
      int64_t start = 0;
      for (int64_t i = 0; i < r; ++i) start += p.units()[static_cast<size_t>(i)];
      return {IndexRange{start * p.block(), p.units()[static_cast<size_t>(r)] * p.block()}};
    }
    case PlacementKind::kInterleavedShard: {
      const int64_t m = n / p.groups();
      std::vector<IndexRange> out;
      for (int64_t g = 0; g < p.groups(); ++g) {
        const IndexRange ch = chunk_range(m, k, p.group_chunk(g, k, r));
        out.push_back(IndexRange{g * m + ch.start, ch.length});
      }
      return out;
    }
    default: break;
  }
  MT_ASSERT(false, "split_ranges on {}", p.str());
  return {};
}

int64_t total_length(const std::vector<IndexRange>& rs) {
  int64_t n = 0;
  for (const auto& r : rs) n += r.length;
  return n;
}

// Placement p on mesh dim j -> Replicate. x is this rank's local tensor; level is the level-j shape.
Tensor to_replicate(const Ctx& c, const Tensor& x, const Placement& p, int j, const Shape& level) {
  if (p.is_replicate()) return x;
  Communicator comm = c.mesh.comm(j);
  if (p.is_partial()) {
    Tensor y = fresh(x);
    comm.all_reduce(y, comm_reduce_op(p.reduce_op()));
    return y;
  }
  const int d = p.dim();
  const int64_t n = level[d], k = comm.size();
  Tensor y = to_front(x, d);
  Tensor g;
  if (p.is_shard() && n % k == 0) {
    Shape os = y.shape();
    os[0] = n;
    g = empty(os, y.options().with_grad(false));
    comm.all_gather(y, g);
  } else {
    g = comm.all_gather_uneven(y);
  }
  MT_ASSERT(g.size(0) == n, "{}: gathered {} rows of {} along tensor dim {} on mesh dim {}", c.what,
            g.size(0), n, d, j);
  if (p.kind() == PlacementKind::kInterleavedShard) {
    // Gathered: rank by rank, each rank's ranges in order; put every range at its place.
    Tensor out = empty(g.shape(), g.options().with_grad(false));
    int64_t off = 0;
    for (int64_t r = 0; r < k; ++r)
      for (const IndexRange& ir : split_ranges(p, n, k, r)) {
        if (ir.length > 0) out.narrow(0, ir.start, ir.length).copy_(g.narrow(0, off, ir.length));
        off += ir.length;
      }
    g = out;
  }
  return from_front(g, d);
}

// Replicate on mesh dim j -> placement p (no communication). x holds the level-j tensor.
Tensor from_replicate(const Ctx& c, const Tensor& x, const Placement& p, int j) {
  const int64_t k = c.mesh_shape[j], r = c.coord[j];
  if (p.is_replicate()) return x;
  if (p.is_partial()) {
    if (p.reduce_op() == PartialOp::kSum && r != 0) return zeros(x.shape(), x.options().with_grad(false));
    return fresh(x);
  }
  const int d = p.dim();
  const auto ranges = split_ranges(p, x.size(d), k, r);
  if (ranges.size() == 1) return fresh(x.narrow(d, ranges[0].start, ranges[0].length));
  Shape os = x.shape();
  os[d] = total_length(ranges);
  Tensor out = empty(os, x.options().with_grad(false));
  int64_t off = 0;
  for (const IndexRange& ir : ranges) {
    if (ir.length > 0) out.narrow(d, off, ir.length).copy_(x.narrow(d, ir.start, ir.length));
    off += ir.length;
  }
  return out;
}

// S(a) -> S(b) on mesh dim j (a != b), every later mesh dim Replicate: one all_to_allv of flat
// blocks. The block for rank r is my rows of a times r's rows of b, with dim a first, so that the
// blocks received from ranks 0..k-1 concatenate along dim a.
Tensor shard_to_shard(const Ctx& c, const Tensor& x, int a, int b, int j, const Shape& level) {
  Communicator comm = c.mesh.comm(j);
  const int64_t k = comm.size(), me = comm.rank();
  const int64_t na = level[a], nb = level[b];
  int64_t other = 1;
  for (int i = 0; i < x.dim(); ++i)
    if (i != a && i != b) other *= x.size(i);
  const int64_t my_a = chunk_range(na, k, me).length, my_b = chunk_range(nb, k, me).length;
  std::vector<int64_t> send(static_cast<size_t>(k)), recv(static_cast<size_t>(k));
  int64_t total = 0;
  for (int64_t r = 0; r < k; ++r) {
    send[static_cast<size_t>(r)] = my_a * other * chunk_range(nb, k, r).length;
    recv[static_cast<size_t>(r)] = chunk_range(na, k, r).length * other * my_b;
    total += send[static_cast<size_t>(r)];
  }
  Tensor buf = empty(Shape{total}, x.options().with_grad(false));
  int64_t off = 0;
  for (int64_t r = 0; r < k; ++r) {
    const IndexRange cb = chunk_range(nb, k, r);
    const int64_t cnt = send[static_cast<size_t>(r)];
    if (cnt > 0) {
      Tensor block = to_front(x.narrow(b, cb.start, cb.length), a);
      buf.narrow(0, off, cnt).view(block.shape()).copy_(block);
    }
    off += cnt;
  }
  Tensor got = comm.all_to_allv(buf, send, recv);
  Shape ys = x.shape();
  ys[a] = na;
  ys[b] = my_b;
  Shape fs{na};  // ys with dim a first
  for (int i = 0; i < x.dim(); ++i)
    if (i != a) fs.push_back(ys[i]);
  return from_front(got.view(fs), a);
}

// P(op) -> S(d) on mesh dim j, every later mesh dim Replicate.
Tensor partial_to_shard(const Ctx& c, const Tensor& x, const Placement& p, const Placement& q, int j,
                        const Shape& level) {
  Communicator comm = c.mesh.comm(j);
  const int d = q.dim();
  const int64_t n = level[d], k = comm.size();
  if (n % k != 0 || n == 0) return from_replicate(c, to_replicate(c, x, p, j, level), q, j);
  Tensor y = to_front(x, d);
  Shape os = y.shape();
  os[0] = n / k;
  Tensor out = empty(os, y.options().with_grad(false));
  comm.reduce_scatter(y, out, comm_reduce_op(p.reduce_op()));
  return from_front(out, d);
}

// p -> q on mesh dim j, every later mesh dim Replicate.
Tensor transition(const Ctx& c, const Tensor& x, const Placement& p, const Placement& q, int j,
                  const Shape& level) {
  if (p.is_replicate()) return from_replicate(c, x, q, j);
  if (q.is_replicate()) return to_replicate(c, x, p, j, level);
  if (p.is_shard() && q.is_shard()) return shard_to_shard(c, x, p.dim(), q.dim(), j, level);
  if (p.is_partial() && q.is_shard()) return partial_to_shard(c, x, p, q, j, level);
  return from_replicate(c, to_replicate(c, x, p, j, level), q, j);
}

// ---- counting without data (meta tensors on a simulated mesh) ----------------------------------
// The collectives the steps above would run, from shapes alone, counted as the Communicator
// counts them (mesh/collective_count.h): to_replicate is an all_reduce (Partial) or an all_gather
// (split) of the whole level tensor, shard_to_shard an all_to_all of the local tensor,
// partial_to_shard a reduce_scatter of the level tensor (an all_reduce when it does not divide).

void count_to_replicate(const Ctx& c, const Placement& p, int j, const Shape& level, int64_t es) {
  if (p.is_replicate()) return;
  count_collective(p.is_partial() ? "all_reduce" : "all_gather", c.mesh.dim_label(j), c.mesh_shape[j],
                   level.numel() * es);
}

void count_transition(const Ctx& c, const Placement& p, const Placement& q, int j, const Shape& level, int64_t es) {
  if (p.is_replicate()) return;
  if (q.is_replicate()) return count_to_replicate(c, p, j, level, es);
  const int64_t k = c.mesh_shape[j];
  if (p.is_shard() && q.is_shard()) {
    const Shape mine = local_layout(level, Placements{p}, Shape{k}, Shape{c.coord[j]}).local_shape;
    count_collective("all_to_all", c.mesh.dim_label(j), k, mine.numel() * es);
    return;
  }
  if (p.is_partial() && q.is_shard()) {
    const int64_t n = level[q.dim()];
    count_collective(n % k != 0 || n == 0 ? "all_reduce" : "reduce_scatter", c.mesh.dim_label(j), k,
                     level.numel() * es);
    return;
  }
  count_to_replicate(c, p, j, level, es);
}

void count_redistribute(const Ctx& c, const Placements& src, const Placements& dst, DType dtype) {
  const int nd = c.mesh.ndim();
  const int64_t es = static_cast<int64_t>(dtype_size(dtype));
  int i0 = 0;
  while (i0 < nd && src[static_cast<size_t>(i0)] == dst[static_cast<size_t>(i0)]) ++i0;
  if (i0 == nd) return;
  Placements cur = src;
  for (int j = nd - 1; j > i0; --j) {
    count_to_replicate(c, cur[static_cast<size_t>(j)], j, level_shape(c, cur, j), es);
    cur[static_cast<size_t>(j)] = Placement::replicate();
  }
  count_transition(c, cur[static_cast<size_t>(i0)], dst[static_cast<size_t>(i0)], i0, level_shape(c, cur, i0), es);
}

}  // namespace

Tensor redistribute_local(const Tensor& local, const Shape& global_shape, const Placements& src,
                          const Placements& dst, const DeviceMesh& mesh) {
  Ctx c{global_shape, mesh, mesh.shape(), Shape{},
        fmt::format("redistribute({} -> {}, global shape {}, {})", placements_str(src),
                    placements_str(dst), global_shape, mesh.str())};
  for (int64_t v : mesh.coordinates()) c.coord.push_back(v);
  const int nd = mesh.ndim();
  MT_CHECK(local.defined(), "{}: undefined local tensor", c.what);
  MT_CHECK(static_cast<int>(src.size()) == nd && static_cast<int>(dst.size()) == nd,
           "{}: need one placement per mesh dim ({}), got {} source and {} destination placements",
           c.what, nd, src.size(), dst.size());
  Shape src_local, dst_local;
  try {
    src_local = local_layout(global_shape, src, c.mesh_shape, c.coord).local_shape;
    dst_local = local_layout(global_shape, dst, c.mesh_shape, c.coord).local_shape;
  } catch (const std::exception& e) {
    MT_FAIL("{}: {}", c.what, e.what());
  }
  MT_CHECK(local.shape() == src_local, "{}: local tensor has shape {}, the source shard at mesh coordinate {} has {}",
           c.what, local.shape(), c.coord, src_local);
  // A meta tensor has no values to move: the result is the destination shard's shape (plan checks
  // run whole forwards this way, on a simulated mesh without communicators).
  if (local.is_meta()) {
    if (CollectiveCountScope::active()) count_redistribute(c, src, dst, local.dtype());
    return empty(dst_local, local.options());
  }
  MT_CHECK(local.device().is_cpu() || local.device().is_cuda(), "{}: local tensor {} is neither a host nor a CUDA tensor",
           c.what, local.desc());

  int i0 = 0;
  while (i0 < nd && src[static_cast<size_t>(i0)] == dst[static_cast<size_t>(i0)]) ++i0;
  if (i0 == nd) return local;

  NoGradGuard no_grad;
  Placements cur = src;
  Tensor x = local;
  // Undo every later mesh dim (right to left): its split is nested in the one being changed.
  for (int j = nd - 1; j > i0; --j) {
    x = to_replicate(c, x, cur[static_cast<size_t>(j)], j, level_shape(c, cur, j));
    cur[static_cast<size_t>(j)] = Placement::replicate();
  }
  x = transition(c, x, cur[static_cast<size_t>(i0)], dst[static_cast<size_t>(i0)], i0,
                 level_shape(c, cur, i0));
  cur[static_cast<size_t>(i0)] = dst[static_cast<size_t>(i0)];
  // Re-apply the destination on the later mesh dims, left to right.
  for (int j = i0 + 1; j < nd; ++j) {
    x = from_replicate(c, x, dst[static_cast<size_t>(j)], j);
    cur[static_cast<size_t>(j)] = dst[static_cast<size_t>(j)];
  }
  if (x.same(local)) x = fresh(x);
  MT_ASSERT(x.shape() == dst_local, "{}: produced shape {}, expected {}", c.what, x.shape(), dst_local);
  return x;
}

CommReduceOp comm_reduce_op(PartialOp op) {
  switch (op) {
    case PartialOp::kSum: return CommReduceOp::kSum;
    case PartialOp::kAvg: return CommReduceOp::kAvg;
    case PartialOp::kMax: return CommReduceOp::kMax;
    case PartialOp::kMin: return CommReduceOp::kMin;
  }
  return CommReduceOp::kSum;
}

}  // namespace mt
