// Autograd engine: accumulation, retain_graph, no_grad, detach, hooks and their order, grad(),
// create_graph, callbacks at the end of a pass, in-place rules.
#include <cmath>
#include <string>

#include "runtime/error.h"
#include "testing.h"

using namespace mt;
using mt::testing::gradcheck;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {
std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }
Tensor vec(std::vector<double> v) { return from_vector<double>(v); }
}  // namespace

TEST_CASE("gradcheck of a composite expression over broadcast and non-contiguous inputs", "[cpu]") {
  Tensor a = noncontig(rand({3, 4})).requires_grad_();
  Tensor b = rand({4}, DType::kF64, 2).requires_grad_();
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return exp(in[0]) * in[1] - tanh(in[0] / (in[1] * in[1] + 1.0)); }, {a, b});
}

TEST_CASE("gradients accumulate across backward calls", "[cpu]") {
  Tensor w = ones({2}, DType::kF64).requires_grad_();
  sum(w * 3.0).backward();
  sum(w * 3.0).backward();
  REQUIRE(vals(w.grad()) == std::vector<double>{6, 6});
  // Also while the first graph is still alive (its leaf accumulator is reused).
  Tensor y1 = sum(w * 2.0);
  y1.backward();
  Tensor y2 = sum(w * w);
  y2.backward();
  REQUIRE(vals(w.grad()) == std::vector<double>{10, 10});
  // .grad is its own memory: changing it does not touch anything else, and zeroing works.
  Tensor g = w.grad();
  g.zero_();
  sum(w * 5.0).backward();
  REQUIRE(vals(w.grad()) == std::vector<double>{5, 5});
  w.set_grad(Tensor());
  REQUIRE_FALSE(w.grad().defined());
}

TEST_CASE("a gradient that is a broadcast view is copied before it is accumulated into", "[cpu]") {
  Tensor x = ones({3}, DType::kF64).requires_grad_();
  sum(x).backward(Tensor(), false, /*create_graph=*/true);  // grad is ones expanded (stride 0)
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 1, 1});
  sum(x).backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{2, 2, 2});
  // The root gradient given by the caller is not aliased by .grad.
  Tensor y = ones({3}, DType::kF64).requires_grad_();
  Tensor gy = full({3}, 2.0, DType::kF64);
  (y * 1.0).backward(gy);
  (y * 1.0).backward(gy);
  REQUIRE(vals(gy) == std::vector<double>{2, 2, 2});
  REQUIRE(vals(y.grad()) == std::vector<double>{4, 4, 4});
}

TEST_CASE("second backward without retain_graph throws; retain_graph allows it", "[cpu]") {
  Tensor x = vec({1, 2, 3}).requires_grad_();
  Tensor y = sum(x * x);
  y.backward();
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("a second time") && Catch::Contains("retain_graph"));
  Tensor x2 = vec({1, 2, 3}).requires_grad_();
  Tensor z = sum(exp(x2));
  z.backward(Tensor(), /*retain_graph=*/true);
  z.backward(Tensor(), true);
  z.backward();
  for (int i = 0; i < 3; ++i) REQUIRE(vals(x2.grad())[i] == Approx(3 * std::exp(i + 1.0)));
  REQUIRE_THROWS_WITH(z.backward(), Catch::Contains("a second time"));
}

TEST_CASE("backward errors name the problem", "[cpu]") {
  Tensor x = vec({1, 2}).requires_grad_();
  REQUIRE_THROWS_WITH(vec({1, 2}).backward(), Catch::Contains("does not require grad"));
  REQUIRE_THROWS_WITH((x * 2.0).backward(), Catch::Contains("non-scalar") && Catch::Contains("f64[2]"));
  REQUIRE_THROWS_WITH((x * 2.0).backward(ones({3}, DType::kF64)), Catch::Contains("does not match"));
  REQUIRE_THROWS_WITH(vec({1}).register_hook([](const Tensor&) { return Tensor(); }),
                      Catch::Contains("register_hook"));
  REQUIRE_THROWS_WITH(vec({1}).retain_grad(), Catch::Contains("retain_grad"));
  REQUIRE_THROWS_WITH((x * 2.0).register_post_accumulate_grad_hook([](const Tensor&) {}),
                      Catch::Contains("leaf"));
  REQUIRE_THROWS_WITH((x * 2.0).requires_grad_(false), Catch::Contains("detach"));
}

