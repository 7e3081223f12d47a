// One FSDP unit's DBuffer (fsdp_buffer.h, docs/fsdp.md).
#include "plan/fsdp_buffer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>

#include "kernels/registry.h"
#include "mesh/collective_count.h"
#include "mesh/dtensor.h"
#include "mesh/redistribute.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/checkpoint.h"
#include "tensor/grad_destination.h"

namespace mt {
namespace {

std::atomic<int64_t> g_all_gathers{0}, g_reduce_scatters{0}, g_forward_bytes{0}, g_backward_bytes{0},
    g_adoption_bytes{0}, g_prefetches{0}, g_prefetch_hits{0}, g_replica_all_reduces{0}, g_buffer_allocations{0},
    g_buffer_refills{0}, g_zero_copy_grads{0}, g_ordered_reductions{0}, g_reductions_in_flight{0};

// A unit's gradient reduction, possibly in flight ("Reductions in flight" below).
struct UnitReduction {
  std::shared_ptr<FsdpUnitBuffer::State> unit;
  Work scatter, reduce;       // the reduce-scatter; the last HSDP all-reduce
  std::vector<int> replicas;  // the HSDP dims its gradient shard is summed over after the scatter
  Tensor out;                 // the gradient shard
  bool settled = false;       // the reduce-scatter has completed and the all-reduces started
  void settle();
  void complete() {
    settle();
    reduce.wait();
  }
};

// Reductions in flight, oldest first. A unit's reduce-scatter starts as its backward ends and is
// waited for when the next unit's backward ends (its HSDP all-reduces start then), and everything
// completes when the backward pass ends (queue_backward_callback), or earlier for a unit that
// needs its gradient buffer again. These points are the same on every rank (the graph is), so
// every rank starts its collectives in the same order; between them, the collectives overlap the
// backward of the units that follow. One thread runs backward passes (the engine's).
std::deque<UnitReduction> g_in_flight;
bool g_end_queued = false;

// Completes the oldest reductions: all of them, or up to the last of `unit`'s.
void complete_in_flight(const FsdpUnitBuffer::State* unit = nullptr);

}  // namespace

FsdpCounters fsdp_counters() {
  return {g_all_gathers.load(),    g_reduce_scatters.load(), g_forward_bytes.load(), g_backward_bytes.load(),
          g_adoption_bytes.load(), g_prefetches.load(),      g_prefetch_hits.load(),
          g_replica_all_reduces.load(), g_buffer_allocations.load(), g_buffer_refills.load(),
          g_zero_copy_grads.load(), g_ordered_reductions.load(), g_reductions_in_flight.load()};
}

void reset_fsdp_counters() {
  g_all_gathers = g_reduce_scatters = g_forward_bytes = g_backward_bytes = g_adoption_bytes = 0;
  g_prefetches = g_prefetch_hits = g_replica_all_reduces = 0;
  g_buffer_allocations = g_buffer_refills = g_zero_copy_grads = g_ordered_reductions = g_reductions_in_flight = 0;
}

// Everything the autograd node needs outlives the FsdpUnitBuffer (a graph may be alive after the
// hooks are removed), so it lives here, shared.
struct FsdpUnitBuffer::State {
  struct Param {
    std::string path;
    Tensor stored;           // the parameter (DTensor of its RaggedShard storage; TensorImpl kept)
    Shape global_shape;      // of the parameter
    Placements init, run;    // storage and compute placements
    Shape run_local;         // compute tensor's local shape (the TP shard the layout divides)
    int64_t offset = 0;      // in the full buffer (elements)
    int64_t numel = 0;       // of the compute tensor
    int64_t shard_offset = 0, shard_numel = 0;  // this rank's piece, in the shard buffer
    Shape stored_local;      // the piece's local shape
  };
  explicit State(const DeviceMesh& m) : mesh(m) {}
  std::string module;
  std::vector<std::string> paths;
  std::map<std::string, size_t> index;
  std::vector<Param> params;
  DeviceMesh mesh;
  int dim = -1;
  int64_t group = 1, rank = 0, shard_size = 0;
  ~State() { unregister(); }
  Tensor shard;                       // [shard_size]: the parameters' storage
  Tensor full;                        // [group * shard_size]: the gathered parameters (made once)
  // Zero-copy gradients: the weight-gradient formulas write each gradient straight into
  // grad_full at its parameter's offset (tensor/grad_destination.h); the reduce-scatter reads it
  // and writes into grad_shard, whose views become the parameters' .grad (lent, not cloned).
  // grad_scratch takes the reduce-scatter while .grad still views grad_shard (accumulation).
  Tensor grad_full, grad_shard, grad_scratch;
  Tensor grad_recv;                   // ordered reduction: every rank's chunk of my shard
  bool ordered = false;               // reduce in rank order (all-to-all + sums), not reduce-scatter
  bool async_reduce = true;           // leave the reduction in flight (below, "Reductions in flight")
  int in_flight = 0;                  // this unit's entries in the in-flight queue
  std::vector<char> claimed;          // per parameter: its destination was handed out
  // Recorded gathers whose backward has not run yet. Under a pipeline schedule several are alive
  // at once (micro-batch m+1's forward before m's backward); the parameters do not change within
  // the step, so every node's saved views read the same `full`, and their backwards run one at a
  // time (each micro-batch's backward is one autograd run): `claimed` is per backward, reset by
  // the node that ran it, and destinations are handed out while any node is pending.
  int64_t nodes_pending = 0;
  // Activation recomputation (tensor/checkpoint.h) runs a module's forward again inside the
  // backward, where no forward hook fires. From begin_backward() until the unit's gradients are
  // reduced, `full` holds the gathered parameters, so a gather then (a recomputation) takes views
  // of it and no all-gather. Its node is a *partial* one when the forward recorded a node too
  // (selective recomputation: the recomputed submodule's gradients land in grad_full, the forward's
  // node reduces them with the rest); otherwise (the unit recomputed whole, whose forward ran
  // without grad) it is the unit's only node and reduces. `gathered` is reused only within the pass
  // that made it (`gathered_replay`), so a later recomputation (the next micro-batch's, another
  // submodule's, a nested one) never reads views of another pass's node.
  bool in_backward = false;
  std::vector<int> partial_replicas;  // the HSDP dims of the partial nodes' gradients
  std::vector<char> contributed;      // per parameter: a partial node put its gradient in grad_full
  uint64_t gathered_replay = 0;       // the recomputation `gathered` was made in (0: a forward)
  bool zero_copy = true;              // hand out gradient destinations
  std::vector<std::pair<int64_t, int64_t>> gaps;  // [begin, end) of grad_full no parameter covers
  std::map<int64_t, size_t> by_offset;            // full-buffer offset -> parameter (numel > 0)
  const Storage* registered = nullptr;            // full's storage, in the destination registry
  const Storage* lending = nullptr;               // grad_shard's storage, lending .grad views
  const Storage* accumulating = nullptr;          // grad_full's storage, a gradient accumulator
  std::vector<Tensor> gathered;       // this forward's compute tensors (empty: not gathered yet)
  bool reshard = false;               // free `full` after the forward, gather again for backward
  bool prefetchable = true;           // the unit before it may start its gathers (link_prefetch)
  bool resharded = false;             // `full`'s memory is freed
  // Prefetch (link_prefetch): an all-gather into `full` started ahead of this unit's gather.
  Work pending;
  bool prefetched = false, pending_backward = false;
  uint64_t pending_pass = 0;
  uint32_t pending_version = 0;       // `full`'s storage version before a backward regather
  uint64_t gathered_pass = ~uint64_t{0};  // the model forward pass of the last forward gather
  std::shared_ptr<uint64_t> passes;   // the model's forward passes (shared by the linked units)
  std::weak_ptr<State> next_forward, next_backward;

