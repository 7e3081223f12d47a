// The DTensor dispatch handler: propagation cache, shape inference on meta tensors (cache misses
// only), local execution, autograd boundaries. Composite ops that need communication inside
// (vocabulary-parallel embedding and cross-entropy, losses over split rows) and sharded random
// fills live in mesh/dist_composites.cpp.
#include "mesh/dispatch.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "kernels/cost.h"
#include "kernels/registry.h"
#include "mesh/dist_composites.h"
#include "mesh/dtensor.h"
#include "mesh/sharding_rules.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_replicate.h"
#include "tensor/ops_pointwise.h"

namespace mt {

namespace {

std::atomic<DistErrorNote> g_error_note{nullptr};
bool g_implicit = [] {
  const char* e = std::getenv("MT_DTENSOR_IMPLICIT");
  return e && std::strcmp(e, "1") == 0;
}();

// A cache key: the op's identity, its rule-relevant arguments, and per input its spec's id (plain
// inputs: their shape, taken as Replicate). Inline words: no allocation on a hit. The id, not the
// address: a spec no tensor holds any more is freed, and a new one may take its address.
struct Key {
  static constexpr int kCap = 48;
  int64_t w[kCap];
  int n = 0;
  bool overflow = false;  // too many words: not cached
  void push(int64_t v) {
    if (n < kCap) w[n++] = v;
    else overflow = true;
  }
  bool operator==(const Key& o) const { return n == o.n && std::equal(w, w + n, o.w); }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < k.n; ++i) h = (h ^ static_cast<uint64_t>(k.w[i])) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Entry {
  std::string error;                                       // the rule rejects: thrown on every hit
  std::vector<std::shared_ptr<const DTensorSpec>> out;      // per output (null: undefined output)
  std::vector<Shape> out_local;                             // their local shapes on this rank
  std::vector<std::shared_ptr<const DTensorSpec>> in_grad;  // per input: its gradient's spec
  std::vector<uint8_t> zero_input;                          // input replaced by zeros on this rank
  std::vector<Placements> pre;                              // implicit mode: inputs redistributed first
  DistCtx ctx;
};

// At most kMaxEntries entries: a run whose shapes vary (batch or sequence sizes that change,
// evaluation batches) makes a new entry per shape, each holding its specs, and grew without bound
// until 2026-12-07 (about 25 KB per distinct shape of a small model's step). Past the bound the
// cache is emptied and refills; a training step of a stock plan needs a few hundred entries.
constexpr size_t kMaxEntries = 4096;

struct Cache {
  std::unordered_map<Key, Entry, KeyHash> map;
  DispatchStats stats;
  int depth = 0;  // handle() frames on this thread: entries are referenced while it is above 0
};
Cache& cache() {
  thread_local Cache c;
  return c;
}

const DTensorSpec* spec_of(const Tensor& t) { return static_cast<const DTensorSpec*>(t.dist_spec()); }

Key make_key(const DistOp& op, const std::vector<Tensor>& in) {
  Key k;
  k.push(reinterpret_cast<int64_t>(op.name));
  k.push(static_cast<int64_t>(op.rule));
  for (int64_t a : op.args) k.push(a);
  k.push(op.shape.size());
  for (int64_t v : op.shape) k.push(v);
  k.push(op.key.size());
  for (int64_t v : op.key) k.push(v);
  for (const Tensor& t : in) {
    if (!t.defined()) {
      k.push(0);
    } else if (t.is_distributed()) {
      k.push(static_cast<int64_t>(spec_of(t)->id()));
    } else {
      k.push(-1 - t.dim());
      for (int64_t v : t.shape()) k.push(v);
    }
  }
  return k;
}

// The placements of an input's gradient (docs/sharding.md, "Gradients"): a split input keeps its
// split; a Partial(sum) input gets Replicate; a Replicate input gets Replicate where every output
// is Replicate (all ranks computed the same gradient) and Partial(sum) elsewhere (each rank
// holds the contribution of its part of the output).
Placements input_grad_placements(const Placements& in, const std::vector<Placements>& outs) {
  Placements g = in;
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d].splits()) continue;
    if (in[d].is_partial()) {
      g[d] = Placement::replicate();
      continue;
    }
    // A replicated input's gradient is each rank's term of a sum where an output is Partial(sum) or
    // split, but where every such output is Partial(avg) each rank's term is already the whole
    // gradient scaled as the average scales it: the terms average (summing them gave k times the
    // gradient until 2026-11-28).
    bool all_r = true, all_avg = true;
    for (const auto& o : outs) {
      all_r = all_r && o[d].is_replicate();
      if (!o[d].is_replicate()) all_avg = all_avg && o[d].is_partial() && o[d].reduce_op() == PartialOp::kAvg;
    }
    g[d] = all_r ? Placement::replicate() : Placement::partial(all_avg ? PartialOp::kAvg : PartialOp::kSum);
  }
  return g;
}

bool coords_zero(const DeviceMesh& mesh, uint32_t dims) {
  for (int d = 0; d < mesh.ndim(); ++d)
    if (((dims >> d) & 1) && mesh.coordinate(d) != 0) return false;
  return true;
}