TEST_CASE("no_grad records nothing; detach cuts history; requires_grad propagates", "[cpu]") {
  Tensor x = vec({1, 2}).requires_grad_();
  Tensor c = vec({3, 4});
  REQUIRE(x.is_leaf());
  REQUIRE_FALSE(x.grad_fn());
  Tensor y = x * c;
  REQUIRE(y.requires_grad());
  REQUIRE_FALSE(y.is_leaf());
  REQUIRE(y.grad_fn()->name() == "MulBackward");
  REQUIRE_FALSE((c * c).requires_grad());
  REQUIRE((c + sum(x)).requires_grad());
  {
    NoGradGuard ng;
    REQUIRE_FALSE(GradMode::enabled());
    Tensor z = exp(x) * c;
    REQUIRE_FALSE(z.requires_grad());
    REQUIRE_FALSE(z.grad_fn());
    REQUIRE(z.is_leaf());
    {
      GradModeGuard on(true);
      REQUIRE((x * 2.0).requires_grad());
    }
    REQUIRE_FALSE(GradMode::enabled());
  }
  REQUIRE(GradMode::enabled());
  Tensor d = y.detach();
  REQUIRE_FALSE(d.requires_grad());
  REQUIRE(d.is_leaf());
  REQUIRE(d.data_ptr() == y.data_ptr());
  // A detached branch contributes no gradient.
  Tensor loss = sum(x * x.detach());
  loss.backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 2});
  // Integer results never require grad.
  REQUIRE_FALSE(argmax(x, 0).requires_grad());
  REQUIRE_FALSE(gt(x, 1.0).requires_grad());
}

TEST_CASE("a diamond graph (x used twice) accumulates", "[cpu]") {
  Tensor x = vec({0.5, -1, 2}).requires_grad_();
  Tensor a = x * 3.0;
  Tensor b = sin(x);
  Tensor y = sum(a * b + x);
  y.backward();
  std::vector<double> g = vals(x.grad());
  for (int i = 0; i < 3; ++i) {
    double xi = vals(x)[i];
    REQUIRE(g[i] == Approx(3 * std::sin(xi) + 3 * xi * std::cos(xi) + 1));
  }
  // The same tensor on both sides of one op.
  Tensor z = vec({3}).requires_grad_();
  (z * z).backward();
  REQUIRE(z.grad().item() == 6);
}

TEST_CASE("tensor hooks on leaf and non-leaf: modify, observe, remove", "[cpu]") {
  Tensor x = vec({1, 2}).requires_grad_();
  int calls = 0;
  HookHandle hx = x.register_hook([&](const Tensor& g) {
    ++calls;
    return mul(g, 10.0);
  });
  Tensor h = x * 2.0;
  std::vector<double> seen;
  HookHandle hh = h.register_hook([&](const Tensor& g) {
    seen = vals(g);
    return add(g, 1.0);  // the modified gradient flows on
  });
  sum(h * h).backward();
  REQUIRE(seen == std::vector<double>{4, 8});
  // x.grad = 10 * 2 * (2h + 1)
  REQUIRE(vals(x.grad()) == std::vector<double>{100, 180});
  REQUIRE(calls == 1);
  hx.remove();
  hh.remove();
  hx.remove();  // twice is fine
  x.set_grad(Tensor());
  Tensor h2 = x * 2.0;
  sum(h2).backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{2, 2});
  REQUIRE(calls == 1);
  // A hook returning an undefined tensor leaves the gradient unchanged.
  Tensor y = vec({1}).requires_grad_();
  y.register_hook([](const Tensor&) { return Tensor(); });
  (y * 4.0).backward();
  REQUIRE(y.grad().item() == 4);
  // A hook may remove itself while running.
  Tensor w = vec({1}).requires_grad_();
  int wc = 0;
  auto handle = std::make_shared<HookHandle>();
  *handle = w.register_hook([&, handle](const Tensor&) {
    ++wc;
    handle->remove();
    return Tensor();
  });
  (w * 1.0).backward();
  (w * 1.0).backward();
  REQUIRE(wc == 1);
}