  uint64_t pass() const { return passes ? *passes : 0; }

  // A buffer of n elements like the shard (its dtype and device), made once: counted.
  Tensor make_buffer(int64_t n) const {
    ++g_buffer_allocations;
    return empty(Shape{n}, TensorOptions(shard.dtype()).with_device(shard.device()));
  }
  // `t` made once (again only after the parameters moved to another device or dtype) and its
  // memory there (re-acquired after a reshard freed it).
  void ensure(Tensor& t, int64_t n) {
    if (!t.defined() || t.dtype() != shard.dtype() || t.device() != shard.device()) {
      t = make_buffer(n);
      return;
    }
    Storage* st = t.impl()->storage.get();
    if (st && !st->has_data()) {
      st->allocate_data();
      ++g_buffer_refills;
    }
  }
  void ensure_full() {
    ensure(full, group * shard_size);
    const Storage* st = full.impl()->storage.get();
    if (st == registered) return;
    unregister();
    if (!st) return;
    std::weak_ptr<State> weak = self;
    set_grad_destination(st, [weak](const Tensor& w) {
      auto s = weak.lock();
      return s ? s->destination(w) : Tensor();
    });
    registered = st;
  }
  void unregister() {
    if (registered) set_grad_destination(registered, nullptr);
    registered = nullptr;
    if (lending) set_grad_lender(lending, false);
    lending = nullptr;
    if (accumulating) set_grad_accumulator(accumulating, false);
    accumulating = nullptr;
  }
  // The gradient destination of compute tensor `w` (a view of `full`): its place in grad_full,
  // once per backward of the unit.
  Tensor destination(const Tensor& w) {
    if (nodes_pending <= 0 || !zero_copy) return Tensor();
    auto it = by_offset.find(w.offset() - full.offset());
    if (it == by_offset.end()) return Tensor();
    const size_t i = it->second;
    const Param& p = params[i];
    if (claimed[i] || w.local_shape() != p.run_local || !w.is_contiguous()) return Tensor();
    complete_own();  // an earlier reduction of this unit still reading grad_full
    poke_in_flight();
    ensure(grad_full, group * shard_size);
    if (grad_full.impl()->storage.get() != accumulating) {  // a weight's second use adds in place
      if (accumulating) set_grad_accumulator(accumulating, false);
      accumulating = grad_full.impl()->storage.get();
      set_grad_accumulator(accumulating, true);
    }
    claimed[i] = 1;
    return grad_full.narrow(0, p.offset, p.numel).view(p.run_local);
  }
  std::weak_ptr<State> self;

