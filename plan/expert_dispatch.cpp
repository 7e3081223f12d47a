// The token all-to-all expert dispatcher (plan/expert_dispatch.h).
#include "plan/expert_dispatch.h"

#include <algorithm>
#include <utility>

#include "mesh/dtensor.h"
#include "mesh/exchange.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt {

namespace {

// While alive, the expert's parameter slots hold their local tensors (differentiable: the
// gradient of the local tensor becomes the DTensor parameter's gradient), so that the expert runs
// as a plain module on the rows this rank received. Those rows came from the ranks of the dispatch
// dim only: on any other mesh dim that splits the tokens (data parallel), each rank's gradient is
// its part of the sum, P(sum) where the parameter is replicated, and the gradient reducer sums it
// there like any data-parallel gradient.
class LocalParameters {
 public:
  LocalParameters(Module& m, const Placements& tokens, int dispatch_dim) {
    for (auto& [name, p] : m.named_parameters()) {
      Tensor& slot = m.parameter_slot(name);
      saved_.emplace_back(&slot, slot);
      if (!slot.is_distributed()) continue;
      Placements grad = dtensor_spec(slot, "expert parameter").placements();
      for (size_t d = 0; d < grad.size(); ++d) {
        if (grad[d].is_partial()) grad[d] = Placement::replicate();
        if (static_cast<int>(d) != dispatch_dim && grad[d].is_replicate() && d < tokens.size() && tokens[d].splits())
          grad[d] = Placement::partial();
      }
      slot = to_local(slot, grad);
    }
  }
  ~LocalParameters() {
    for (auto& [slot, t] : saved_) *slot = t;
  }
  LocalParameters(const LocalParameters&) = delete;
  LocalParameters& operator=(const LocalParameters&) = delete;

 private:
  std::vector<std::pair<Tensor*, Tensor>> saved_;
};

// True when a mesh dim other than the dispatch dim splits the tokens too (data parallel beside ep).
bool splits_tokens_elsewhere(const DTensorSpec& xs, int dispatch_dim) {
  for (size_t d = 0; d < xs.placements().size(); ++d)
    if (static_cast<int>(d) != dispatch_dim && xs.placements()[d].splits()) return true;
  return false;
}

// Every rank's `mine` (rows per (expert, slot)), gathered over `comm`, rank-major. A simulated group
// (estimates on meta tensors) is counted like the real gather, every rank taken to route alike.
std::vector<int64_t> gather_counts(Communicator& comm, const std::vector<int64_t>& mine, bool simulated) {
  const auto P = static_cast<int64_t>(comm.size()), n = static_cast<int64_t>(mine.size());
  if (simulated) {
    Tensor c = empty(Shape{1, n}, TensorOptions(DType::kI64).with_device(Device::meta()));
    Tensor g = empty(Shape{P, n}, c.options());
    comm.all_gather(c, g);
    std::vector<int64_t> all;
    all.reserve(static_cast<size_t>(P * n));
    for (int64_t j = 0; j < P; ++j) all.insert(all.end(), mine.begin(), mine.end());
    return all;
  }
  Tensor c = from_vector<int64_t>(mine, Shape{1, n}), g = empty(Shape{P, n}, DType::kI64);
  comm.all_gather(c, g);
  return g.to_vector<int64_t>();
}

// The capacity over the whole batch when other mesh dims split the tokens too (dp x ep): the rows
// per (expert, slot) of every rank that holds tokens, gathered over all the token-splitting dims
// (flattened in mesh order: the batch order when each of them is S(d) of the same dim, mesh dim
// 0 outermost), kept as one device keeps them. Returns this rank's dispatch group's part: its ranks
// along the dispatch dim, [P * experts * top_k]. Until 2026-11-28 the capacity counted one dispatch
// group's tokens only (about half the rows kept under dp=2, others than one device's).
std::vector<int64_t> whole_batch_capacity(const DeviceMesh& mesh, int dispatch_dim, const DTensorSpec& xs,
                                          const std::vector<int64_t>& mine, double factor, int64_t E, int64_t k,
                                          int64_t* dropped, const std::string& where) {
  const Placements& ps = xs.placements();
  const int tdim = ps[static_cast<size_t>(dispatch_dim)].dim();
  std::vector<std::string> names;
  int64_t stride = 1;  // flat-rank distance between neighbours along the dispatch dim
  for (int d = 0; d < mesh.ndim(); ++d) {
    const Placement& p = ps[static_cast<size_t>(d)];
    if (!p.splits()) continue;
    MT_CHECK(p.is_shard() && p.dim() == tdim,
             "{}: a capacity factor with the tokens split over '{}' besides the dispatch dim '{}' needs S({}) there "
             "(the batch order one device sees), got {}", where, mesh.names()[static_cast<size_t>(d)],
             mesh.names()[static_cast<size_t>(dispatch_dim)], tdim, xs.placements_str());
    names.push_back(mesh.names()[static_cast<size_t>(d)]);
    if (d > dispatch_dim) stride *= mesh.size(d);
  }
  const DeviceMesh flat = mesh.flatten(names);
  const bool simulated = mesh.is_simulated();
  Communicator comm = simulated ? Communicator::simulated(static_cast<int>(flat.size(0)),
                                                          static_cast<int>(flat.coordinate(0)),
                                                          "expert capacity all_gather (simulated)", flat.dim_label(0))
                                : flat.comm();
  const auto Q = static_cast<int64_t>(comm.size());
  const std::vector<int64_t> all = gather_counts(comm, mine, simulated);
  int64_t n_all = 0;
  for (int64_t v : all) n_all += v;
  n_all /= k;
  const std::vector<int64_t> kept_all = capacity_keep(all, Q, E, k, expert_capacity(factor, n_all, k, E), dropped);
  const int64_t P = mesh.size(dispatch_dim);
  const int64_t first = comm.rank() - mesh.coordinate(dispatch_dim) * stride;  // coordinate 0 of the group
  std::vector<int64_t> kept(static_cast<size_t>(P * E * k));
  for (int64_t j = 0; j < P; ++j)
    std::copy_n(kept_all.begin() + (first + j * stride) * E * k, E * k, kept.begin() + j * E * k);
  return kept;
}

}  // namespace