TEST_CASE("post-accumulate-grad hooks fire after .grad is set", "[cpu]") {
  Tensor x = vec({1, 2}).requires_grad_();
  std::vector<std::vector<double>> seen;
  HookHandle h = x.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    REQUIRE(leaf.same(x));
    REQUIRE(leaf.grad().defined());
    seen.push_back(vals(leaf.grad()));
  });
  sum(x * 3.0).backward();
  sum(x * 3.0).backward();
  REQUIRE(seen == std::vector<std::vector<double>>{{3, 3}, {6, 6}});
  // Grad hooks run before accumulation, post hooks after.
  std::vector<std::string> order;
  x.register_hook([&](const Tensor& g) {
    order.push_back("grad_hook");
    return g;
  });
  x.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("post"); });
  h.remove();
  sum(x).backward();
  REQUIRE(order == std::vector<std::string>{"grad_hook", "post"});
  REQUIRE(seen.size() == 2);
  // Only once per backward even when the leaf is used several times.
  int n = 0;
  Tensor z = vec({1}).requires_grad_();
  z.register_post_accumulate_grad_hook([&](const Tensor&) { ++n; });
  (z * z * z + z).backward();
  REQUIRE(n == 1);
  REQUIRE(z.grad().item() == 4);
}

TEST_CASE("retain_grad on a non-leaf", "[cpu]") {
  Tensor x = vec({1, 2, 3}).requires_grad_();
  Tensor h = x * x;
  h.retain_grad();
  h.retain_grad();  // idempotent
  Tensor y = sum(h * 2.0);
  y.backward(Tensor(), true);
  REQUIRE(vals(h.grad()) == std::vector<double>{2, 2, 2});
  y.backward();
  REQUIRE(vals(h.grad()) == std::vector<double>{4, 4, 4});
  REQUIRE(vals(x.grad()) == std::vector<double>{8, 16, 24});
  // Without retain_grad a non-leaf keeps no gradient.
  Tensor h2 = x * 3.0;
  sum(h2).backward();
  REQUIRE_FALSE(h2.grad().defined());
  // retain_grad on a leaf is a no-op (leaves keep their grad anyway).
  x.retain_grad();
  // The tensor may die before backward: the engine must not write through a stale pointer.
  Tensor loss;
  {
    Tensor tmp = exp(x);
    tmp.retain_grad();
    loss = sum(tmp * 2.0);
  }
  loss.backward();
}

TEST_CASE("grad() returns gradients without touching .grad", "[cpu]") {
  Tensor a = vec({1, 2}).requires_grad_();
  Tensor b = vec({3, 4}).requires_grad_();
  Tensor y = sum(a * b);
  std::vector<Tensor> g = mt::grad({y}, {a});
  REQUIRE(g.size() == 1);
  REQUIRE(vals(g[0]) == std::vector<double>{3, 4});
  REQUIRE_FALSE(a.grad().defined());
  REQUIRE_FALSE(b.grad().defined());  // the other leaf is not accumulated into either
  // A non-leaf input and a leaf behind it: the leaf still gets the path through the non-leaf.
  Tensor x = vec({2}).requires_grad_();
  Tensor h = x * x;
  Tensor z = h * x;  // x^3, h = x^2
  std::vector<Tensor> gs = mt::grad({z}, {h, x});
  REQUIRE(gs[0].item() == 2);   // dz/dh = x
  REQUIRE(gs[1].item() == 12);  // dz/dx = 3x^2
  REQUIRE_FALSE(x.grad().defined());
  // Explicit output gradient; unreachable inputs give undefined tensors.
  Tensor u = vec({1}).requires_grad_();
  std::vector<Tensor> g2 = mt::grad({a * 2.0}, {a, u}, {vec({1, 5})});
  REQUIRE(vals(g2[0]) == std::vector<double>{2, 10});
  REQUIRE_FALSE(g2[1].defined());
  REQUIRE_THROWS_WITH(mt::grad({y}, {vec({1})}), Catch::Contains("grad") && Catch::Contains("does not require grad"));
}