  // Reductions in flight (the queue above).
  void complete_own() {
    if (in_flight > 0) complete_in_flight(this);
  }
  static void settle_in_flight() {
    for (UnitReduction& r : g_in_flight) r.settle();
  }
  // MPI moves a nonblocking collective on when it is called: a test now and then lets the oldest
  // one progress while the backward computes.
  static void poke_in_flight() {
    if (g_in_flight.empty()) return;
    UnitReduction& r = g_in_flight.front();
    if (!r.settled) {
      r.scatter.is_completed();
    } else {
      r.reduce.is_completed();
    }
  }
  static void push_in_flight(UnitReduction r) {
    ++r.unit->in_flight;
    ++g_reductions_in_flight;
    g_in_flight.push_back(std::move(r));
    if (g_end_queued) return;
    g_end_queued = true;
    queue_backward_callback([] { complete_in_flight(); });
  }

  Work start_all_gather() {
    ++g_all_gathers;
    if (!shard.is_meta()) return mesh.comm(dim).all_gather_async(shard, full);
    // a plan checked or estimated on meta tensors: shapes and counts only
    count_collective("all_gather", mesh.dim_label(dim), group, full.numel() * dtype_size(shard.dtype()));
    return Work();
  }
  void all_gather_into_full() { start_all_gather().wait(); }

  // Forward: the next unit's gather, started while this one computes (a fresh `full`).
  void prefetch_forward() {
    if (prefetched || gathered_pass == pass() || !adopted()) return;
    NoGradGuard ng;
    ensure_full();
    resharded = false;
    pending = start_all_gather();
    prefetched = true;
    pending_backward = false;
    pending_pass = pass();
    ++g_prefetches;
  }
  // Backward: the gather again into the resharded storage, before this unit's backward begins.
  void prefetch_backward() {
    if (prefetched || !resharded) return;
    Storage& storage = *full.impl()->storage;
    storage.allocate_data();
    ++g_buffer_refills;
    pending_version = storage.version;
    pending = start_all_gather();
    prefetched = true;
    pending_backward = true;
    pending_pass = pass();
    ++g_prefetches;
  }
  // Completes a prefetch; true when it is the one this gather wants (same pass and phase). A stale
  // one (its unit did not run in that pass) is completed and dropped: the caller gathers anew.
  bool take_prefetch(bool backward) {
    if (!prefetched) return false;
    pending.wait();
    pending = Work();
    prefetched = false;
    if (pending_backward) full.impl()->storage->version = pending_version;  // the same values again
    const bool hit = pending_pass == pass() && pending_backward == backward;
    g_prefetch_hits += hit;
    return hit;
  }