AllToAllDispatcher::AllToAllDispatcher(DeviceMesh mesh, int dim, std::vector<int64_t> owners)
    : mesh_(std::move(mesh)), dim_(dim), owners_(std::move(owners)) {}

std::string AllToAllDispatcher::describe() const {
  return fmt::format("all_to_all over {} ({} ranks)", mesh_.names()[static_cast<size_t>(dim_)], mesh_.size(dim_));
}

Tensor AllToAllDispatcher::run(const ExpertRouting& r, const std::vector<Module*>& experts, const std::string& where) {
  const auto E = static_cast<int64_t>(experts.size());
  MT_CHECK(E == static_cast<int64_t>(owners_.size()), "{}: {} experts, but the dispatcher knows owners of {}",
           where, E, owners_.size());
  // The tokens' placements are the layer input's (x is its [N, H] view, whose placement a view of
  // an uneven split may have turned ragged); the output gets them back.
  const Tensor& in = r.input.defined() ? r.input : r.x;
  const std::string dim_name = mesh_.names()[static_cast<size_t>(dim_)];
  MT_CHECK(in.is_distributed(),
           "{}: all_to_all dispatch needs the tokens as a DTensor split over '{}' (place the model's input "
           "there, e.g. 'place model <in>:0 {}=S(0)'), got a local tensor {}",
           where, dim_name, dim_name, in.desc());
  const DTensorSpec& xs = dtensor_spec(in, "all_to_all dispatch");
  const Placement& xp = xs.placements()[static_cast<size_t>(dim_)];
  MT_CHECK(xp.splits() && xp.dim() < in.dim() - 1,
           "{}: all_to_all dispatch over '{}' needs the tokens split there (e.g. the batch, S(0)), got {}: with "
           "replicated tokens every rank would send the same rows (place the batch on '{}')",
           where, dim_name, xs.placements_str(), dim_name);
  for (size_t d = 0; d < xs.placements().size(); ++d)
    MT_CHECK(!xs.placements()[d].is_partial(), "{}: the tokens are Partial ({}); expected them summed before the "
             "MoE layer", where, xs.placements_str());
  Tensor x = to_local(r.x), w = to_local(r.weights);
  Tensor sel_t = r.selected.is_distributed() ? to_local(r.selected) : r.selected;
  const int64_t n = x.size(0), H = x.size(1), k = sel_t.size(1);
  const Device dev = x.device();
  const bool simulated = mesh_.is_simulated();

  // Routing of this rank's tokens. On a simulated mesh (estimates on meta tensors) there are no
  // values: tokens are spread evenly over the experts.
  std::vector<int64_t> sel(static_cast<size_t>(n * k));
  if (simulated) {
    for (int64_t i = 0; i < n * k; ++i) sel[static_cast<size_t>(i)] = i % E;
  } else {
    sel = sel_t.to_vector<int64_t>();
  }
  ExpertLists l = expert_lists(sel, n, k, E, where);

  Communicator comm = simulated ? Communicator::simulated(static_cast<int>(mesh_.size(dim_)),
                                                          static_cast<int>(mesh_.coordinate(dim_)),
                                                          "expert all_to_all (simulated)", mesh_.dim_label(dim_))
                                : mesh_.comm(dim_);
  const auto P = static_cast<int64_t>(comm.size());
  const int64_t me = comm.rank();

  // Every rank's rows per (expert, slot): what each rank receives from each other rank, and the
  // capacity's priority order over the whole group.
  const std::vector<int64_t> mine = rows_per_slot(l, k);
  const std::vector<int64_t> all = gather_counts(comm, mine, simulated);
  auto routed = [&](int64_t rank, int64_t e, int64_t s) { return all[static_cast<size_t>((rank * E + e) * k + s)]; };
  // Capacity (ExpertRouting::capacity_factor): expert e keeps its first C rows in the order one
  // device sees them: slot 0 of every token of the batch (ranks in order), then slot 1, ...
  std::vector<int64_t> kept;  // rows kept per (rank of the dispatch group, expert, slot)
  if (r.capacity_factor > 0 && splits_tokens_elsewhere(xs, dim_)) {
    kept = whole_batch_capacity(mesh_, dim_, xs, mine, r.capacity_factor, E, k, &load_.dropped, where);
  } else {
    int64_t n_all = 0;
    for (int64_t v : all) n_all += v;
    n_all /= k;
    kept = capacity_keep(all, P, E, k, expert_capacity(r.capacity_factor, n_all, k, E), &load_.dropped);
  }
  keep_rows(l, k, kept.data() + me * E * k);
  auto count = [&](int64_t rank, int64_t e) {
    int64_t c = 0;
    for (int64_t s = 0; s < k; ++s) c += kept[static_cast<size_t>((rank * E + e) * k + s)];
    return c;
  };

  // Send order: by destination rank, then expert, then the expert's (slot-major) token order.
  std::vector<int64_t> send_idx, send_counts(static_cast<size_t>(P), 0), recv_counts(static_cast<size_t>(P), 0);
  std::vector<int64_t> send_offset(static_cast<size_t>(E), 0);
  send_idx.reserve(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < P; ++j) {
    for (int64_t e = 0; e < E; ++e) {
      if (owners_[static_cast<size_t>(e)] != j) continue;
      send_offset[static_cast<size_t>(e)] = static_cast<int64_t>(send_idx.size());
      const auto& tok = l.tokens[static_cast<size_t>(e)];
      send_idx.insert(send_idx.end(), tok.begin(), tok.end());
      send_counts[static_cast<size_t>(j)] += static_cast<int64_t>(tok.size());
    }
  }
  // Received rows: by source rank, then expert (the ones this rank owns), as each source sent them.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(E));
  int64_t R = 0;
  for (int64_t j = 0; j < P; ++j) {
    for (int64_t e = 0; e < E; ++e) {
      if (owners_[static_cast<size_t>(e)] != me) continue;
      for (int64_t i = 0; i < count(j, e); ++i) rows[static_cast<size_t>(e)].push_back(R + i);
      R += count(j, e);
      recv_counts[static_cast<size_t>(j)] += count(j, e);
    }
  }
  load_.tokens.assign(static_cast<size_t>(E), 0);
  for (int64_t j = 0; j < P; ++j)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t s = 0; s < k; ++s) load_.tokens[static_cast<size_t>(e)] += routed(j, e, s);
  load_.rows_sent = static_cast<int64_t>(send_idx.size()) - send_counts[static_cast<size_t>(me)];

  Tensor sent = index_select(x, 0, expert_index(send_idx, dev));
  Tensor recv = exchange_rows(comm, sent, send_counts, recv_counts);  // [R, H]
  Tensor done = zeros(Shape{R, H}, x.options().with_grad(false));
  for (int64_t e = 0; e < E; ++e) {
    const auto& ri = rows[static_cast<size_t>(e)];
    if (ri.empty()) continue;  // not ours, or no token anywhere was routed to it
    Tensor idx = expert_index(ri, dev);
    Tensor y;
    {
      LocalParameters local(*experts[static_cast<size_t>(e)], xs.placements(), dim_);
      y = (*experts[static_cast<size_t>(e)])(index_select(recv, 0, idx));
    }
    done = index_add(done, 0, idx, y.to(x.dtype()));
  }
  // Every rank must record both exchanges when any does, or a backward would wait for a rank that
  // has no path to them: a rank that received no rows still passes its (empty) buffer through.
  if (!done.requires_grad() && recv.requires_grad()) done = mul(recv, 0.0);
  Tensor back = exchange_rows(comm, done, recv_counts, send_counts);  // [sum send, H], in send order

  // The weighted terms per token, experts in index order (as one device adds them).
  Tensor flat_w = w.reshape(Shape{n * k});
  Tensor out = zeros(Shape{n, H}, x.options().with_grad(false));
  bool used_w = false;
  for (int64_t e = 0; e < E; ++e) {
    const auto& tok = l.tokens[static_cast<size_t>(e)];
    if (tok.empty()) continue;
    used_w = true;
    Tensor cur = back.narrow(0, send_offset[static_cast<size_t>(e)], static_cast<int64_t>(tok.size()));
    out = add_expert_terms(out, cur, expert_index(tok, dev), expert_index(l.slots[static_cast<size_t>(e)], dev),
                           flat_w);
  }
  // Likewise a rank whose tokens picked no expert (it had no tokens): its output still depends on
  // what came back, so that its backward joins the exchanges.
  if (!out.requires_grad() && back.requires_grad()) out = add(out, mul(sum(back), 0.0));
  // And its routing weights (no tokens, or every row dropped by the capacity): the router then gets
  // a zero gradient here as on the other ranks, not none. Without it, a rank with no tokens (an
  // uneven batch: 6 sequences over 4 ranks are 2, 2, 2, 0) left the router's gradient undefined
  // while the others held a Partial one, and `meshtrain grad`'s reduction of it hung or failed.
  if (!used_w && w.requires_grad()) out = add(out, mul(sum(flat_w), 0.0));
  const Shape local_in = xs.local_shape();
  MT_CHECK(local_in.numel() == out.numel(), "{}: the layer input's local shard {} does not hold the {} x {} tokens "
           "routed here", where, local_in, n, H);
  return from_local(out.view(local_in), xs.mesh(), xs.placements(), xs.global_shape());
}

