// Ring attention: see mesh/ring_attention.h and docs/context_parallel.md.
#include "mesh/ring_attention.h"

#include <limits>
#include <utility>

#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace mt {

namespace {

CpAttentionMode g_mode = CpAttentionMode::kRing;
CpAttentionStats g_stats;

int64_t bytes_of(const Tensor& t) { return t.numel() * dtype_size(t.dtype()); }

// Every rank sends x to rank + 1 and receives rank - 1's block (shape recv_shape), asynchronously:
// start_shift posts the exchange, finish_shift waits and records the differentiable op, so the
// block computation in between overlaps the transfer. Backward: the gradient of the received block
// goes back to rank - 1, the one of x comes from rank + 1. The exchange is an all_to_allv with one
// non-empty block per rank (grouped send/recv on NCCL: a cycle of plain sends, each waiting for its
// peer's receive queued behind the peer's own send, could deadlock on a device stream).
struct PendingShift {
  Work work;
  Shape shape;
};

Tensor flat_of(const Tensor& t) { return t.detach().contiguous().reshape(Shape{t.numel()}); }

Work post_shift(Communicator& comm, const Tensor& flat, int to, int from, int64_t recv_numel) {
  const int k = comm.size();
  std::vector<int64_t> sc(static_cast<size_t>(k), 0), rc(static_cast<size_t>(k), 0);
  sc[static_cast<size_t>(to)] = flat.numel();
  rc[static_cast<size_t>(from)] = recv_numel;
  g_stats.bytes_sent += bytes_of(flat);
  return comm.all_to_allv_async(flat, sc, rc);
}

PendingShift start_shift(const Tensor& x, Communicator& comm, const Shape& recv_shape) {
  const int k = comm.size(), me = comm.rank();
  return {post_shift(comm, flat_of(x), (me + 1) % k, (me + k - 1) % k, recv_shape.numel()), recv_shape};
}

Tensor finish_shift(const Tensor& x, PendingShift& p, Communicator comm) {
  p.work.wait();
  Tensor y = p.work.result().view(p.shape);
  if (needs_grad(x)) {
    const Shape xshape = x.shape();
    record("RingShiftBackward", {x}, y, [comm, xshape](const std::vector<Tensor>& g) mutable {
      const int k = comm.size(), me = comm.rank();
      Work w = post_shift(comm, flat_of(g[0]), (me + k - 1) % k, (me + 1) % k, xshape.numel());
      w.wait();
      return std::vector<Tensor>{w.result().view(xshape)};
    });
  }
  return y;
}

// All ranks' rows of x along dim 2, in rank order. Backward: the gathered gradient summed over the
// ranks, each keeping its own rows (reduce-scatter when the blocks are equal).
Tensor gather_seq(const Tensor& x, Communicator comm, const std::vector<int64_t>& lens) {
  const int k = comm.size(), me = comm.rank();
  int64_t total = 0, before = 0;
  bool equal = true;
  for (int r = 0; r < k; ++r) {
    if (r < me) before += lens[static_cast<size_t>(r)];
    total += lens[static_cast<size_t>(r)];
    equal = equal && lens[static_cast<size_t>(r)] == lens[0];
  }
  Tensor front = x.detach().permute({2, 0, 1, 3}).contiguous();  // [n, B, H, D]
  Tensor g = comm.all_gather_uneven(front);                      // [T, B, H, D]
  g_stats.bytes_sent += bytes_of(front) * (k - 1);               // ring all-gather: k - 1 blocks out
  Tensor y = g.permute({1, 2, 0, 3});
  if (needs_grad(x)) {
    const TensorOptions opts = x.options().with_grad(false);
    const int64_t n = x.size(2);
    record("GatherSeqBackward", {x}, y, [comm, opts, n, before, total, equal, k](const std::vector<Tensor>& gr) mutable {
      Tensor gf = gr[0].permute({2, 0, 1, 3}).contiguous();  // [T, B, H, D]
      Tensor mine;
      if (equal && total % k == 0) {
        Shape os = gf.shape();
        os[0] = n;
        mine = empty(os, opts);
        comm.reduce_scatter(gf, mine);
      } else {
        comm.all_reduce(gf);
        mine = gf.narrow(0, before, n).contiguous();
      }
      g_stats.bytes_sent += bytes_of(mine) * (k - 1);
      return std::vector<Tensor>{mine.permute({1, 2, 0, 3})};
    });
  }
  return y;
}

Tensor repeat_kv(const Tensor& t, int64_t hq) {
  const int64_t B = t.size(0), H = t.size(1), n = t.size(2), D = t.size(3);
  if (H == hq) return t;
  const int64_t rep = hq / H;
  return t.unsqueeze(2).expand(Shape{B, H, rep, n, D}).reshape(Shape{B, hq, n, D});
}

// One block's attention with its log-sum-exp: o [B, H, nq, Dv], lse [B, H, nq, 1], both in sdt.
struct BlockOut {
  Tensor o, lse;
};

BlockOut attend_block(const Tensor& q, const Tensor& k, const Tensor& v, bool diagonal, double scale, DType sdt,
                      const CpDropout* drop, int64_t qpos, int64_t kpos) {
  Tensor s = mul(matmul(q, k.transpose(2, 3)), scale).to(sdt);
  if (diagonal) {
    const int64_t n = q.size(2);
    std::vector<uint8_t> m(static_cast<size_t>(n * n));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) m[static_cast<size_t>(i * n + j)] = j > i ? 1 : 0;
    Tensor mask = from_vector<uint8_t>(m, Shape{n, n}).to(DType::kBool);
    if (mask.device() != q.device()) mask = mask.to(q.device());
    s = masked_fill(s, mask, -std::numeric_limits<double>::infinity());
  }
  Tensor mx = max(s.detach(), -1, KeepDim::kYes);  // every row has a visible key (the diagonal's own)
  Tensor e = exp(sub(s, mx));
  Tensor l = sum(e, {-1}, KeepDim::kYes);
  Tensor probs = div(e, l);
  if (drop && drop->p > 0) {
    // As the eager path: probabilities cast to q's dtype, then the dropout of their global elements.
    // The output stays normalized by the undropped sum l, so the merge below is unchanged.
    const double keep = 1 - drop->p;
    Tensor mask = empty(probs.shape(), q.options().with_grad(false));
    fill_random(mask, RandomDist::kBernoulli, keep, 0, drop->seed, drop->offset,
                drop->base + qpos * drop->strides[2] + kpos * drop->strides[3], drop->strides);
    probs = div(mul(probs.to(q.dtype()), mask), keep).to(sdt);
  }
  Tensor o = matmul(probs, v.to(sdt));
  return {o, add(mx, log(l))};
}