TEST_CASE("create_graph gives correct higher derivatives", "[cpu]") {
  Tensor x = vec({-1.5, 0.5, 2}).requires_grad_();
  Tensor y = sum(pow(x, 3.0));
  std::vector<Tensor> g = mt::grad({y}, {x}, {}, false, /*create_graph=*/true);
  REQUIRE(g[0].requires_grad());
  for (int i = 0; i < 3; ++i) REQUIRE(vals(g[0])[i] == Approx(3 * vals(x)[i] * vals(x)[i]));
  std::vector<Tensor> gg = mt::grad({sum(g[0])}, {x});
  for (int i = 0; i < 3; ++i) REQUIRE(vals(gg[0])[i] == Approx(6 * vals(x)[i]));
  // Third derivative via backward on the second.
  Tensor x2 = vec({0.7}).requires_grad_();
  Tensor d1 = mt::grad({pow(x2, 3.0) * 1.0}, {x2}, {}, false, true)[0];
  Tensor d2 = mt::grad({d1}, {x2}, {}, false, true)[0];
  REQUIRE(d2.item() == Approx(6 * 0.7));
  d2.backward();
  REQUIRE(x2.grad().item() == Approx(6));
  // backward(create_graph) leaves a differentiable .grad (x*x*x: product rule through mul).
  Tensor x3 = vec({1.5}).requires_grad_();
  (x3 * x3 * x3).backward(Tensor(), false, true);
  REQUIRE(x3.grad().item() == Approx(3 * 1.5 * 1.5));
  REQUIRE(x3.grad().requires_grad());
  Tensor first = x3.grad();
  x3.set_grad(Tensor());
  first.backward();
  REQUIRE(x3.grad().item() == Approx(6 * 1.5));
  // Through views (slice backward embeds a region, which is itself differentiable).
  Tensor v = vec({1, 2, 3, 4}).requires_grad_();
  Tensor s = sum(pow(v.slice(0, 1, 4, 2), 3.0));
  Tensor gv = mt::grad({s}, {v}, {}, false, true)[0];
  REQUIRE(vals(gv) == std::vector<double>{0, 12, 0, 48});
  Tensor ggv = mt::grad({sum(gv)}, {v})[0];
  REQUIRE(vals(ggv) == std::vector<double>{0, 12, 0, 24});
}

TEST_CASE("nodes run newest-first", "[cpu]") {
  Tensor x = vec({1, 2}).requires_grad_();
  std::vector<std::string> order;
  auto tag = [&](Tensor& t, std::string name) {
    t.register_hook([&order, name](const Tensor& g) {
      order.push_back(name);
      return g;
    });
  };
  // Two independent branches created a, b, c, d in this order; d is consumed first.
  Tensor a = x * 2.0;
  tag(a, "a");
  Tensor b = exp(x);
  tag(b, "b");
  Tensor c = a * 3.0;
  tag(c, "c");
  Tensor d = b * 4.0;
  tag(d, "d");
  Tensor y = sum(c + d);
  y.backward();
  REQUIRE(order == std::vector<std::string>{"d", "c", "b", "a"});
  // A node waits for all of its consumers, even if an older one is ready earlier.
  order.clear();
  Tensor p = x * 1.0;
  tag(p, "p");
  Tensor q = p * 2.0;
  tag(q, "q");
  Tensor r = p + q;  // p consumed by q (newer) and r
  tag(r, "r");
  sum(r).backward();
  REQUIRE(order == std::vector<std::string>{"r", "q", "p"});
  // Node pre/post hooks run around apply.
  order.clear();
  Tensor m = x * 5.0;
  m.grad_fn()->pre_hooks.add([&](std::vector<Tensor>& go) {
    order.push_back("pre");
    go[0] = mul(go[0], 2.0);
  });
  m.grad_fn()->post_hooks.add([&](std::vector<Tensor>& gi, const std::vector<Tensor>& go) {
    order.push_back("post");
    REQUIRE(vals(go[0]) == std::vector<double>{2, 2});
    REQUIRE(vals(gi[0]) == std::vector<double>{10, 10});
  });
  tag(m, "tensor");
  x.set_grad(Tensor());
  sum(m).backward();
  REQUIRE(order == std::vector<std::string>{"tensor", "pre", "post"});
  REQUIRE(vals(x.grad()) == std::vector<double>{10, 10});
}

