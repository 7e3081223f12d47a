// GradReducer (plan/grad_reducer.h, docs/grad_reduction.md). The bucket layout is fixed on the
// first synchronized step from the gradients' actual placements, agreed over the mesh so that every
// rank builds the same buckets in the same order; afterwards each bucket is launched from the
// backward hooks in bucket order (a bucket waits for the ones before it), so every rank issues the
// same collectives in the same order whatever the arrival order or unused parameters.
#include "plan/grad_reducer.h"

#include <algorithm>
#include <bit>
#include <map>

#include "mesh/collective_count.h"
#include "mesh/communicator.h"
#include "mesh/dtensor.h"
#include "mesh/redistribute.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"
#include "tensor/autograd.h"

namespace mt {

namespace {

std::string dims_str(const DeviceMesh& mesh, uint32_t mask) {
  std::string s;
  for (int d = 0; d < mesh.ndim(); ++d)
    if ((mask >> d) & 1) s += (s.empty() ? "" : ",") + mesh.names()[static_cast<size_t>(d)];
  return "{" + s + "}";
}

int64_t ceil_div(int64_t a, int64_t b) { return b == 0 ? 0 : (a + b - 1) / b; }

}  // namespace

std::string GradReducerStats::str() const {
  return fmt::format(
      "collectives {} (all_reduce {}, reduce_scatter {}), {} bytes, {} buckets, {} launched in backward, "
      "{} passed through, {} unused ({} on every rank), {} presence checks{}",
      collectives, all_reduces, reduce_scatters, bytes, buckets, launched_in_backward, passed_through, unused,
      unused_everywhere, presence_checks,
      late_partial > 0 ? fmt::format(", {} reduced outside the buckets", late_partial) : "");
}

struct GradReducer::State {
  enum class BucketKind { kAllReduce, kReduceScatter };
  struct Param {
    std::string name;
    Tensor p;
    Placements target;   // what finish() leaves in .grad
    Placements reduced;  // target with the bucket's Partial dims Replicate: the packed local layout
    Shape packed_shape;  // local shape under `reduced`
    uint32_t mask = 0;   // Partial dims of its group (0: passed through)
    int bucket = -1;
    int64_t offset = 0;  // elements into the bucket (reduce_scatter: into each rank's segment)
    bool arrived = false;
  };
  struct Bucket {
    uint32_t mask = 0;
    DType dtype = DType::kF32;
    BucketKind kind = BucketKind::kAllReduce;
    std::string target;
    std::vector<int> params;
    int64_t numel = 0;    // buffer elements
    int64_t segment = 0;  // reduce_scatter: elements per rank
    std::vector<Communicator> comms;  // fused: one over the flattened dims; else one per dim
    std::string group;                // printed
    // per step
    Tensor buf, out;
    Work work;
    int pending = 0;
    bool launched = false;
  };

  DeviceMesh mesh;
  GradReducerOptions opt;
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  std::vector<HookHandle> hooks;
  bool layout = false;
  bool sync = true;
  bool in_finish = false;
  size_t next_launch = 0;
  GradReducerStats cur, last;
  std::map<uint32_t, Communicator> comms;  // by mask of mesh dims
  static constexpr int kCommTag = 20000;  // + mask: distinct from the mesh's own (mask) tags, < 32767

  State(const DeviceMesh& m, GradReducerOptions o) : mesh(m), opt(std::move(o)) {}

  const DTensorSpec& spec(const Param& P) const { return dtensor_spec(P.p, "GradReducer"); }

  // Partial dims of a gradient; checks that Partial ops are sums.
  uint32_t partial_mask(const Param& P, const Tensor& g) const {
    if (!g.is_distributed()) return 0;
    const auto& ps = dtensor_spec(g, "GradReducer").placements();
    uint32_t m = 0;
    for (size_t d = 0; d < ps.size(); ++d) {
      if (!ps[d].is_partial()) continue;
      MT_CHECK(ps[d].reduce_op() == PartialOp::kSum,
               "GradReducer: gradient of {} is {} on mesh dim '{}'; only Partial(sum) gradients are reduced",
               P.name, ps[d].str(), mesh.names()[d]);
      m |= 1u << d;
    }
    return m;
  }

  void on_grad(int i) {
    if (!sync || !layout) return;  // first step: the layout is built from .grad in finish()
    pack(i);
    if (opt.overlap && !in_finish) launch_ready(/*from_backward=*/true);
  }

