// Activation recomputation: outputs and gradients (inputs and parameters) equal bit for bit those
// of the plain run, with and without dropout; the function really runs again in backward; the
// generator is restored; Module::set_recompute; misuse errors.

#include "tensor/checkpoint.h"
#include "tensor/module.h"
#include "testing.h"

using namespace mt;
using mt::testing::same_bits;
using Catch::Contains;
using mt::testing::rand;

namespace {

enum class UseDropout { kNo, kYes };

// Two layers, each: h = tanh(x * w1 + b1); y = silu(dropout(h) * w2) + x. Weights are plain
// tensors combined pointwise (broadcast over rows).
struct TwoLayerBlock {
  std::vector<Tensor> params;
  int calls = 0;
  UseDropout drop;
  TwoLayerBlock(DType dtype, UseDropout d) : drop(d) {
    for (uint64_t s = 0; s < 6; ++s) params.push_back(rand({7}, dtype, 10 + s).requires_grad_());
  }
  std::vector<Tensor> layer(int l, const std::vector<Tensor>& in) {
    ++calls;
    const Tensor& w1 = params[3 * l], &b1 = params[3 * l + 1], &w2 = params[3 * l + 2];
    Tensor h = tanh(in[0] * w1 + b1);
    if (drop == UseDropout::kYes) h = dropout(h, 0.3);
    return {silu(h * w2) + in[0], sum(h)};  // two outputs, both used by the loss
  }
  void zero_grad() {
    for (auto& p : params) p.set_grad(Tensor());
  }
};

enum class UseCheckpoint { kNo, kYes };

struct RunResult {
  Tensor loss, gx;
  std::vector<Tensor> gparams;
};

RunResult run(TwoLayerBlock& blk, const Tensor& x_in, UseCheckpoint ckpt) {
  blk.zero_grad();
  Tensor x = x_in.detach().requires_grad_();
  Tensor h = x, aux;
  for (int l = 0; l < 2; ++l) {
    auto fn = [&blk, l](const std::vector<Tensor>& in) { return blk.layer(l, in); };
    std::vector<Tensor> out = ckpt == UseCheckpoint::kYes ? checkpoint(fn, {h}) : fn({h});
    h = out[0];
    aux = aux.defined() ? aux + out[1] : out[1];
  }
  Tensor loss = sum(h * h) + aux * 0.5;
  loss.backward();
  RunResult r{loss.detach(), x.grad(), {}};
  for (auto& p : blk.params) r.gparams.push_back(p.grad());
  return r;
}

void require_same(const RunResult& a, const RunResult& b) {
  REQUIRE(same_bits(a.loss, b.loss));
  REQUIRE(same_bits(a.gx, b.gx));
  for (size_t i = 0; i < a.gparams.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(a.gparams[i].defined());
    REQUIRE(same_bits(a.gparams[i], b.gparams[i]));
  }
}

}  // namespace

TEST_CASE("checkpoint: same outputs and gradients bit for bit, function recomputed", "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    INFO(fmt::format("{}", dt));
    TwoLayerBlock blk(dt, UseDropout::kNo);
    Tensor x = mt::testing::noncontig(rand({5, 7}, dt, 3));
    RunResult plain = run(blk, x, UseCheckpoint::kNo);
    REQUIRE(blk.calls == 2);
    blk.calls = 0;
    RunResult ckpt = run(blk, x, UseCheckpoint::kYes);
    REQUIRE(blk.calls == 4);  // each layer once in forward and once in backward
    require_same(plain, ckpt);
  }
}

TEST_CASE("checkpoint: dropout inside draws the same mask in the recomputation", "[cpu]") {
  TwoLayerBlock blk(DType::kF32, UseDropout::kYes);
  Tensor x = rand({5, 7}, DType::kF32, 4);
  manual_seed(123);
  RunResult plain = run(blk, x, UseCheckpoint::kNo);
  uint64_t offset_plain = default_generator().offset();
  manual_seed(123);
  RunResult ckpt = run(blk, x, UseCheckpoint::kYes);
  // The generator is back where the forward left it: backward consumed nothing.
  REQUIRE(default_generator().offset() == offset_plain);
  require_same(plain, ckpt);
  // And the masks really are random: another seed gives another loss.
  manual_seed(124);
  REQUIRE_FALSE(same_bits(run(blk, x, UseCheckpoint::kYes).loss, plain.loss));
}

TEST_CASE("checkpoint: parameters get gradients even when no input requires grad", "[cpu]") {
  Tensor w = rand({3}).requires_grad_();
  Tensor x = rand({3}, DType::kF64, 2);
  auto fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{exp(in[0] * w)}; };
  sum(fn({x})[0]).backward();
  Tensor expect = w.grad();
  w.set_grad(Tensor());
  std::vector<Tensor> out = checkpoint(fn, {x});
  REQUIRE(out[0].requires_grad());
  sum(out[0]).backward();
  REQUIRE(same_bits(w.grad(), expect));
}