  // Whether every parameter's storage is still its view of `shard`.
  bool adopted() const {
    if (!shard.defined()) return false;
    for (const Param& p : params) {
      const TensorImpl* impl = p.stored.impl();
      if (impl->storage.get() != shard.impl()->storage.get() || impl->offset != shard.offset() + p.shard_offset ||
          impl->device != shard.device() || impl->dtype != shard.dtype())
        return false;
    }
    return true;
  }

  // Copies every parameter's piece into a new shard buffer (on their device, in their dtype) and
  // points the parameters' storage at it.
  void adopt() {
    const Tensor& first = params.front().stored;
    for (const Param& p : params)
      MT_CHECK(p.stored.dtype() == first.dtype() && p.stored.device() == first.device(),
               "FSDP unit {}: parameter {} is {} on {} but {} is {} on {}; a unit's parameters share one buffer",
               module.empty() ? "(root)" : module, p.path, p.stored.dtype(), p.stored.device(), params.front().path,
               first.dtype(), first.device());
    NoGradGuard ng;
    Tensor fresh = zeros(Shape{shard_size}, TensorOptions(first.dtype()).with_device(first.device()));
    ++g_buffer_allocations;
    for (Param& p : params) {
      Tensor dst = fresh.narrow(0, p.shard_offset, p.shard_numel);
      if (p.shard_numel > 0) dst.copy_(local_view(p.stored.detach()).reshape(Shape{p.shard_numel}));
      g_adoption_bytes += p.shard_numel * dtype_size(first.dtype());
      Tensor v = dst.view(p.stored_local);
      TensorImpl* impl = p.stored.impl();
      impl->storage = v.impl()->storage;
      impl->sizes = v.shape();
      impl->strides = v.strides();
      impl->offset = v.offset();
    }
    shard = fresh;
  }

  // Gradient of the whole unit: every compute tensor's gradient (a DTensor of the compute spec,
  // Partial over the unit's dim where the batch is split there) taken to Partial(sum) over that
  // dim, put at its offset in one buffer and reduce-scattered into the shard of gradients.
  // HSDP: the mesh dims other than the unit's over which every gradient of the unit is
  // Partial(sum) and every compute tensor Replicate (a batch split over a dim the parameters are
  // replicated on). Their reduction waits for the unit's shard: one all-reduce per unit and dim
  // instead of one per parameter. The same on every rank (placements are).
  std::vector<int> replica_dims(const std::vector<Tensor>& grads) const {
    std::vector<int> dims;
    for (int d = 0; d < mesh.ndim(); ++d) {
      if (d == dim) continue;
      bool all = false;
      for (size_t i = 0; i < params.size(); ++i) {
        const Tensor& g = grads[i];
        if (!g.defined() || params[i].numel == 0) continue;
        const Placement& run = params[i].run[static_cast<size_t>(d)];
        if (!g.is_distributed() || !run.is_replicate()) {
          all = false;
          break;
        }
        const Placement& got = dtensor_spec(g, "FSDP unit gradient").placements()[static_cast<size_t>(d)];
        all = got.is_partial() && got.reduce_op() == PartialOp::kSum;
        if (!all) break;
      }
      if (all) dims.push_back(d);
    }
    return dims;
  }

  // Whether `local` (a gradient's local tensor) is parameter i's place in grad_full already.
  bool in_place(size_t i, const Tensor& local) const {
    const Param& p = params[i];
    return claimed[i] && grad_full.defined() && local.impl()->storage.get() == grad_full.impl()->storage.get() &&
           local.offset() == grad_full.offset() + p.offset && local.is_contiguous() && local.numel() == p.numel;
  }