  void pack(int i) {
    NoGradGuard ng;
    Param& P = params[static_cast<size_t>(i)];
    Tensor g = P.p.grad();
    if (P.bucket < 0) {
      P.arrived = g.defined();
      return;
    }
    if (!g.defined()) return;
    Bucket& b = buckets[static_cast<size_t>(P.bucket)];
    MT_CHECK(!b.launched,
             "GradReducer: the gradient of {} was accumulated again after its bucket {} was launched; call "
             "finish() between backward passes, or set_sync(false) for all micro-batches but the last",
             P.name, P.bucket);
    MT_CHECK(g.is_distributed(), "GradReducer: the gradient of {} is a plain tensor {}; expected a DTensor on {}",
             P.name, g.desc(), mesh.str());
    const auto& ps = dtensor_spec(g, "GradReducer").placements();
    const uint32_t m = partial_mask(P, g);
    bool zero_here = false;
    for (int d = 0; d < mesh.ndim(); ++d) {
      const Placement& have = ps[static_cast<size_t>(d)];
      const bool in_mask = (P.mask >> d) & 1;
      const bool ok = in_mask ? (have.is_partial() || have.is_replicate()) : have == P.reduced[static_cast<size_t>(d)];
      MT_CHECK(ok && (m & ~P.mask) == 0,
               "GradReducer: the gradient of {} has placements {} but its bucket reduces Partial dims {} to {} "
               "(the layout is fixed on the first synchronized step)",
               P.name, placements_str(ps), dims_str(mesh, P.mask), placements_str(P.target));
      // Replicate where the group is Partial: exact as a Partial(sum) held by coordinate 0 alone.
      if (in_mask && have.is_replicate() && mesh.coordinate(d) != 0) zero_here = true;
    }
    Tensor gl = local_view(g);
    MT_CHECK(gl.local_shape() == P.packed_shape, "GradReducer: the gradient of {} has local shape {}, expected {}",
             P.name, gl.local_shape(), P.packed_shape);
    if (!b.buf.defined()) b.buf = zeros({b.numel}, TensorOptions(b.dtype).with_device(P.p.device()));
    if (b.kind == BucketKind::kAllReduce) {
      Tensor dst = b.buf.narrow(0, P.offset, P.packed_shape.numel()).view(P.packed_shape);
      zero_here ? dst.zero_() : dst.copy_(gl);
    } else {
      const int64_t k = static_cast<int64_t>(b.comms[0].size());
      const int64_t n0 = P.packed_shape[0], row = n0 == 0 ? 0 : P.packed_shape.numel() / n0;
      for (int64_t r = 0; r < k; ++r) {
        IndexRange c = chunk_range(n0, k, r);
        if (c.length == 0) continue;
        Shape s = P.packed_shape;
        s[0] = c.length;
        Tensor dst = b.buf.narrow(0, r * b.segment + P.offset, c.length * row).view(s);
        zero_here ? dst.zero_() : dst.copy_(gl.narrow(0, c.start, c.length));
      }
    }
    if (!P.arrived) {
      P.arrived = true;
      --b.pending;
    }
  }

  void launch_ready(bool from_backward) {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(next_launch++, from_backward);
  }

  void count(int64_t bytes, BucketKind kind, bool from_backward) {
    ++cur.collectives;
    ++(kind == BucketKind::kAllReduce ? cur.all_reduces : cur.reduce_scatters);
    cur.bytes += bytes;
    if (from_backward) ++cur.launched_in_backward;
  }

  void launch(size_t bi, bool from_backward) {
    Bucket& b = buckets[bi];
    if (!b.buf.defined())
      b.buf = zeros({b.numel}, TensorOptions(b.dtype).with_device(params[static_cast<size_t>(b.params[0])].p.device()));
    const int64_t bytes = b.numel * static_cast<int64_t>(dtype_size(b.dtype));
    OverlappedCollectiveScope overlapped;  // launched now, waited for in finish()
    if (b.kind == BucketKind::kReduceScatter) {
      b.out = empty({b.segment}, b.buf.options());
      b.work = b.comms[0].reduce_scatter_async(b.buf, b.out);
    } else {
      b.work = b.comms[0].all_reduce_async(b.buf);  // unfused: the first dim; finish() does the rest
    }
    count(bytes, b.kind, from_backward);
    b.launched = true;
    ++cur.buckets;
  }

