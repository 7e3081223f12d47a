// The autograd engine and the recording helpers the op front ends use.
//
// Order of a backward pass: collect the graph reachable from the roots and count, for each node,
// how many edges point at it; then repeatedly run the ready node with the highest creation
// sequence number (so the most recent op's backward runs first, which keeps memory low and
// makes the order deterministic). For each node: tensor hooks on each output gradient, node
// pre-hooks, apply, node post-hooks, then gradients flow along the edges and are summed per input.
#include "tensor/autograd.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "runtime/error.h"
#include "runtime/profiler.h"
#include "tensor/grad_destination.h"
#include "tensor/ops_pointwise.h"
#include "tensor/ops_reduce.h"

namespace mt {

namespace {
thread_local bool g_grad_enabled = true;
std::atomic<uint64_t> g_next_seq{0};

// Backward passes running on this thread (nested: a backward inside a node) and the callbacks
// queued for the end of the outermost one.
thread_local int g_engine_depth = 0;
thread_local std::vector<std::function<void()>> g_backward_callbacks;
// The accumulation targets offered to the backward formula now running (grad_accumulation_target).
thread_local const std::vector<Tensor>* g_accumulation_targets = nullptr;

// Runs the queued callbacks (and any they queue) when the outermost pass ends.
struct EngineScope {
  EngineScope() { ++g_engine_depth; }
  EngineScope(const EngineScope&) = delete;
  EngineScope& operator=(const EngineScope&) = delete;
  ~EngineScope() {
    if (g_engine_depth > 1 || g_backward_callbacks.empty()) {
      --g_engine_depth;
      return;
    }
    // The pass or a callback threw: run what is left, keep the first exception.
    while (!g_backward_callbacks.empty()) {
      try {
        run_callbacks();
      } catch (...) {
      }
    }
    --g_engine_depth;
  }
  void finish() { run_callbacks(); }
  // One at a time from the front, so that after a throw the rest are still queued.
  static void run_callbacks() {
    while (!g_backward_callbacks.empty()) {
      std::function<void()> fn = std::move(g_backward_callbacks.front());
      g_backward_callbacks.erase(g_backward_callbacks.begin());
      fn();
    }
  }
};
}  // namespace

void queue_backward_callback(std::function<void()> fn) {
  if (g_engine_depth == 0) {
    fn();
    return;
  }
  g_backward_callbacks.push_back(std::move(fn));
}

bool backward_running() { return g_engine_depth > 0; }

Tensor grad_accumulation_target(size_t input) {
  const std::vector<Tensor>* t = g_accumulation_targets;
  return t && input < t->size() ? (*t)[input] : Tensor();
}

bool GradMode::enabled() { return g_grad_enabled; }
void GradMode::set(bool on) { g_grad_enabled = on; }

namespace {
// Sum of two gradients of one tensor; a DTensor gradient keeps its (interned) spec, and both
// terms of a sum must hold the same placements (their local shards are added).
// DTensor gradients are added by DTensor dispatch (same placements, or Partial + Replicate).
Tensor add_grads(const Tensor& a, const Tensor& b) { return add(a, b); }

// A tensor like `meta`'s output filled with `value`: local shape, and the spec of a DTensor.
Tensor filled_like(const Node::OutputMeta& meta, double value) {
  Tensor t = full(meta.shape, value, TensorOptions(meta.dtype).with_device(meta.device));
  t.impl()->dist = meta.dist;
  return t;
}

Node::OutputMeta output_meta(const Tensor& t) {
  return {t.local_shape(), t.dtype(), t.device(), t.impl()->dist};
}
}  // namespace

Node::Node() : seq(g_next_seq.fetch_add(1, std::memory_order_relaxed)) {
  // Profiling (runtime/profiler.h): the node's backward is attributed to the module around it now.
  if (kernel_hooks_armed())
    if (Profiler* p = Profiler::current()) p->note_node(seq);
}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>& grads) {
  MT_ASSERT(fn_ != nullptr, "{} applied after release", name_);
  return fn_(grads);
}