// Online softmax: the merge of two partial results over disjoint key sets.
void merge(BlockOut& acc, BlockOut b) {
  if (!acc.o.defined()) {
    acc = std::move(b);
    return;
  }
  Tensor m = maximum(acc.lse, b.lse).detach();
  Tensor wa = exp(sub(acc.lse, m)), wb = exp(sub(b.lse, m));
  Tensor den = add(wa, wb);
  acc.o = div(add(mul(acc.o, wa), mul(b.o, wb)), den);
  acc.lse = add(m, log(den));
}

struct Chunk {
  int64_t local = 0, global = 0, length = 0;
};

std::vector<Chunk> chunks_of(const std::vector<DimSegment>& segs, int64_t local_base = 0) {
  std::vector<Chunk> out;
  for (const DimSegment& s : segs)
    if (s.length > 0) out.push_back({local_base + s.local_start, s.global_start, s.length});
  return out;
}

int64_t rows_of(const std::vector<DimSegment>& segs) {
  int64_t n = 0;
  for (const DimSegment& s : segs) n += s.length;
  return n;
}

// Adds the visible (q chunk, k chunk) blocks of one k/v block to the accumulators. Returns
// whether any block used kb.
bool attend(std::vector<BlockOut>& acc, const std::vector<Chunk>& qc, const Tensor& q, const std::vector<Chunk>& kc,
            const Tensor& kb, const Tensor& vb, bool causal, double scale, DType sdt, const CpDropout* drop) {
  bool used = false;
  for (size_t i = 0; i < qc.size(); ++i) {
    const Chunk& a = qc[i];
    for (const Chunk& b : kc) {
      bool diagonal = false;
      if (causal) {
        if (b.global >= a.global + a.length) {
          ++g_stats.blocks_skipped;
          continue;  // every key after every query
        }
        if (b.global + b.length > a.global) {
          MT_CHECK(b.global == a.global && b.length == a.length,
                   "context-parallel attention: query rows [{}, {}) and key rows [{}, {}) overlap without being "
                   "the same chunk (the sequence split must be the same for q and k/v)",
                   a.global, a.global + a.length, b.global, b.global + b.length);
          diagonal = true;
        }
      }
      ++g_stats.blocks_computed;
      g_stats.scores_computed += diagonal ? a.length * (a.length + 1) / 2 : a.length * b.length;
      used = true;
      merge(acc[i], attend_block(q.narrow(2, a.local, a.length), kb.narrow(2, b.local, b.length),
                                 vb.narrow(2, b.local, b.length), diagonal, scale, sdt, drop, a.global, b.global));
    }
  }
  return used;
}

}  // namespace

