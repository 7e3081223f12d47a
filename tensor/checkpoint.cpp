// Activation recomputation. The forward keeps only the inputs (and their storage versions, to
// catch in-place edits) plus the default generator's seed and offset; CheckpointNode::apply
// replays fn with grad mode on and runs a nested backward through the replay. The nested backward
// is an ordinary mt::backward, so parameters used inside fn accumulate their .grad there.
#include "tensor/checkpoint.h"

#include <memory>
#include <utility>

#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/random.h"

namespace mt {

namespace {

// Puts the default generator at a given state for its lifetime, then back where it was.
class GeneratorStateGuard {
 public:
  GeneratorStateGuard(uint64_t seed, uint64_t offset)
      : gen_(default_generator()), seed_(gen_.seed()), offset_(gen_.offset()) {
    gen_.set_seed(seed);
    gen_.set_offset(offset);
  }
  ~GeneratorStateGuard() {
    gen_.set_seed(seed_);
    gen_.set_offset(offset_);
  }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  Generator& gen_;
  uint64_t seed_, offset_;
};

thread_local uint64_t g_recompute = 0, g_recomputes = 0;

// Marks the recomputed forward as the current one for its lifetime (current_recompute()).
class RecomputeScope {
 public:
  RecomputeScope() : outer_(g_recompute) { g_recompute = ++g_recomputes; }
  ~RecomputeScope() { g_recompute = outer_; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  uint64_t outer_;
};

uint32_t storage_version(const Tensor& t) {
  return t.defined() && t.impl()->storage ? t.impl()->storage->version : 0;
}

class CheckpointNode : public Node {
 public:
  CheckpointNode(CheckpointFn fn, std::vector<Tensor> inputs, uint64_t seed, uint64_t offset)
      : fn_(std::move(fn)), inputs_(std::move(inputs)), seed_(seed), offset_(offset) {
    for (const Tensor& t : inputs_) versions_.push_back(storage_version(t));
  }
  std::string name() const override { return "CheckpointBackward"; }
  void release() override {
    fn_ = nullptr;
    inputs_.clear();
  }
  // Output k of this node is output out_index[k] of fn.
  std::vector<size_t> out_index;
  size_t n_fn_outputs = 0;

  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    MT_ASSERT(fn_ != nullptr, "CheckpointBackward applied after release");
    MT_CHECK(!GradMode::enabled(),
             "checkpoint: backward with create_graph=true through a checkpointed function is not "
             "supported (the recomputation runs its own backward)");
    std::vector<Tensor> detached;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const Tensor& in = inputs_[i];
      MT_CHECK(storage_version(in) == versions_[i],
               "checkpoint: input {} ({}) was modified in place after the checkpointed forward; "
               "the recomputation in backward would see different values",
               i, in.desc());
      Tensor d;
      if (in.defined()) {
        d = in.detach();
        if (in.requires_grad()) d.requires_grad_();
      }
      detached.push_back(d);
    }

    std::vector<Tensor> outs;
    {
      GeneratorStateGuard rng(seed_, offset_);
      GradModeGuard grad_on(true);
      RecomputeScope replay;
      outs = fn_(detached);
    }
    MT_CHECK(outs.size() == n_fn_outputs,
             "checkpoint: the recomputation returned {} outputs but the forward returned {}",
             outs.size(), n_fn_outputs);
    std::vector<Tensor> roots, root_grads;
    for (size_t k = 0; k < out_index.size(); ++k) {
      const Tensor& o = outs[out_index[k]];
      // Node::outputs holds local shapes (a DTensor output's shard on this rank).
      MT_CHECK(o.defined() && o.local_shape() == outputs[k].shape,
               "checkpoint: recomputed output {} is {} but the forward gave local shape {}", out_index[k],
               o, outputs[k].shape);
      if (o.requires_grad() && grads[k].defined()) {
        roots.push_back(o);
        root_grads.push_back(grads[k]);
      }
    }
    if (!roots.empty()) mt::backward(roots, root_grads);

    std::vector<Tensor> result;
    for (const Tensor& d : detached) result.push_back(d.defined() && d.requires_grad() ? d.grad() : Tensor());
    return result;
  }

 private:
  CheckpointFn fn_;
  std::vector<Tensor> inputs_;
  std::vector<uint32_t> versions_;
  uint64_t seed_, offset_;
};

}  // namespace

uint64_t current_recompute() { return g_recompute; }

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  MT_CHECK(fn != nullptr, "checkpoint: empty function");
  if (!GradMode::enabled()) return fn(inputs);
  const Generator& gen = default_generator();
  auto node = std::make_shared<CheckpointNode>(fn, inputs, gen.seed(), gen.offset());
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    outs = fn(inputs);
  }
  node->n_fn_outputs = outs.size();
  std::vector<Tensor*> recorded;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].defined() || !is_floating(outs[k].dtype())) continue;
    // A fresh handle, so that an output aliasing an input (or anything with history) is never
    // rewired.
    outs[k] = outs[k].detach();
    node->out_index.push_back(k);
    recorded.push_back(&outs[k]);
  }
  if (!recorded.empty()) set_history(node, inputs, recorded);
  return outs;
}

}  // namespace mt