AccumulateGrad::AccumulateGrad(Tensor l) : leaf(std::move(l)) {
  outputs.push_back(output_meta(leaf));
  output_hooks.resize(1);
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>& grads) {
  Tensor g = std::move(grads[0]);
  auto gspec = g.impl()->dist;  // a DTensor's gradient stays a DTensor (hooks and casts drop it)
  AutogradMeta& m = leaf.impl()->meta();
  for (auto& hook : m.hooks.snapshot()) {
    Tensor r = hook(g);
    if (r.defined()) g = r;
  }
  if (g.impl()->dist) gspec = g.impl()->dist;
  MT_CHECK(g.shape() == leaf.shape(), "gradient {} does not match leaf {}", g.shape(), leaf.shape());
  // The accumulated .grad's dtype: an existing .grad's, else the one asked for (set_grad_dtype),
  // else the leaf's.
  const bool have_grad = m.grad && m.grad->defined();
  const DType want = have_grad ? m.grad->dtype() : m.grad_dtype.value_or(leaf.dtype());
  if (g.dtype() != want) {
    g = g.to(want);
    g.impl()->dist = gspec;  // (a cast may drop a DTensor's spec; the .grad below gets it anyway)
  }
  if (!have_grad) {
    // .grad is later updated in place, so it must own its memory: steal g only when nothing
    // else can see its storage.
    // With create_graph the clone is recorded, so .grad stays differentiable (and never aliases
    // a broadcast view that a later in-place add_ would corrupt).
    // A view of a lending gradient buffer (FSDP's shard of gradients, tensor/grad_destination.h)
    // is taken as it is: its owner never writes it again while a .grad views it.
    bool exclusive = !GradMode::enabled() && g.impl()->storage &&
                     ((g.use_count() == 1 && g.is_contiguous() && g.impl()->storage->use_count() == 1) ||
                      lends_grad_views(g.impl()->storage.get()));
    m.grad = std::make_unique<Tensor>(exclusive ? g : g.clone());
    m.grad->impl()->dist = gspec;
  } else {
    const auto& have = m.grad->impl()->dist;
    MT_CHECK(!have || !gspec || have == gspec,
             "gradient spec {} does not match the accumulated gradient's spec {}", gspec->str(),
             have->str());
    auto spec = have ? have : gspec;
    if (GradMode::enabled()) {
      *m.grad = add(*m.grad, g);  // create_graph: keep the sum differentiable
    } else {
      m.grad->add_(g);
    }
    m.grad->impl()->dist = spec;
  }
  for (auto& hook : m.post_accumulate_hooks.snapshot()) hook(leaf);
  return {};
}

// ---- recording --------------------------------------------------------------------------------

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta& m = t.impl()->meta();
  if (m.grad_fn) return {m.grad_fn, m.output_nr};
  std::shared_ptr<Node> acc = m.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m.grad_accumulator = acc;
  }
  return {acc, 0};
}

void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor*>& outputs) {
  node->next.clear();
  for (const Tensor& in : inputs)
    node->next.push_back(in.defined() && in.requires_grad() ? gradient_edge(in) : Edge{});
  node->outputs.clear();
  node->output_hooks.resize(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    Tensor& out = *outputs[k];
    node->outputs.push_back(output_meta(out));
    out.impl()->requires_grad = true;
    AutogradMeta& m = out.impl()->meta();
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(k);
  }
}

void record(const char* name, const std::vector<Tensor>& inputs, Tensor& output, FunctionNode::Fn fn) {
  set_history(std::make_shared<FunctionNode>(name, std::move(fn)), inputs, {&output});
}

// ---- Tensor autograd methods ------------------------------------------------------------------

bool Tensor::is_leaf() const { return !impl_->autograd || !impl_->autograd->grad_fn; }

Tensor Tensor::grad() const {
  if (!impl_->autograd || !impl_->autograd->grad) return Tensor();
  return *impl_->autograd->grad;
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined())
    MT_CHECK(g.shape() == shape(), "set_grad: gradient {} does not match tensor {}", g.desc(), desc());
  impl_->meta().grad = std::make_unique<Tensor>(g);
}