  // Puts this backward's gradients into grad_full: each at its parameter's offset (in place
  // already when its formula wrote there; otherwise copied, or added where a partial node of this
  // backward put a gradient of the same parameter before). The final node zeroes what nothing
  // wrote (unused parameters, the padding).
  void collect(const std::vector<Tensor>& grads, const std::vector<int>& replicas, bool partial) {
    const DType dt = shard.dtype();
    ensure(grad_full, group * shard_size);
    for (size_t i = 0; i < params.size(); ++i) {
      const Param& p = params[i];
      Tensor g = grads[i];
      if (p.numel == 0) continue;
      if (!g.defined()) {  // no gradient flowed (an unused parameter): zeros, not a copy
        if (!partial && !contributed[i]) grad_full.narrow(0, p.offset, p.numel).zero_();
        continue;
      }
      Placements want = p.run;
      want[static_cast<size_t>(dim)] = Placement::partial();
      for (int d : replicas) want[static_cast<size_t>(d)] = Placement::partial();
      Tensor local;
      if (g.is_distributed()) {
        const DTensorSpec& s = dtensor_spec(g, "FSDP unit gradient");
        local = s.placements() == want
                    ? local_view(g.detach())
                    : redistribute_local(local_view(g.detach()), s.global_shape(), s.placements(), want, mesh);
      } else {  // a plain gradient is this rank's term
        local = g.detach();
      }
      MT_CHECK(local.numel() == p.numel, "FSDP unit {}: gradient of {} has {} elements, its compute tensor {}",
               module, p.path, local.numel(), p.numel);
      const bool added = contributed[i];
      if (partial) contributed[i] = 1;
      if (!added && in_place(i, local)) {  // written there by its backward formula: nothing to move
        ++g_zero_copy_grads;
        continue;
      }
      // Otherwise (a weight used twice, a gradient redistributed or cast, a formula without a
      // destination) it is copied in, or added to a recomputation's share: counted.
      Tensor dst = grad_full.narrow(0, p.offset, p.numel);
      Tensor src = (local.dtype() == dt ? local : local.to(dt)).reshape(Shape{p.numel});
      if (added) {
        dst.add_(src);
      } else {
        dst.copy_(src);
      }
      g_backward_bytes += p.numel * dtype_size(dt);
    }
    if (partial) return;
    for (const auto& [b, e] : gaps) grad_full.narrow(0, b, e - b).zero_();  // padding: zeros
    std::fill(claimed.begin(), claimed.end(), 0);
  }

