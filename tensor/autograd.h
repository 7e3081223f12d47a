// Define-by-run reverse-mode autograd. Each differentiable op result carries a grad_fn Node
// with edges to the nodes of its inputs (or to AccumulateGrad for leaves). backward() counts
// dependencies, then runs nodes newest-first (by creation sequence) once all their gradients are
// in, firing tensor hooks, node pre/post hooks and post-accumulate-grad hooks. See docs/autograd.md.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/hooks.h"
#include "tensor/tensor.h"

namespace mt {

struct Edge {
  std::shared_ptr<Node> node;  // null: input needs no grad
  uint32_t input_nr = 0;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // grads: one per output (all defined: the engine fills zeros where only some are, unless
  // materialize_grads is off). Returns one gradient per next edge (undefined where none flows).
  virtual std::vector<Tensor> apply(std::vector<Tensor>& grads) = 0;
  // Frees saved tensors after a backward without retain_graph.
  virtual void release() {}

  std::vector<Edge> next;
  uint64_t seq = 0;
  bool released = false;
  // Off: outputs that got no gradient stay undefined in apply() (and their output hooks do not
  // run), so the node can tell an unused output from a zero gradient (an FSDP unit's gather
  // node: plan/fsdp_buffer.cpp).
  bool materialize_grads = true;
  // Metadata of each output, for zero-filling undefined gradients.
  struct OutputMeta {
    Shape shape;  // local shape
    DType dtype;
    Device device;
    std::shared_ptr<const DistSpec> dist;  // a DTensor output's spec: zero fills keep it
  };
  std::vector<OutputMeta> outputs;
  // Hooks on the gradient of output k of this node (non-leaf tensor hooks).
  std::vector<HookList<GradHook>> output_hooks;
  // Before apply, on all output grads (module backward-pre hooks); after apply, on the input
  // grads together with the output grads (module backward hooks).
  using PreHook = std::function<void(std::vector<Tensor>& grad_outputs)>;
  using PostHook =
      std::function<void(std::vector<Tensor>& grad_inputs, const std::vector<Tensor>& grad_outputs)>;
  HookList<PreHook> pre_hooks;
  HookList<PostHook> post_hooks;
};

// A node whose backward is a closure: backward(grad_outputs) -> grad per input. Captured
// tensors are the saved ones; capture op outputs detached to avoid cycles.
class FunctionNode : public Node {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads)>;
  FunctionNode(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override;
  void release() override { fn_ = nullptr; }

 private:
  std::string name_;
  Fn fn_;
};

class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override;
  Tensor leaf;
};

// ---- grad mode ----
struct GradMode {
  static bool enabled();
  static void set(bool on);
};
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set(false); }
  ~NoGradGuard() { GradMode::set(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
class GradModeGuard {
 public:
  explicit GradModeGuard(bool on) : prev_(GradMode::enabled()) { GradMode::set(on); }
  ~GradModeGuard() { GradMode::set(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

// ---- recording (used by op front ends) ----
// True when grad mode is on and any input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
inline bool needs_grad(const Tensor& a) { return needs_grad({&a}); }
inline bool needs_grad(const Tensor& a, const Tensor& b) { return needs_grad({&a, &b}); }
// The edge a gradient for `t` must flow into (its grad_fn, or its leaf accumulator).
Edge gradient_edge(const Tensor& t);
// Wires `node` to `inputs` and makes it the grad_fn of `outputs` (output k -> output_nr k).
void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor*>& outputs);
// Shorthand for single-output closure nodes.
void record(const char* name, const std::vector<Tensor>& inputs, Tensor& output, FunctionNode::Fn fn);

// ---- engine ----
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph = false, bool create_graph = false);
// Gradients of outputs w.r.t. inputs, without touching any .grad (torch.autograd.grad).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool create_graph = false);

// Runs `fn` once the backward pass now running on this thread (the outermost backward() or
// grad() call) has run its last node, before that call returns; also when the pass throws (then
// an exception of `fn` is dropped, the first one stands). Outside a backward pass `fn` runs at
// once. Callbacks run in the order they were queued. FSDP completes the gradient reductions it
// left in flight this way (plan/fsdp_buffer.cpp), like PyTorch's queue_callback.
void queue_backward_callback(std::function<void()> fn);
// Whether a backward pass (backward() or grad()) is running on this thread: a forward now is a
// recomputation (tensor/checkpoint.h) or a hook's.
bool backward_running();

// Inside a backward formula (Node::apply): the gradient the engine already holds for the running
// node's input `i`, when the formula's gradient for that input would otherwise be added to it out
// of place and nothing else refers to it (a plain contiguous tensor, the only view of its storage;
// never while a backward records a graph or for a node with post hooks, never for an input whose
// edge another input of the node shares). A formula may add its gradient into it, with the bits
// add(target, its gradient) would have, and return it as input i's gradient: the engine then adds
// nothing. Undefined when none is offered, or outside a backward formula. (RMSNorm's backward adds
// its input gradient to the residual stream's this way: tensor/ops_norm.cpp, docs/autograd.md.)
Tensor grad_accumulation_target(size_t input);

// Sum `g` down to `shape` (the inverse of broadcasting), for backward formulas.
Tensor sum_to(const Tensor& g, const Shape& shape);

}  // namespace mt