  void complete(Bucket& b) {
    b.work.wait();
    const int64_t bytes = b.numel * static_cast<int64_t>(dtype_size(b.dtype));
    for (size_t c = 1; c < b.comms.size(); ++c) {
      b.comms[c].all_reduce(b.buf);
      count(bytes, b.kind, false);
    }
    NoGradGuard ng;
    for (int i : b.params) {
      Param& P = params[static_cast<size_t>(i)];
      const Shape& gshape = P.p.shape();
      Tensor local;
      if (b.kind == BucketKind::kAllReduce) {
        local = b.buf.narrow(0, P.offset, P.packed_shape.numel()).view(P.packed_shape);
        local = P.reduced == P.target ? local.clone() : redistribute_local(local, gshape, P.reduced, P.target, mesh);
      } else {
        const int64_t k = static_cast<int64_t>(b.comms[0].size());
        const int64_t n0 = P.packed_shape[0], row = n0 == 0 ? 0 : P.packed_shape.numel() / n0;
        IndexRange c = chunk_range(n0, k, b.comms[0].rank());
        Shape s = P.packed_shape;
        s[0] = c.length;
        local = b.out.narrow(0, P.offset, c.length * row).view(s).clone();
      }
      set_target_grad(P, local);
    }
    b.buf = Tensor();
    b.out = Tensor();
    b.work = Work();
  }

  void set_target_grad(Param& P, Tensor local) {
    auto ts = intern_spec(spec(P).mesh(), P.target, P.p.shape());
    MT_ASSERT(local.local_shape() == ts->local_shape(), "GradReducer: {}: local {} vs target {}", P.name,
              local.local_shape(), ts->str());
    local.impl()->dist = ts;
    P.p.set_grad(local);
  }

  // The reducer's own communicator over the flattened dims of `mask` (the ranks of
  // mesh.flatten(...)), created on first use, which is in build_layout(): collective over the group,
  // in the same order on every rank. Private so that a bucket left in flight until finish() (a
  // parameter unused on some ranks) cannot be matched against someone else's collective on the
  // same group.
  Communicator comm_for(uint32_t mask) {
    auto it = comms.find(mask);
    if (it != comms.end()) return it->second;
    std::vector<std::string> names;
    std::string quoted;
    for (int d = 0; d < mesh.ndim(); ++d) {
      if (!((mask >> d) & 1)) continue;
      names.push_back(mesh.names()[static_cast<size_t>(d)]);
      quoted += fmt::format("{}\"{}\"", quoted.empty() ? "" : ", ", names.back());
    }
    std::string label;
    for (const auto& n : names) label += (label.empty() ? "" : ",") + n;
    if (mesh.is_simulated()) {  // estimates on meta tensors: counted, nothing moves
      const DeviceMesh flat = mesh.flatten(names);
      Communicator c = Communicator::simulated(
          static_cast<int>(flat.size()), static_cast<int>(flat.rank()),
          fmt::format("GradReducer group: mesh dims [{}] of simulated {}", quoted, mesh.str()), label);
      comms.emplace(mask, c);
      return c;
    }
    const std::vector<int> ranks = mesh.flatten(names).world_ranks();
    std::string rs;
    for (int r : ranks) rs += fmt::format("{}{}", rs.empty() ? "" : ", ", r);
    Communicator c = Communicator::create(
        ranks, kCommTag + static_cast<int>(mask),
        fmt::format("GradReducer group: mesh dims [{}] of {} (world ranks [{}])", quoted, mesh.str(), rs), label);
    comms.emplace(mask, c);
    return c;
  }