  // The backward of a gather node: a partial node (a recomputation inside the unit's
  // backward, beside the forward's node) leaves its gradients in grad_full; the unit's last node
  // of this backward reduces them all.
  std::vector<Tensor> backward(const std::vector<Tensor>& grads, bool partial) {
    NoGradGuard ng;
    if (nodes_pending > 0) --nodes_pending;
    std::vector<int> replicas = replica_dims(grads);
    if (partial) {
      complete_own();  // (an earlier reduction of this unit may still read grad_full)
      if (std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); }))
        partial_replicas = replicas;
      collect(grads, replicas, true);
      return std::vector<Tensor>(params.size());
    }
    complete_own();  // (a unit's second backward in one pass: its first reduction is done first)
    const bool shared = std::any_of(contributed.begin(), contributed.end(), [](char c) { return c != 0; });
    const bool any = std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); });
    if (shared && !any) replicas = partial_replicas;
    MT_CHECK(!shared || replicas == partial_replicas,
             "FSDP unit {}: a recomputed part's gradients and the rest's are summed over different mesh dims",
             module.empty() ? "(root)" : module);
    collect(grads, replicas, false);
    in_backward = false;
    std::fill(contributed.begin(), contributed.end(), 0);
    // The shard of gradients: grad_shard, unless a .grad still views it (gradients accumulated
    // over several backwards), then grad_scratch, which AccumulateGrad adds into .grad.
    bool busy = false;
    // AccumulateGrad reads the result at once (so the reduction cannot stay in flight) when it
    // adds it into an existing .grad or converts it to another dtype (Tensor::set_grad_dtype:
    // f32 accumulation of 16-bit gradients over micro-batches).
    bool read_now = false;
    for (const Param& p : params) {
      const Tensor gr = p.stored.grad();
      busy |= gr.defined() && grad_shard.defined() && gr.impl()->storage.get() == grad_shard.impl()->storage.get();
      read_now |= gr.defined() || p.stored.grad_dtype().value_or(shard.dtype()) != shard.dtype();
    }
    Tensor& out = busy ? grad_scratch : grad_shard;
    ensure(out, shard_size);
    if (!busy && out.impl()->storage.get() != lending) {
      if (lending) set_grad_lender(lending, false);
      lending = out.impl()->storage.get();
      if (lending) set_grad_lender(lending, true);
    }
    // The units before this one have computed their gradients meanwhile: their reduce-scatters
    // are done (waited for here), their HSDP all-reduces start.
    settle_in_flight();
    UnitReduction r{self.lock(), Work(), Work(), replicas, out, false};
    if (shard.is_meta())  // a plan checked or estimated on meta tensors: shapes and counts only
      count_collective("reduce_scatter", mesh.dim_label(dim), group, grad_full.numel() * dtype_size(shard.dtype()));
    else if (ordered && group > 1)
      ordered_reduce(out);
    else
      r.scatter = mesh.comm(dim).reduce_scatter_async(grad_full, out, CommReduceOp::kSum);
    ++g_reduce_scatters;
    // In flight until the next unit's reduction or the end of the backward pass, unless something
    // reads the result at once: AccumulateGrad adds it into .grad, or converts it (read_now).
    if (async_reduce && !read_now && !ordered) {
      push_in_flight(std::move(r));
    } else {
      r.complete();
    }
    // With reshard, the gathered parameters give their memory back until the next use (the
    // storage object stays: deterministic memory, no new buffers); grad_full's goes once the
    // reduce-scatter has read it, for every unit (UnitReduction::settle).
    if (reshard && free_data(full)) resharded = true;
    std::vector<Tensor> result;
    for (const Param& p : params)
      result.push_back(from_local(out.narrow(0, p.shard_offset, p.shard_numel).view(p.stored_local), mesh, p.init,
                                  p.global_shape));
    return result;
  }

  // The reduce-scatter with a fixed order of the sum: an all-to-all brings every rank's term of
  // this rank's shard (the same bytes a ring reduce-scatter moves), then out = ((t0 + t1) + t2)
  // + ... in rank order, the order in which one device accumulates the gradients of micro-batches
  // 0, 1, 2, ... (MT_FSDP_REDUCE=ordered; the MPI reduce-scatter's order is its own).
  void ordered_reduce(Tensor& out) {
    ensure(grad_recv, group * shard_size);
    mesh.comm(dim).all_to_all(grad_full, grad_recv);
    auto chunk = [&](int64_t r) { return grad_recv.narrow(0, r * shard_size, shard_size); };
    const Tensor c0 = chunk(0), c1 = chunk(1);
    BinaryParams bp{BinaryOp::kAdd, c0.view_info(), c1.view_info(), out.view_info()};
    MT_KERNEL(out.device().type, binary, bp);
    for (int64_t r = 2; r < group; ++r) out.add_(chunk(r));
    free_data(grad_recv);  // as grad_full (UnitReduction::settle)
    ++g_ordered_reductions;
  }

  static bool free_data(Tensor& t) {
    Storage* st = t.defined() ? t.impl()->storage.get() : nullptr;
    if (!st || !st->has_data()) return false;
    st->free_data();
    return true;
  }

  void gather(const std::shared_ptr<State>& self) {
    const bool record = GradMode::enabled();
    // A recomputation inside this unit's backward: `full` holds the parameters (begin_backward).
    const bool recompute = in_backward && !resharded && adopted();
    if (!recompute) {
      if (!adopted()) {  // moved parameters (Module::to): a prefetch read the old buffer
        take_prefetch(false);
        adopt();
      }
      NoGradGuard ng;
      if (!take_prefetch(false)) {
        ensure_full();
        resharded = false;
        all_gather_into_full();
      }
      gathered_pass = pass();
      // (not from a recomputation in a backward: the forward pass's order is not this)
      if (auto next = next_forward.lock(); next && !backward_running()) next->prefetch_forward();
    }
    NoGradGuard ng;
    gathered.clear();
    gathered_replay = current_recompute();
    std::vector<Tensor*> outs;
    for (const Param& p : params)
      gathered.push_back(from_local(full.narrow(0, p.offset, p.numel).view(p.run_local), mesh, p.run, p.global_shape));
    bool any_grad = false;
    std::vector<Tensor> inputs;
    for (const Param& p : params) {
      inputs.push_back(p.stored);
      any_grad |= p.stored.requires_grad();
    }
    if (!record || !any_grad) return;
    // (claimed stays: a pending node's backward may have claimed nothing yet, and a fresh gather
    // adds a node; the flags are reset when a backward of the unit completes.)
    const bool partial = recompute && nodes_pending > 0;  // the forward's node reduces
    ++nodes_pending;
    // The node keeps the state alive while a graph needs it; end_forward() (or the next gather)
    // drops the gathered tensors that point back at the node.
    auto node = std::make_shared<FunctionNode>("FsdpUnitGather", [self, partial](const std::vector<Tensor>& g) {
      return self->backward(g, partial);
    });
    node->materialize_grads = false;  // an unused parameter is no gradient, not zeros to copy
    for (Tensor& t : gathered) outs.push_back(&t);
    set_history(node, inputs, outs);
  }
};