void set_cp_attention_mode(CpAttentionMode m) { g_mode = m; }
CpAttentionMode cp_attention_mode() { return g_mode; }
CpAttentionStats& cp_attention_stats() { return g_stats; }

Tensor context_parallel_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const std::vector<std::vector<DimSegment>>& segs, Communicator comm, bool causal,
                                  double scale, const CpDropout* drop) {
  MT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "context-parallel attention: expected 4-D q, k, v; got {}, {}, {}", q.shape(), k.shape(), v.shape());
  const int64_t B = q.size(0), Hq = q.size(1), nq = q.size(2), Dv = v.size(3);
  MT_CHECK(k.size(1) > 0 && Hq % k.size(1) == 0, "context-parallel attention: {} query heads for {} kv heads", Hq,
           k.size(1));
  // Meta tensors on a simulated communicator (`meshtrain plan --estimate`, docs/estimate.md): the
  // ring runs as below, block by block, so the estimate keeps what the real forward keeps and
  // counts every shift (all_to_allv over the cp dim) forward and backward. Other meta calls
  // (plan checks on a real mesh, the gather mode) only get the output's shape.
  if (q.is_meta() && (!comm.defined() || !comm.is_simulated() || g_mode == CpAttentionMode::kGather))
    return empty(Shape{B, Hq, nq, Dv}, q.options().with_grad(false));
  const int kr = comm.size(), me = comm.rank();
  MT_CHECK(static_cast<int>(segs.size()) == kr, "context-parallel attention: {} segment lists for {} ranks",
           segs.size(), kr);
  const DType sdt = q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const std::vector<Chunk> qc = chunks_of(segs[static_cast<size_t>(me)]);
  std::vector<BlockOut> acc(qc.size());
  std::vector<Tensor> unused;  // received blocks no query needed: kept in the graph (see below)
  if (g_mode == CpAttentionMode::kGather) {
    std::vector<int64_t> lens;
    std::vector<DimSegment> all;
    int64_t base = 0;
    for (const auto& s : segs) {
      for (DimSegment d : s) {
        d.local_start += base;
        all.push_back(d);
      }
      lens.push_back(rows_of(s));
      base += lens.back();
    }
    Tensor kg = repeat_kv(gather_seq(k, comm, lens), Hq), vg = repeat_kv(gather_seq(v, comm, lens), Hq);
    if (!attend(acc, qc, q, chunks_of(all), kg, vg, causal, scale, sdt, drop))
      unused.push_back(kg), unused.push_back(vg);
  } else {
    Tensor kb = k, vb = v;
    for (int step = 0; step < kr; ++step) {
      const int src = (me - step + kr) % kr;
      // Post the next step's exchange first: the transfer runs while this block is computed.
      PendingShift pk, pv;
      const bool more = step + 1 < kr;
      if (more) {
        Shape ks = kb.shape(), vs = vb.shape();
        ks[2] = vs[2] = rows_of(segs[static_cast<size_t>((src - 1 + kr) % kr)]);
        pk = start_shift(kb, comm, ks);
        pv = start_shift(vb, comm, vs);
      }
      if (!attend(acc, qc, q, chunks_of(segs[static_cast<size_t>(src)]), repeat_kv(kb, Hq), repeat_kv(vb, Hq),
                  causal, scale, sdt, drop))
        unused.push_back(kb), unused.push_back(vb);
      if (more) {
        kb = finish_shift(kb, pk, comm);
        vb = finish_shift(vb, pv, comm);
      }
    }
  }
  Tensor out;
  if (qc.empty()) {
    // No sequence rows here (a plain split of a short sequence over many ranks): the output is
    // empty, but this rank still takes part in the backward's collectives below, and q's producer
    // gets its (zero) gradient like on every other rank.
    out = zeros(Shape{B, Hq, 0, Dv}, q.options().with_dtype(sdt).with_grad(false));
    if (needs_grad(q)) unused.push_back(q);
  } else {
    std::vector<Tensor> parts;
    for (BlockOut& a : acc) parts.push_back(a.o);
    out = parts.size() == 1 ? parts[0] : cat(parts, 2);
  }
  // A received block that no query of this rank sees (an unbalanced causal split) still has to
  // send its (zero) gradient back around the ring, or the peers' backward would wait for it: it
  // joins the graph with weight zero.
  for (const Tensor& u : unused)
    if (needs_grad(u)) out = add(out, mul(sum(u).to(out.dtype()), 0.0));
  return out.to(q.dtype());
}

}  // namespace mt