void Tensor::set_grad_dtype(std::optional<DType> dtype) const {
  MT_CHECK(!dtype || is_floating(*dtype), "set_grad_dtype: {} is not a floating dtype (tensor {})",
           dtype ? dtype_name(*dtype) : "", desc());
  impl_->meta().grad_dtype = dtype;
}

std::optional<DType> Tensor::grad_dtype() const {
  return impl_->autograd ? impl_->autograd->grad_dtype : std::nullopt;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> kNone;
  return impl_->autograd ? impl_->autograd->grad_fn : kNone;
}

uint32_t Tensor::output_nr() const { return impl_->autograd ? impl_->autograd->output_nr : 0; }

HookHandle Tensor::register_hook(GradHook hook) {
  MT_CHECK(requires_grad(), "register_hook on {} which does not require grad", desc());
  AutogradMeta& m = impl_->meta();
  if (m.grad_fn) return m.grad_fn->output_hooks[m.output_nr].add(std::move(hook));
  return m.hooks.add(std::move(hook));
}

HookHandle Tensor::register_post_accumulate_grad_hook(PostAccumulateHook hook) {
  MT_CHECK(requires_grad() && is_leaf(),
           "register_post_accumulate_grad_hook needs a leaf that requires grad, got {}", desc());
  return impl_->meta().post_accumulate_hooks.add(std::move(hook));
}

void Tensor::retain_grad() {
  MT_CHECK(requires_grad(), "retain_grad on {} which does not require grad", desc());
  if (is_leaf()) return;
  AutogradMeta& m = impl_->meta();
  if (m.retains_grad) return;
  m.retains_grad = true;
  // The hook lives in our grad_fn, which may outlive this tensor (other nodes point at it), so it
  // must not keep a dangling pointer: a token owned by our (otherwise unused, non-leaf) meta.hooks
  // list dies with the tensor and tells the hook to do nothing.
  TensorImpl* self = impl_.get();
  auto alive = std::make_shared<char>(0);
  m.hooks.add([alive](const Tensor&) { return Tensor(); });
  register_hook([self, weak = std::weak_ptr<char>(alive)](const Tensor& g) {
    if (weak.expired()) return Tensor();
    AutogradMeta& mm = self->meta();
    if (!mm.grad || !mm.grad->defined())
      mm.grad = std::make_unique<Tensor>(g.detach().clone());
    else
      *mm.grad = add(*mm.grad, g.detach());
    return Tensor();
  });
}

Tensor Tensor::detach() const {
  Tensor out = make_view(*this, local_shape(), strides(), offset());
  if (!impl_->storage) out.impl()->device = device();
  out.impl()->dist = impl_->dist;
  return out;
}

void Tensor::backward(const Tensor& grad, bool retain_graph, bool create_graph) const {
  mt::backward({*this}, {grad}, retain_graph, create_graph);
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  int lead = g.dim() - shape.size();
  MT_ASSERT(lead >= 0, "sum_to {} from {}", shape, g.shape());
  std::vector<int64_t> dims;
  for (int i = 0; i < g.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.size(i) != 1)) dims.push_back(i);
  Tensor r = dims.empty() ? g : sum(g, dims, KeepDim::kYes);
  return r.view(shape);
}

// ---- engine -----------------------------------------------------------------------------------