namespace {

void UnitReduction::settle() {
  if (settled) return;
  settled = true;
  FsdpUnitBuffer::State& s = *unit;
  scatter.wait();
  for (size_t k = 0; k < replicas.size(); ++k) {
    const int d = replicas[k];
    if (s.shard.is_meta())
      count_collective("all_reduce", s.mesh.dim_label(d), s.mesh.size(d), out.numel() * dtype_size(out.dtype()));
    else if (k + 1 < replicas.size())
      s.mesh.comm(d).all_reduce(out, CommReduceOp::kSum);
    else
      reduce = s.mesh.comm(d).all_reduce_async(out, CommReduceOp::kSum);
    ++g_replica_all_reduces;
  }
  // The unit's gradient buffer gives its memory back until its next backward (the storage object
  // stays: deterministic memory, no new buffers), whether or not the unit reshards after forward:
  // `reshard=no` is about the gathered parameters, and a root or `reshard=no` unit held its
  // gradient buffer through the optimizer step and the next forward until 2026-12-07.
  FsdpUnitBuffer::State::free_data(s.grad_full);
}

void complete_in_flight(const FsdpUnitBuffer::State* unit) {
  if (!unit) g_end_queued = false;
  while (!g_in_flight.empty() && (!unit || unit->in_flight > 0)) {
    UnitReduction r = std::move(g_in_flight.front());
    g_in_flight.pop_front();
    --r.unit->in_flight;
    r.complete();
  }
}

}  // namespace

FsdpUnitBuffer::FsdpUnitBuffer(const FsdpUnit& unit, const HookIR& ir, Module& model, const DeviceMesh& mesh)
    : s_(std::make_shared<State>(mesh)) {
  State& s = *s_;
  s.module = unit.module;
  s.paths = unit.params;
  s.dim = unit.mesh_dim;
  s.group = mesh.size(unit.mesh_dim);
  s.rank = mesh.coordinate_shape()[unit.mesh_dim];
  s.shard_size = unit.layout.shard_size;
  std::map<std::string, const Placements*> run;
  for (const HookRecord& r : ir.records)
    if (r.action == HookAction::kGather) run[r.module.empty() ? r.tensor : r.module + "." + r.tensor] = &*r.dst;
  s.params.resize(unit.params.size());
  for (const PlacedTensor& t : unit.layout.tensors) {
    State::Param& p = s.params[static_cast<size_t>(t.index)];
    const LayoutTensor& lt = unit.tensors[static_cast<size_t>(t.index)];
    p.path = unit.params[static_cast<size_t>(t.index)];
    p.stored = model.get_parameter(p.path);
    MT_CHECK(p.stored.is_distributed(), "FSDP unit {}: parameter {} is not a DTensor yet", s.module, p.path);
    const DTensorSpec& spec = dtensor_spec(p.stored, "FSDP unit");
    p.global_shape = spec.global_shape();
    p.init = spec.placements();
    auto it = run.find(p.path);
    MT_CHECK(it != run.end(), "FSDP unit {}: parameter {} has no gather record", s.module, p.path);
    p.run = *it->second;
    p.run_local = local_layout(p.global_shape, p.run, mesh.shape(), mesh.coordinate_shape()).local_shape;
    p.offset = t.offset;
    p.numel = lt.numel();
    // This rank's piece: the rows of blocks on ranks before it are not here.
    int64_t before = 0;
    for (int64_t r = 0; r < s.rank; ++r) before += t.blocks_on(r);
    p.shard_numel = t.blocks_on(s.rank) * lt.block_numel();
    p.shard_offset = p.shard_numel > 0 ? t.offset + before * lt.block_numel() - s.rank * s.shard_size : 0;
    p.stored_local = local_view(p.stored).shape();
    MT_CHECK(p.stored_local.numel() == p.shard_numel,
             "FSDP unit {}: parameter {} holds {} elements here, its layout puts {} on rank {}", s.module, p.path,
             p.stored_local.numel(), p.shard_numel, s.rank);
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.index[s.params[i].path] = i;
    if (s.params[i].numel > 0) s.by_offset[s.params[i].offset] = i;
  }
  s.claimed.assign(s.params.size(), 0);
  s.contributed.assign(s.params.size(), 0);
  int64_t end = 0;  // the padding: what no parameter covers (by_offset is sorted)
  for (const auto& [offset, i] : s.by_offset) {
    if (offset > end) s.gaps.emplace_back(end, offset);
    end = std::max(end, offset + s.params[i].numel);
  }
  if (end < s.group * s.shard_size) s.gaps.emplace_back(end, s.group * s.shard_size);
  s.self = s_;
  s.adopt();
}