TEST_CASE("callbacks queued during backward run when the pass ends", "[cpu]") {
  Tensor x = vec({1, 2}).requires_grad_();
  std::vector<std::string> order;
  // Outside a backward pass: at once.
  queue_backward_callback([&] { order.push_back("now"); });
  REQUIRE(order == std::vector<std::string>{"now"});
  order.clear();
  // Queued from two nodes: after the last node (the leaf's accumulation), in queue order, before
  // backward() returns; one queued by a callback runs too.
  Tensor a = x * 2.0;
  a.register_hook([&](const Tensor& g) {
    order.push_back("a");
    queue_backward_callback([&] {
      order.push_back("end a");
      queue_backward_callback([&] { order.push_back("end of end"); });
    });
    return g;
  });
  Tensor b = a * 3.0;
  b.register_hook([&](const Tensor& g) {
    order.push_back("b");
    queue_backward_callback([&] { order.push_back("end b"); });
    return g;
  });
  x.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("accumulated"); });
  sum(b).backward();
  REQUIRE(order == std::vector<std::string>{"b", "a", "accumulated", "end b", "end a", "end of end"});
  // grad() runs them too.
  order.clear();
  Tensor c = x * 4.0;
  c.register_hook([&](const Tensor& g) {
    queue_backward_callback([&] { order.push_back("end c"); });
    return g;
  });
  (void)grad({sum(c)}, {x});
  REQUIRE(order == std::vector<std::string>{"end c"});
  // A pass that throws still runs them, and its exception is the one that comes out; the next
  // pass starts with none queued.
  order.clear();
  Tensor d = x * 5.0;
  d.register_hook([&](const Tensor&) -> Tensor {
    queue_backward_callback([&] { order.push_back("end d"); });
    queue_backward_callback([&] {
      order.push_back("throws");
      throw Error("from a callback");
    });
    queue_backward_callback([&] { order.push_back("after the throw"); });
    throw Error("from a hook");
  });
  REQUIRE_THROWS_WITH(sum(d).backward(), Catch::Contains("from a hook"));
  REQUIRE(order == std::vector<std::string>{"end d", "throws", "after the throw"});
  order.clear();
  sum(x * 1.0).backward();
  REQUIRE(order == std::vector<std::string>{"accumulated"});  // x's hook, no callback
  order.clear();
  // A callback that throws after a pass that succeeded: its exception comes out of backward(),
  // and the callbacks after it still run.
  Tensor e = x * 6.0;
  e.register_hook([&](const Tensor& g) {
    queue_backward_callback([&] { throw Error("end e failed"); });
    queue_backward_callback([&] { order.push_back("after e"); });
    return g;
  });
  REQUIRE_THROWS_WITH(sum(e).backward(), Catch::Contains("end e failed"));
  REQUIRE(order == std::vector<std::string>{"accumulated", "after e"});
}