  // First synchronized step: every rank's Partial dims per parameter, OR-ed over the mesh.
  void build_layout() {
    const size_t n = params.size();
    const int nd = mesh.ndim();
    Tensor flags = zeros({static_cast<int64_t>(n), nd}, DType::kI64);
    int64_t* f = flags.data<int64_t>();
    for (size_t i = 0; i < n; ++i) {
      const uint32_t m = partial_mask(params[i], params[i].p.grad());
      for (int d = 0; d < nd; ++d) f[i * static_cast<size_t>(nd) + static_cast<size_t>(d)] = (m >> d) & 1;
    }
    if (n > 0 && !mesh.is_simulated()) {  // a simulated mesh: every rank is taken to have this rank's flags
      mesh.comm().all_reduce(flags, CommReduceOp::kMax);
      ++cur.setup_collectives;
    }
    std::map<std::string, int> open;  // group key -> open bucket
    for (size_t ri = n; ri-- > 0;) {   // reverse registration order: roughly the arrival order
      Param& P = params[ri];
      uint32_t m = 0;
      for (int d = 0; d < nd; ++d)
        if (f[ri * static_cast<size_t>(nd) + static_cast<size_t>(d)]) m |= 1u << d;
      P.mask = m;
      P.reduced = P.target;
      for (int d = 0; d < nd; ++d)
        if ((m >> d) & 1) P.reduced[static_cast<size_t>(d)] = Placement::replicate();
      P.packed_shape = intern_spec(spec(P).mesh(), P.reduced, P.p.shape())->local_shape();
      if (m == 0) continue;
      // reduce_scatter when the one Partial dim's target is S(0) and nothing else splits dim 0.
      BucketKind kind = BucketKind::kAllReduce;
      if (std::popcount(m) == 1 && P.p.dim() >= 1) {
        const int d = std::countr_zero(m);
        bool rs = P.target[static_cast<size_t>(d)].is_shard() && P.target[static_cast<size_t>(d)].dim() == 0;
        for (int e = 0; e < nd && rs; ++e)
          if (e != d && P.target[static_cast<size_t>(e)].splits() && P.target[static_cast<size_t>(e)].dim() == 0)
            rs = false;
        if (rs) kind = BucketKind::kReduceScatter;
      }
      const std::string tstr = placements_str(P.target);
      const std::string key = fmt::format("{}|{}|{}", m, tstr, dtype_name(P.p.dtype()));
      const int64_t isz = static_cast<int64_t>(dtype_size(P.p.dtype()));
      auto it = open.find(key);
      int bi = it == open.end() ? -1 : it->second;
      int64_t elems = P.packed_shape.numel();
      if (kind == BucketKind::kReduceScatter) {
        const int64_t k = mesh.size(std::countr_zero(m));
        const int64_t n0 = P.packed_shape[0];
        elems = ceil_div(n0, k) * (n0 == 0 ? 0 : P.packed_shape.numel() / n0) * k;
      }
      if (bi >= 0) {
        Bucket& b = buckets[static_cast<size_t>(bi)];
        if (!opt.fuse || (b.numel + elems) * isz > opt.bucket_bytes) bi = -1;
      }
      if (bi < 0) {
        Bucket b;
        b.mask = m;
        b.dtype = P.p.dtype();
        b.kind = kind;
        b.target = tstr;
        b.group = fmt::format("Partial {} -> {} {}", dims_str(mesh, m), tstr, dtype_name(b.dtype));
        std::vector<std::string> names;
        for (int d = 0; d < nd; ++d)
          if ((m >> d) & 1) names.push_back(mesh.names()[static_cast<size_t>(d)]);
        if (opt.fuse) {
          b.comms.push_back(comm_for(m));
        } else {
          for (int d = 0; d < nd; ++d)
            if ((m >> d) & 1) b.comms.push_back(comm_for(1u << d));
        }
        bi = static_cast<int>(buckets.size());
        buckets.push_back(std::move(b));
        open[key] = bi;
      }
      Bucket& b = buckets[static_cast<size_t>(bi)];
      P.bucket = bi;
      b.params.push_back(static_cast<int>(ri));
      if (kind == BucketKind::kReduceScatter) {
        const int64_t k = static_cast<int64_t>(b.comms[0].size());
        P.offset = b.segment;
        b.segment += elems / std::max<int64_t>(k, 1);
        b.numel = b.segment * k;
      } else {
        P.offset = b.numel;
        b.numel += elems;
      }
    }
    layout = true;
  }

  void reset_step() {
    for (auto& P : params) P.arrived = false;
    for (auto& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.launched = false;
    }
    next_launch = 0;
  }