Entry build_entry(const DistOp& op, const std::vector<Tensor>& in, DistLocalFn local) {
  const DeviceMesh* mesh = nullptr;
  for (const Tensor& t : in)
    if (t.defined() && t.is_distributed()) {
      const DeviceMesh& m = spec_of(t)->mesh();
      if (!mesh) {
        mesh = &m;
      } else {
        MT_CHECK(m.str() == mesh->str() && m.world_ranks_key() == mesh->world_ranks_key(),
                 "{}: DTensor inputs live on different meshes {} and {}", op.name, mesh->str(), m.str());
      }
    }
  MT_ASSERT(mesh, "dispatch of {} without a DTensor input", op.name);
  const Placements all_r(static_cast<size_t>(mesh->ndim()), Placement::replicate());
  std::vector<std::shared_ptr<const DTensorSpec>> specs(in.size());
  std::vector<const DTensorSpec*> raw(in.size(), nullptr);
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].defined()) continue;
    specs[i] = in[i].is_distributed() ? std::static_pointer_cast<const DTensorSpec>(
                                            spec_of(in[i])->shared_from_this())
                                      : intern_spec(*mesh, all_r, in[i].shape());
    raw[i] = specs[i].get();
  }
  // Shape inference: the op on global-shaped meta tensors gives the outputs' global shapes (and
  // the front end's own checks, with global shapes in their messages).
  std::vector<Shape> out_shapes;
  {
    MetaKernelsGuard meta;
    NoGradGuard no_grad;
    std::vector<Tensor> m(in.size());
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i].defined()) m[i] = empty(in[i].shape(), TensorOptions(in[i].dtype()).with_device(Device::meta()));
    DistCtx mc;
    mc.meta_run = true;
    for (const Tensor& o : local(m, mc)) out_shapes.push_back(o.defined() ? o.shape() : Shape{});
  }
  RuleResult r = propagate(op, raw, out_shapes);
  Entry e;
  e.pre.assign(in.size(), Placements());
  if (!r.error.empty() && g_implicit) {
    // Implicit mode: replicate every non-Replicate input on the mesh dims the rule rejected, one
    // mesh dim at a time, until the rule accepts (all-Replicate always does for these rules).
    std::vector<std::shared_ptr<const DTensorSpec>> moved = specs;
    for (int d = 0; d < mesh->ndim() && !r.error.empty(); ++d) {
      for (size_t i = 0; i < in.size(); ++i) {
        if (!moved[i] || moved[i]->placements()[d].is_replicate()) continue;
        Placements ps = moved[i]->placements();
        const Placement was = ps[d];
        ps[d] = Placement::replicate();
        try {
          moved[i] = intern_spec(*mesh, ps, moved[i]->global_shape());
        } catch (const Error&) {
          // A split of the same tensor dim on a later mesh dim, sized within this one's shards (a
          // RaggedShard of a dp shard's rows), does not fit the whole dim: replicated too (the
          // spec check failed with no word of the op or of implicit mode until 2026-12-07).
          for (int d2 = d + 1; d2 < mesh->ndim(); ++d2)
            if (was.splits() && ps[d2].splits() && ps[d2].dim() == was.dim()) ps[d2] = Placement::replicate();
          moved[i] = intern_spec(*mesh, ps, moved[i]->global_shape());
        }
        raw[i] = moved[i].get();
        e.pre[i] = ps;
      }
      r = propagate(op, raw, out_shapes);
    }
    specs = moved;
  }
  if (!r.error.empty()) {
    e.error = r.error;
    return e;
  }
  for (size_t k = 0; k < out_shapes.size(); ++k) {
    e.out.push_back(intern_spec(*mesh, r.outputs[k], out_shapes[k]));
    e.out_local.push_back(e.out.back()->local_shape());
  }
  e.in_grad.resize(in.size());
  e.zero_input.assign(in.size(), 0);
  for (size_t i = 0; i < in.size(); ++i) {
    if (!specs[i]) continue;
    e.in_grad[i] = intern_spec(*mesh, input_grad_placements(specs[i]->placements(), r.outputs), specs[i]->global_shape());
    e.zero_input[i] = r.root_only[i] && !coords_zero(*mesh, r.root_only[i]);
  }
  e.ctx.partial_root = coords_zero(*mesh, r.partial_sum_dims);
  if (!e.out_local.empty()) e.ctx.out_local_shape = e.out_local[0];
  return e;
}

// The local input of a DTensor op. With grad, a boundary node turns the local gradient into a
// DTensor gradient of `grad_spec`; a plain input (taken as Replicate) gets a plain gradient,
// all-reduced first when it is Partial.
Tensor local_input(const Tensor& t, const std::shared_ptr<const DTensorSpec>& grad_spec) {
  Tensor l = local_view(t);
  if (l.same(t)) l = t.detach();  // a plain input: a fresh alias (outputs may be attached specs)
  if (!needs_grad(t)) return l;
  const bool plain = !t.is_distributed();
  record("DTensorLocalBackward", {t}, l, [grad_spec, plain](const std::vector<Tensor>& g) {
    Tensor gl = g[0];
    if (gl.is_distributed()) gl = local_view(gl);
    Tensor gd = gl.detach();
    gd.impl()->dist = grad_spec;
    if (!plain) return std::vector<Tensor>{gd};
    if (grad_spec->has_partial()) gd = redistribute(gd, Placements(grad_spec->placements().size()));
    return std::vector<Tensor>{local_view(gd)};
  });
  return l;
}