TEST_CASE("in-place on tensors that require grad", "[cpu]") {
  Tensor w = vec({1, 2}).requires_grad_();
  REQUIRE_THROWS_WITH(w.add_(vec({1, 1})), Catch::Contains("add_") && Catch::Contains("NoGradGuard"));
  REQUIRE_THROWS_WITH(w.mul_(2.0), Catch::Contains("mul_"));
  REQUIRE_THROWS_WITH(w.fill_(0), Catch::Contains("fill_"));
  REQUIRE_THROWS_WITH(w.copy_(vec({0, 0})), Catch::Contains("copy_"));
  REQUIRE_THROWS_WITH(w.view({2}).zero_(), Catch::Contains("fill_"));  // views of it too
  {
    NoGradGuard ng;
    w.add_(vec({1, 1}), -0.5);
    w.mul_(2.0);
  }
  REQUIRE(vals(w) == std::vector<double>{1, 3});
  REQUIRE(w.is_leaf());
  REQUIRE(w.requires_grad());
  // An optimizer-style step: grads then update under no_grad.
  sum(w * w).backward();
  {
    NoGradGuard ng;
    w.add_(w.grad(), -0.25);
  }
  REQUIRE(vals(w) == std::vector<double>{0.5, 1.5});
  // Detached views may be written in grad mode.
  w.detach().zero_();
  REQUIRE(vals(w) == std::vector<double>{0, 0});
}

TEST_CASE("gradient dtype follows the leaf; casts are differentiable", "[cpu]") {
  Tensor x = vec({1, 2}).requires_grad_();
  Tensor y = x.to(DType::kF32);
  REQUIRE(y.grad_fn()->name() == "ToDTypeBackward");
  sum(y * 2.0).backward();
  REQUIRE(x.grad().dtype() == DType::kF64);
  REQUIRE(vals(x.grad()) == std::vector<double>{2, 2});
  Tensor b = ones({3}, DType::kBF16).requires_grad_();
  sum(b * 3.0).backward();
  REQUIRE(b.grad().dtype() == DType::kBF16);
  REQUIRE(vals(b.grad()) == std::vector<double>{3, 3, 3});
  REQUIRE_FALSE(x.to(DType::kI64).requires_grad());
}

TEST_CASE("set_grad_dtype: a 16-bit leaf's gradients summed over backward passes in f32", "[cpu]") {
  Tensor b = ones({2}, DType::kBF16).requires_grad_();
  // 1, then 16 x 2^-9: each 2^-9 is below half a bf16 ulp of 1 (2^-7), so a bf16 sum stays 1.
  const auto passes = [&] {
    sum(b * 1.0).backward();
    for (int i = 0; i < 16; ++i) sum(b * 0x1p-9).backward();
  };
  passes();
  REQUIRE(b.grad().dtype() == DType::kBF16);
  REQUIRE(vals(b.grad()) == std::vector<double>{1, 1});
  REQUIRE_FALSE(b.grad_dtype().has_value());
  b.set_grad(Tensor());
  b.set_grad_dtype(DType::kF32);
  REQUIRE(b.grad_dtype() == DType::kF32);
  passes();
  REQUIRE(b.grad().dtype() == DType::kF32);
  REQUIRE(vals(b.grad()) == std::vector<double>{1.03125, 1.03125});
  // An existing .grad keeps its dtype: the gradient is converted to it.
  b.set_grad(ones({2}, DType::kBF16));
  sum(b * 2.0).backward();
  REQUIRE(b.grad().dtype() == DType::kBF16);
  REQUIRE(vals(b.grad()) == std::vector<double>{3, 3});
  b.set_grad(Tensor());
  b.set_grad_dtype(std::nullopt);
  sum(b * 2.0).backward();
  REQUIRE(b.grad().dtype() == DType::kBF16);
  REQUIRE_THROWS_WITH(b.set_grad_dtype(DType::kI64), Catch::Contains("not a floating dtype"));
}

TEST_CASE("sum_to undoes broadcasting", "[cpu]") {
  Tensor g = ones({2, 3, 4}, DType::kF64);
  REQUIRE(vals(sum_to(g, {3, 1})) == std::vector<double>{8, 8, 8});
  REQUIRE(vals(sum_to(g, {4})) == std::vector<double>(4, 6));
  REQUIRE(sum_to(g, {}).item() == 24);
  REQUIRE(sum_to(g, {2, 3, 4}).same(g));
}