namespace {

struct ByNewest {
  bool operator()(const Node* a, const Node* b) const { return a->seq < b->seq; }
};

// A gradient buffer that a formula may add into in place: nobody else holds the tensor or any
// view of its storage, and it is a plain, contiguous, materialized tensor outside any graph.
bool exclusive_grad_buffer(const Tensor& b) {
  if (!b.defined() || b.use_count() != 1 || b.is_distributed() || b.requires_grad() || !b.is_contiguous())
    return false;
  const Rc<Storage>& st = b.impl()->storage;
  return st && st->use_count() == 1 && st->has_data() && !b.is_meta();
}

// For each next edge of `n`, the buffer a formula may accumulate into (grad_accumulation_target);
// empty when there is none.
std::vector<Tensor> accumulation_targets(const Node* n,
                                         const std::unordered_map<Node*, std::vector<Tensor>>& buffers) {
  std::vector<Tensor> t;
  for (size_t i = 0; i < n->next.size(); ++i) {
    const Edge& e = n->next[i];
    if (!e.node) continue;
    auto it = buffers.find(e.node.get());
    if (it == buffers.end() || e.input_nr >= it->second.size()) continue;
    const Tensor& b = it->second[e.input_nr];
    if (!exclusive_grad_buffer(b)) continue;
    bool shared = false;  // x + x: both inputs sum into one slot
    for (size_t j = 0; j < n->next.size() && !shared; ++j)
      shared = j != i && n->next[j].node == e.node && n->next[j].input_nr == e.input_nr;
    if (shared) continue;
    if (t.empty()) t.resize(n->next.size());
    t[i] = b;
  }
  return t;
}

// Offers `targets` to the formulas run in its scope (nested engines set their own).
class AccumulationScope {
 public:
  explicit AccumulationScope(const std::vector<Tensor>* t) : prev_(g_accumulation_targets) {
    g_accumulation_targets = t && !t->empty() ? t : nullptr;
  }
  ~AccumulationScope() { g_accumulation_targets = prev_; }
  AccumulationScope(const AccumulationScope&) = delete;
  AccumulationScope& operator=(const AccumulationScope&) = delete;

 private:
  const std::vector<Tensor>* prev_;
};

// Runs the graph from (root edge, grad) pairs. When `capture` is set, gradients arriving at the
// listed (node, input_nr) slots are stored there instead of flowing on (used by grad()).
void run_engine(const std::vector<Edge>& roots, const std::vector<Tensor>& root_grads,
                bool retain_graph, bool create_graph,
                std::unordered_map<const Node*, std::vector<Tensor>>* capture) {
  EngineScope scope;
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Node*>> parents;  // grad() only
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Edge& e : roots)
    if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (!e.node) continue;
      ++deps[e.node.get()];
      if (capture) parents[e.node.get()].push_back(n);
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  // grad(): only nodes from which a requested input is reachable run (so no other leaf's .grad
  // is touched and no work is wasted); a requested node runs too when another one lies behind it.
  std::unordered_set<Node*> needed;
  if (capture) {
    for (auto& [node, slot] : *capture) {
      auto* c = const_cast<Node*>(node);
      if (seen.count(c)) stack.push_back(c);
    }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (Node* p : parents[n])
        if (needed.insert(p).second) stack.push_back(p);
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  auto accumulate = [&](Node* n, uint32_t slot, const Tensor& g) {
    auto& buf = buffers[n];
    if (buf.size() < n->outputs.size()) buf.resize(n->outputs.size());
    if (!g.defined()) return;
    if (!buf[slot].defined())
      buf[slot] = g;
    else if (!accumulate_grad_in_place(buf[slot], g))  // (into a gradient destination: stays there)
      buf[slot] = add_grads(buf[slot], g);
  };

  std::priority_queue<Node*, std::vector<Node*>, ByNewest> ready;
  std::unordered_set<Node*> queued;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].node) continue;
    accumulate(roots[i].node.get(), roots[i].input_nr, root_grads[i]);
    if (!deps.count(roots[i].node.get()) && queued.insert(roots[i].node.get()).second)
      ready.push(roots[i].node.get());
  }

  GradModeGuard mode(create_graph);
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[n]);
    buffers.erase(n);
    grads.resize(n->outputs.size());
    if (capture) {
      auto it = capture->find(n);
      if (it != capture->end()) it->second = grads;
      if (!needed.count(n)) continue;  // nothing requested behind it: its inputs never get ready
    }
    MT_CHECK(!n->released,
             "backward through {} a second time: its saved tensors were freed after the first "
             "backward; pass retain_graph=true to the first call",
             n->name());
    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    std::vector<Tensor> out_grads, targets;
    if (any) {
      for (size_t k = 0; k < grads.size(); ++k) {
        const auto& meta = n->outputs[k];
        if (!grads[k].defined()) {
          if (!n->materialize_grads) continue;
          grads[k] = filled_like({meta.shape, meta.dtype, meta.device,
                                  meta.dist ? meta.dist->grad_spec() : nullptr}, 0.0);
        }
        for (auto& hook : n->output_hooks[k].snapshot()) {
          Tensor r = hook(grads[k]);
          if (r.defined()) grads[k] = r;
        }
      }
      for (auto& hook : n->pre_hooks.snapshot()) hook(grads);
      // Gradient sums the formula may do itself (grad_accumulation_target): not while recording
      // a graph, and not when post hooks are to see this node's own input gradients.
      if (!create_graph && n->post_hooks.empty()) targets = accumulation_targets(n, buffers);
      AccumulationScope offered(&targets);
      if (kernel_hooks_armed() && Profiler::current()) {
        Profiler* prof = Profiler::current();
        ProfileScope scope(ProfileEvent::Kind::kBackward, n->name(), prof->take_node_module(n->seq));
        out_grads = n->apply(grads);
      } else {
        out_grads = n->apply(grads);
      }
      for (auto& hook : n->post_hooks.snapshot()) hook(out_grads, grads);
      // AccumulateGrad saves nothing and is shared by every graph that uses its leaf, so a
      // later graph over the same leaf must be able to run it again.
      if (!retain_graph && !dynamic_cast<AccumulateGrad*>(n)) {
        n->release();
        n->released = true;
      }
    }
    out_grads.resize(n->next.size());
    for (size_t i = 0; i < n->next.size(); ++i) {
      const Edge& e = n->next[i];
      if (!e.node) continue;
      // A formula that added into its offered target returns it: the sum is already in place.
      const bool summed = i < targets.size() && targets[i].defined() && out_grads[i].same(targets[i]);
      if (!summed) accumulate(e.node.get(), e.input_nr, out_grads[i]);
      if (--deps[e.node.get()] == 0) ready.push(e.node.get());
    }
  }
  if (g_engine_depth == 1) scope.finish();
}