  void finish() {
    if (!sync) return;
    in_finish = true;
    struct Reset {
      bool* f;
      ~Reset() { *f = false; }
    } reset{&in_finish};
    if (!layout) {
      build_layout();
      reset_step();
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].p.grad().defined()) pack(static_cast<int>(i));
    }
    // A gradient accumulated in an earlier micro-batch (set_sync(false)) of a parameter that got
    // none in this one (an expert no token of the last micro-batch was routed to): no hook fired
    // for it in this pass, so it is packed now (its bucket waited for it: not launched yet).
    for (size_t i = 0; i < params.size(); ++i)
      if (!params[i].arrived && params[i].p.grad().defined()) pack(static_cast<int>(i));
    // Parameters whose gradient never arrived contribute zeros (the buffer starts zeroed).
    for (auto& P : params)
      if (!P.arrived) ++cur.unused;
    for (size_t bi = next_launch; bi < buckets.size(); ++bi) launch(bi, false);
    next_launch = buckets.size();
    for (auto& b : buckets) complete(b);
    NoGradGuard ng;
    // One small collective per step agrees on which parameters got a gradient anywhere and, for
    // those outside the buckets, over which mesh dims any rank's gradient is Partial: a parameter
    // with no gradient anywhere on the step that fixed the layout (an expert no token picked) is
    // outside the buckets, and may get a Partial one later (under dp x ep: P(sum)@dp). Every rank
    // then reduces it the same way, a rank without it contributing zeros.
    const std::vector<uint32_t> agreed = agree_presence();
    for (size_t i = 0; i < params.size(); ++i) {
      Param& P = params[i];
      if (P.bucket >= 0) continue;
      Tensor g = P.p.grad();
      const uint32_t am = agreed[i] >> 1;
      if (am != 0) {
        Placements src = P.target;
        for (int d = 0; d < mesh.ndim(); ++d)
          if ((am >> d) & 1) src[static_cast<size_t>(d)] = Placement::partial();
        Tensor local;
        if (g.defined()) {
          const Placements& ps = dtensor_spec(g, "GradReducer").placements();
          MT_CHECK(ps == src, "GradReducer: the gradient of {} is {} on this rank but {} where it is Partial "
                   "elsewhere (parameter {})", P.name, placements_str(ps), placements_str(src),
                   placements_str(P.target));
          local = local_view(g);
        } else {
          local = zeros(intern_spec(spec(P).mesh(), src, P.p.shape())->local_shape(), P.p.options());
        }
        set_target_grad(P, redistribute_local(local, P.p.shape(), src, P.target, mesh));
        ++cur.late_partial;
        continue;
      }
      if (!g.defined()) {
        set_target_grad(P, zeros(intern_spec(spec(P).mesh(), P.target, P.p.shape())->local_shape(), P.p.options()));
        continue;
      }
      ++cur.passed_through;
      const auto& ps = dtensor_spec(g, "GradReducer").placements();
      if (ps != P.target) set_target_grad(P, redistribute_local(local_view(g), P.p.shape(), ps, P.target, mesh));
    }
    drop_unused_everywhere(agreed);
    last = cur;
    cur = GradReducerStats();
    reset_step();
  }

  // Per parameter, bit 0: a gradient arrived on some rank; bits 1..: the mesh dims over which some
  // rank's gradient of a parameter outside the buckets is Partial. One all_reduce (max) over the
  // whole mesh, on the host, every synchronized step.
  std::vector<uint32_t> agree_presence() {
    const auto n = static_cast<int64_t>(params.size());
    std::vector<uint32_t> out(static_cast<size_t>(n), 0);
    if (n == 0) return out;
    const int64_t w = 1 + mesh.ndim();
    Tensor flags = zeros({n, w}, DType::kI64);
    int64_t* f = flags.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const Param& P = params[static_cast<size_t>(i)];
      f[i * w] = P.arrived ? 1 : 0;
      if (P.bucket < 0 && P.p.grad().defined()) {
        const uint32_t m = partial_mask(P, P.p.grad());
        for (int d = 0; d < mesh.ndim(); ++d) f[i * w + 1 + d] = (m >> d) & 1;
      }
    }
    if (mesh.is_simulated()) {
      // Estimates (meta tensors): every rank is taken to have this rank's flags; the collective
      // the real step runs is counted (mesh/collective_count.h).
      std::string dims;
      for (int d = 0; d < mesh.ndim(); ++d) {
        if (d > 0) dims += ',';
        dims += mesh.dim_label(d);
      }
      count_collective("all_reduce", dims, mesh.size(), n * w * static_cast<int64_t>(sizeof(int64_t)));
    } else {
      mesh.comm().all_reduce(flags, CommReduceOp::kMax);
    }
    ++cur.presence_checks;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < w; ++j)
        if (f[i * w + j]) out[static_cast<size_t>(i)] |= 1u << j;
    return out;
  }

  // A parameter that got a gradient on no rank at all (an expert no token was routed to) ends with
  // no gradient, as on one device, so that the optimizer skips it (no weight decay, no moment
  // update); where any rank had one, the others contributed zeros.
  void drop_unused_everywhere(const std::vector<uint32_t>& agreed) {
    for (size_t i = 0; i < params.size(); ++i)
      if ((agreed[i] & 1) == 0) {
        params[i].p.set_grad(Tensor());
        ++cur.unused_everywhere;
      }
  }

  std::string layout_str() const {
    std::string s;
    for (size_t bi = 0; bi < buckets.size(); ++bi) {
      const Bucket& b = buckets[bi];
      std::string names;
      for (int i : b.params) names += (names.empty() ? "" : " ") + params[static_cast<size_t>(i)].name;
      s += fmt::format("bucket {}: {}: {} x{} over {}, {} bytes: {}\n", bi, b.group,
                       b.kind == BucketKind::kAllReduce ? "all_reduce" : "reduce_scatter", b.comms.size(),
                       b.comms[0].description(), b.numel * static_cast<int64_t>(dtype_size(b.dtype)), names);
    }
    return s;
  }
};