// The gathered views point back at the state through their gather node: a forward that threw
// before the unit's end_forward() leaves them there, a cycle that only this breaks.
FsdpUnitBuffer::~FsdpUnitBuffer() { s_->gathered.clear(); }

const std::string& FsdpUnitBuffer::module() const { return s_->module; }
const std::vector<std::string>& FsdpUnitBuffer::params() const { return s_->paths; }
void FsdpUnitBuffer::set_reshard_after_forward(bool on) { s_->reshard = on; }
void FsdpUnitBuffer::set_zero_copy_gradients(bool on) { s_->zero_copy = on; }
void FsdpUnitBuffer::set_prefetch(bool on) { s_->prefetchable = on; }
void FsdpUnitBuffer::set_ordered_reduction(bool on) { s_->ordered = on; }
void FsdpUnitBuffer::set_async_reduction(bool on) { s_->async_reduce = on; }
void FsdpUnitBuffer::begin_forward() {
  s_->gathered.clear();
  s_->in_backward = false;  // (a backward that never reached the unit's node)
}

void FsdpUnitBuffer::end_forward() {
  State& s = *s_;
  s.gathered.clear();
  // (A meta buffer of a checked plan may have no storage at all: nothing to free.)
  if (s.reshard && s.full.defined() && s.full.impl()->storage.get() && !s.resharded) {
    // The autograd graph keeps views of `full` (saved weights): its memory goes, the storage
    // object stays, and begin_backward() fills it again before any of them is read.
    s.full.impl()->storage->free_data();
    s.resharded = true;
  }
}

void FsdpUnitBuffer::begin_backward() {
  State& s = *s_;
  s.in_backward = true;
  if (!s.resharded) {
    // A forward prefetch may be in flight into `full` (under a pipeline schedule, or interleaved
    // chunks, a unit's backward can come before the forward pass that prefetched it): it gathers
    // the same parameters, so complete it before the backward reads the saved views.
    if (s.prefetched) s.take_prefetch(true);
    return;
  }
  if (!s.take_prefetch(true)) {
    Storage& storage = *s.full.impl()->storage;
    storage.allocate_data();
    ++g_buffer_refills;
    const uint32_t version = storage.version;  // the same values again: not a modification
    s.all_gather_into_full();
    storage.version = version;
  }
  s.resharded = false;
  if (auto next = s.next_backward.lock()) next->prefetch_backward();
}

std::function<void()> FsdpUnitBuffer::link_prefetch(const std::vector<std::shared_ptr<FsdpUnitBuffer>>& units) {
  auto passes = std::make_shared<uint64_t>(0);
  for (size_t i = 0; i < units.size(); ++i) {
    State& s = *units[i]->s_;
    s.passes = passes;
    if (i + 1 < units.size() && units[i + 1]->s_->prefetchable) s.next_forward = units[i + 1]->s_;
    if (i > 0 && units[i - 1]->s_->prefetchable) s.next_backward = units[i - 1]->s_;
  }
  return [passes] { ++*passes; };
}

Tensor FsdpUnitBuffer::gathered(const std::string& path) {
  auto it = s_->index.find(path);
  MT_CHECK(it != s_->index.end(), "FSDP unit {}: {} is not one of its parameters", s_->module, path);
  // Views are made once per forward pass, and once per recomputation: a nested one (a checkpointed
  // submodule of a recomputed module, replayed in the outer replay's backward) gets its own.
  if (s_->gathered.empty() || s_->gathered_replay != current_recompute()) s_->gather(s_);
  return s_->gathered[it->second];
}

}  // namespace mt