std::vector<int64_t> expert_owners(MoeModule& layer, const Shape& mesh_shape, const Shape& coord, int dim,
                                   const std::function<const Placements&(const std::string&)>& placements_of,
                                   const std::string& where) {
  std::vector<int64_t> owners;
  for (Module* expert : layer.expert_modules()) {
    int64_t owner = -1;
    std::string first;
    for (const auto& [name, p] : expert->named_parameters()) {
      const std::string path = expert->path() + "." + name;
      const Placements& ps = placements_of(path);
      for (size_t d = 0; d < ps.size(); ++d)
        MT_CHECK(static_cast<int>(d) == dim || ps[d].is_replicate(),
                 "{}: expert parameter '{}' is {} on mesh dim {}; all_to_all dispatch runs each expert whole on "
                 "its owner, so its parameters must be replicated on every other mesh dim",
                 where, path, placements_str(ps), d);
      int64_t holder = -1;
      const int64_t total = p.shape().numel();
      for (int64_t c = 0; c < mesh_shape[static_cast<size_t>(dim)]; ++c) {
        Shape at = coord;
        at[static_cast<size_t>(dim)] = c;
        const int64_t local = local_layout(p.shape(), ps, mesh_shape, at).local_shape.numel();
        MT_CHECK(local == 0 || local == total,
                 "{}: expert parameter '{}' ({}) is split over the ranks of mesh dim {}; all_to_all dispatch "
                 "needs it whole on one of them (owner(K) in the plan)",
                 where, path, placements_str(ps), dim);
        if (local == total && total > 0) {
          MT_CHECK(holder < 0, "{}: expert parameter '{}' ({}) is held by coordinates {} and {} of mesh dim {}; "
                   "expected one owner (owner(K) in the plan)", where, path, placements_str(ps), holder, c, dim);
          holder = c;
        }
      }
      MT_CHECK(holder >= 0, "{}: expert parameter '{}' has no owner on mesh dim {}", where, path, dim);
      MT_CHECK(owner < 0 || owner == holder,
               "{}: expert '{}' has '{}' on coordinate {} but '{}' on coordinate {}; expected all its parameters on "
               "one owner", where, expert->path(), first, owner, path, holder);
      if (owner < 0) {
        owner = holder;
        first = path;
      }
    }
    MT_CHECK(owner >= 0, "{}: expert '{}' has no parameters", where, expert->path());
    owners.push_back(owner);
  }
  return owners;
}

}  // namespace mt