GradReducer::GradReducer(const Module& model, const DeviceMesh& mesh, GradReducerOptions options)
    : GradReducer(model.named_parameters(), mesh, std::move(options)) {}

GradReducer::GradReducer(NamedTensors params, const DeviceMesh& mesh, GradReducerOptions options)
    : s_(std::make_shared<State>(mesh, std::move(options))) {
  MT_CHECK(mesh.ndim() <= 32, "GradReducer: mesh {} has more than 32 dims", mesh.str());
  for (auto& [name, p] : params) {
    if (!p.defined() || !p.requires_grad()) continue;
    MT_CHECK(p.is_distributed(),
             "GradReducer: parameter {} ({}) is not a DTensor; parallelize the model first (every parameter must "
             "be a DTensor on {})",
             name, p.desc(), mesh.str());
    const DTensorSpec& sp = dtensor_spec(p, "GradReducer");
    MT_CHECK(sp.mesh().str() == mesh.str() && sp.mesh().world_ranks_key() == mesh.world_ranks_key(),
             "GradReducer: parameter {} lives on {}, not on the reducer's mesh {}", name, sp.mesh().str(), mesh.str());
    State::Param P;
    P.name = name;
    P.p = p;
    P.target = s_->opt.grad_placements ? s_->opt.grad_placements(name, p) : sp.placements();
    MT_CHECK(P.target.size() == static_cast<size_t>(mesh.ndim()),
             "GradReducer: grad_placements for {} gave {} placements for mesh {}", name, placements_str(P.target),
             mesh.str());
    for (const auto& t : P.target)
      MT_CHECK(!t.is_partial(), "GradReducer: target placements {} of {} must not be Partial",
               placements_str(P.target), name);
    intern_spec(sp.mesh(), P.target, p.shape());  // validates the target against the shape
    s_->params.push_back(std::move(P));
  }
  std::weak_ptr<State> weak = s_;
  for (size_t i = 0; i < s_->params.size(); ++i) {
    s_->hooks.push_back(s_->params[i].p.register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto s = weak.lock()) s->on_grad(static_cast<int>(i));
    }));
  }
}

GradReducer::GradReducer(GradReducer&&) noexcept = default;
GradReducer& GradReducer::operator=(GradReducer&&) noexcept = default;
GradReducer::~GradReducer() {
  if (s_) remove();
}

void GradReducer::set_sync(bool sync) { s_->sync = sync; }
bool GradReducer::sync() const { return s_->sync; }
void GradReducer::finish() { s_->finish(); }
const GradReducerStats& GradReducer::stats() const { return s_->last; }
std::string GradReducer::layout_str() const { return s_->layout_str(); }
int64_t GradReducer::num_buckets() const { return static_cast<int64_t>(s_->buckets.size()); }

void GradReducer::remove() {
  for (auto& h : s_->hooks) h.remove();
  s_->hooks.clear();
  for (auto& b : s_->buckets) b.work.wait();
}

}  // namespace mt