TEST_CASE("checkpoint: no grad mode, integer outputs, aliasing outputs", "[cpu]") {
  Tensor x = rand({4}).requires_grad_();
  int calls = 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    ++calls;
    return std::vector<Tensor>{in[0], argmax(in[0], 0), in[0] * 2.0};
  };
  {
    NoGradGuard ng;
    auto out = checkpoint(fn, {x});
    REQUIRE_FALSE(out[2].requires_grad());
  }
  auto out = checkpoint(fn, {x});
  REQUIRE(x.is_leaf());  // returning the input does not rewire it
  REQUIRE_FALSE(out[1].requires_grad());
  REQUIRE(out[1].dtype() == DType::kI64);
  sum(out[0] + out[2]).backward();
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>(4, 3.0));
  REQUIRE(calls == 3);
}

TEST_CASE("checkpoint: errors for in-place modified inputs and second backward", "[cpu]") {
  Tensor w = rand({4}).requires_grad_();
  Tensor x = rand({4}, DType::kF64, 5);
  auto fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * w}; };
  Tensor y = sum(checkpoint(fn, {x})[0]);
  x.mul_(2.0);
  REQUIRE_THROWS_WITH(y.backward(), Contains("checkpoint: input 0") && Contains("modified in place"));

  Tensor y2 = checkpoint(fn, {rand({4}, DType::kF64, 6)})[0];
  y2.backward(ones({4}, DType::kF64));
  REQUIRE_THROWS_WITH(y2.backward(ones({4}, DType::kF64)), Contains("CheckpointBackward a second time"));
}

TEST_CASE("Module::set_recompute runs forward through checkpoint", "[cpu]") {
  struct Layer : Module {
    int calls = 0;
    Tensor w, b;
    Layer() {
      w = param_uniform("w", {6}, -1, 1, DType::kF64);
      b = param_const("b", {6}, 0.5, DType::kF64);
    }
    std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
      ++calls;
      return {gelu(dropout(in[0] * w, is_training() ? 0.2 : 0.0) + b)};
    }
  };
  manual_seed(3);
  auto layer = std::make_shared<Layer>();
  Tensor x0 = rand({2, 6}, DType::kF64, 8);
  std::vector<std::string> events;
  layer->register_forward_hook([&](Module&, const std::vector<Tensor>&, std::vector<Tensor>&) {
    events.push_back("forward_hook");
  });
  layer->register_backward_hook([&](Module&, std::vector<Tensor>&, const std::vector<Tensor>&) {
    events.push_back("backward");
  });
  auto step = [&](Recompute r) {
    layer->set_recompute(r);
    layer->zero_grad();
    layer->calls = 0;
    events.clear();
    Tensor x = x0.detach().requires_grad_();
    manual_seed(77);
    Tensor y = (*layer)(x);
    sum(y * y).backward();
    return std::vector<Tensor>{y.detach(), x.grad(), layer->w.grad(), layer->b.grad()};
  };
  auto plain = step(Recompute::kNo);
  REQUIRE(layer->calls == 1);
  auto re = step(Recompute::kYes);
  REQUIRE(layer->recompute() == Recompute::kYes);
  REQUIRE(layer->calls == 2);
  // The module's own hooks fire once: only forward() is recomputed.
  REQUIRE(events == std::vector<std::string>{"forward_hook", "backward"});
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO(i);
    REQUIRE(same_bits(plain[i], re[i]));
  }
}

// current_recompute(): 0 in the first (no-grad) run and outside, a fresh number in each replay,
// and a nested checkpoint's replay (in the outer replay's backward) gets its own, after which the
// outer number is back. (FSDP units key their cached parameter views on it.)
TEST_CASE("checkpoint: current_recompute tells the replays apart", "[cpu]") {
  Tensor w = rand({4}, DType::kF64, 3).requires_grad_();
  Tensor x = rand({4}, DType::kF64, 4);
  std::vector<uint64_t> outer_seen, inner_seen;
  CheckpointFn inner = [&](const std::vector<Tensor>& in) {
    inner_seen.push_back(current_recompute());
    return std::vector<Tensor>{tanh(mul(in[0], w))};
  };
  CheckpointFn outer = [&](const std::vector<Tensor>& in) {
    outer_seen.push_back(current_recompute());
    Tensor h = checkpoint(inner, {mul(in[0], w)})[0];
    outer_seen.push_back(current_recompute());
    return std::vector<Tensor>{h};
  };
  CHECK(current_recompute() == 0);
  sum(checkpoint(outer, {x})[0]).backward();
  CHECK(current_recompute() == 0);
  // outer: first run (0, 0), replay (r, r); inner: in the first run and in the outer replay it
  // runs directly (0 and r), then its own replay in the outer replay's backward (a third number).
  REQUIRE(outer_seen.size() == 4);
  CHECK(outer_seen[0] == 0);
  CHECK(outer_seen[1] == 0);
  CHECK(outer_seen[2] != 0);
  CHECK(outer_seen[3] == outer_seen[2]);
  REQUIRE(inner_seen.size() == 3);
  CHECK(inner_seen[0] == 0);
  CHECK(inner_seen[1] == outer_seen[2]);
  CHECK(inner_seen[2] != 0);
  CHECK(inner_seen[2] != outer_seen[2]);
  CHECK(w.grad().defined());
}