std::vector<Tensor> default_root_grads(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                       const char* api) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    MT_CHECK(r.requires_grad(), "{}: tensor {} does not require grad and has no grad_fn", api, r.desc());
    Tensor g = i < grads.size() ? grads[i] : Tensor();
    if (!g.defined()) {
      MT_CHECK(r.numel() == 1, "{}: a gradient must be given for non-scalar output {}", api, r.desc());
      // The gradient of a Partial root is the Replicate one (each term's gradient is 1).
      auto spec = r.impl()->dist ? r.impl()->dist->grad_spec() : nullptr;
      g = filled_like({r.local_shape(), r.dtype(), r.device(), spec}, 1.0);
    }
    MT_CHECK(g.shape() == r.shape(), "{}: gradient {} does not match output {}", api, g.desc(), r.desc());
    out.push_back(g);
  }
  return out;
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph,
              bool create_graph) {
  std::vector<Tensor> gs = default_root_grads(roots, grads, "backward");
  std::vector<Edge> edges;
  for (const Tensor& r : roots) edges.push_back(gradient_edge(r));
  run_engine(edges, gs, retain_graph || create_graph, create_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool create_graph) {
  std::vector<Tensor> gs = default_root_grads(outputs, grad_outputs, "grad");
  std::unordered_map<const Node*, std::vector<Tensor>> capture;
  std::vector<Edge> in_edges;
  for (const Tensor& in : inputs) {
    MT_CHECK(in.requires_grad(), "grad: input {} does not require grad", in.desc());
    in_edges.push_back(gradient_edge(in));
    capture[in_edges.back().node.get()];
  }
  std::vector<Edge> edges;
  for (const Tensor& r : outputs) edges.push_back(gradient_edge(r));
  run_engine(edges, gs, retain_graph || create_graph, create_graph, &capture);
  std::vector<Tensor> result;
  for (const Edge& e : in_edges) {
    auto& g = capture[e.node.get()];
    result.push_back(e.input_nr < g.size() ? g[e.input_nr] : Tensor());
  }
  return result;
}

}  // namespace mt