// Wraps a local output as a DTensor of `spec`. With grad, the incoming DTensor gradient is brought
// to the output's gradient placements (Partial -> Replicate, a collective if it arrives otherwise)
// and its local tensor flows into the local graph.
Tensor wrap_output(Tensor local, const std::shared_ptr<const DTensorSpec>& spec, const Shape& local_shape,
                   const DistOp& op) {
  if (!local.defined()) return local;
  MT_CHECK(local.local_shape() == local_shape,
           "{}: internal error: the sharding rule gives {} (local shape {}) but the local op made {}", op.name,
           spec->str(), local_shape, local.local_shape());
  if (!local.requires_grad()) {
    if (local.use_count() > 1 || local.is_distributed()) local = make_view(local, local.local_shape(), local.strides(), local.offset());
    local.impl()->dist = spec;
    return local;
  }
  Tensor out = make_view(local, local.local_shape(), local.strides(), local.offset());
  out.impl()->dist = spec;
  auto gspec = std::static_pointer_cast<const DTensorSpec>(spec->grad_spec());
  record("DTensorWrapBackward", {local}, out, [gspec](const std::vector<Tensor>& g) {
    Tensor gd = g[0];
    if (gd.is_distributed()) {
      const auto* s = static_cast<const DTensorSpec*>(gd.dist_spec());
      if (s != gspec.get()) gd = redistribute(gd, gspec->placements());
      return std::vector<Tensor>{local_view(gd)};
    }
    return std::vector<Tensor>{gd};
  });
  return out;
}

std::vector<Tensor> handle(const DistOp& op, const std::vector<Tensor>& in, DistLocalFn local) {
  count_host_call(HostCall::kDistOp);  // the estimate's per-call host cost (kernels/cost.h)
  if (op.rule == DistRule::kRandomFill) return {dist_random_fill(op, in[0])};
  if (auto composite = dist_composite(op, in)) return {*composite};
  Cache& c = cache();
  // Emptied only by the outermost call: an inner one (a redistribution inside this op) must not
  // free the entry an outer frame is using.
  if (c.depth == 0 && c.map.size() >= kMaxEntries) {
    c.map.clear();
    ++c.stats.flushes;
  }
  struct Depth {
    int& d;
    explicit Depth(int& x) : d(x) { ++d; }
    ~Depth() { --d; }
  } depth(c.depth);
  Key key = make_key(op, in);
  auto it = c.map.find(key);
  Entry uncached;
  if (key.overflow) {
    ++c.stats.misses;
    uncached = build_entry(op, in, local);
  } else if (it == c.map.end()) {
    ++c.stats.misses;
    it = c.map.emplace(std::move(key), build_entry(op, in, local)).first;
  } else {
    ++c.stats.hits;
  }
  const Entry& e = key.overflow ? uncached : it->second;
  if (!e.error.empty()) {
    DistErrorNote note = g_error_note.load();
    MT_FAIL("{}{}", e.error, note ? note() : std::string());
  }
  std::vector<Tensor> locals(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].defined()) continue;
    Tensor t = e.pre[i].empty() ? in[i] : redistribute(in[i], e.pre[i]);
    if (e.zero_input[i]) {
      // Not this rank's term: zeros, still wired to the input so that every rank produces a
      // gradient of the same spec (zero here) and joins the same collectives.
      locals[i] = needs_grad(t) ? mul(local_input(t, e.in_grad[i]), 0.0) : zeros(t.local_shape(), t.options());
      continue;
    }
    locals[i] = local_input(t, e.in_grad[i]);
  }
  std::vector<Tensor> outs = local(locals, e.ctx);
  MT_ASSERT(outs.size() == e.out.size(), "{}: {} outputs, rule has {}", op.name, outs.size(), e.out.size());
  for (size_t k = 0; k < outs.size(); ++k) outs[k] = wrap_output(std::move(outs[k]), e.out[k], e.out_local[k], op);
  return outs;
}

}  // namespace

void install_dist_dispatch() {
  set_dist_handler(&handle);
  set_dist_replicate_handler([](const Tensor& t) {
    const DTensorSpec& s = dtensor_spec(t, "dist_replicate");
    return redistribute(t, Placements(s.placements().size(), Placement::replicate()));
  });
}

void set_dist_error_note(DistErrorNote note) { g_error_note = note; }

void set_implicit_redistribute(bool on) {
  if (on != g_implicit) clear_dispatch_cache();
  g_implicit = on;
}
bool implicit_redistribute() { return g_implicit; }

DispatchStats dispatch_stats() {
  DispatchStats s = cache().stats;
  s.entries = static_cast<int64_t>(cache().map.size());
  return s;
}
void clear_dispatch_cache() {
  cache().map.clear();
  cache().stats = {};
}

}  // namespace mt
