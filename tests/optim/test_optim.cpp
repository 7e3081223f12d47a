// Optimizers against naive double-precision loops, state_dict resume bit for bit, gradient
// clipping, the LR schedule at its boundaries, and f32 master weights for bf16 training.
#include "testing.h"

#include <cmath>
#include <numbers>

#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/master_weights.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "tensor/module.h"

using namespace mt;
using mt::testing::noncontig;

namespace {

enum class Layout { kContiguous, kStrided };

// Three parameters: a matrix (decayed group), a bias and a gain (no-decay group).
NamedTensors make_params(DType dtype, Layout layout) {
  NamedTensors out;
  std::vector<std::pair<std::string, Shape>> specs = {
      {"model.layers.0.mlp.up_proj.weight", Shape{5, 7}}, {"model.layers.0.mlp.up_proj.bias", Shape{7}},
      {"model.norm.weight", Shape{3}}};
  uint64_t seed = 1;
  for (auto& [name, shape] : specs) {
    Tensor t = mt::testing::rand(shape, dtype, seed++);
    if (layout == Layout::kStrided) t = noncontig(t);
    t.requires_grad_();
    out.emplace_back(name, t);
  }
  return out;
}

// A different gradient for every (parameter, step).
Tensor grad_for(const Tensor& p, size_t k, int step) {
  return mt::testing::rand(p.shape(), p.dtype(), 1000 * (k + 1) + static_cast<uint64_t>(step), -2, 2);
}

struct Naive {
  std::vector<double> p, m, v, buf;
  int64_t t = 0;
};

std::vector<Naive> naive_from(const NamedTensors& params) {
  std::vector<Naive> out;
  for (auto& [n, t] : params) {
    Naive s;
    s.p = t.to_vector<double>();
    s.m.assign(s.p.size(), 0);
    s.v.assign(s.p.size(), 0);
    s.buf.assign(s.p.size(), 0);
    out.push_back(s);
  }
  return out;
}

// torch.optim.AdamW written out, textbook form (bias-corrected moments).
void naive_adamw(Naive& s, const std::vector<double>& g, double lr, double wd, const AdamWOptions& o) {
  ++s.t;
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(s.t));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(s.t));
  for (size_t i = 0; i < g.size(); ++i) {
    s.p[i] -= lr * wd * s.p[i];
    s.m[i] = o.beta1 * s.m[i] + (1 - o.beta1) * g[i];
    s.v[i] = o.beta2 * s.v[i] + (1 - o.beta2) * g[i] * g[i];
    const double mhat = s.m[i] / bc1, vhat = s.v[i] / bc2;
    s.p[i] -= lr * mhat / (std::sqrt(vhat) + o.eps);
  }
}

// torch.optim.SGD written out.
void naive_sgd(Naive& s, const std::vector<double>& g, double lr, double wd, const SGDOptions& o) {
  ++s.t;
  for (size_t i = 0; i < g.size(); ++i) {
    double d = g[i] + wd * s.p[i];
    if (o.momentum != 0) {
      s.buf[i] = s.t == 1 ? d : o.momentum * s.buf[i] + (1 - o.dampening) * d;
      d = o.nesterov == Nesterov::kYes ? d + o.momentum * s.buf[i] : s.buf[i];
    }
    s.p[i] -= lr * d;
  }
}

double group_wd(const NamedTensors& params, size_t k, double wd) { return params[k].second.dim() >= 2 ? wd : 0; }

// Runs `steps` steps of opt and of the naive update side by side, comparing every parameter.
template <class NaiveStep>
void run_against_naive(Optimizer& opt, const NamedTensors& params, double wd, int steps, double tol,
                       NaiveStep naive_step) {
  auto ref = naive_from(params);
  for (int s = 0; s < steps; ++s) {
    opt.set_lr(0.01 * (1 + 0.3 * s));  // the lr changes between steps too
    for (size_t k = 0; k < params.size(); ++k) {
      Tensor g = grad_for(params[k].second, k, s);
      params[k].second.set_grad(g);
      naive_step(ref[k], g.to_vector<double>(), opt.lr(), group_wd(params, k, wd));
    }
    opt.step();
    for (size_t k = 0; k < params.size(); ++k) {
      INFO(params[k].first << " after step " << s + 1);
      REQUIRE_CLOSE(params[k].second, ref[k].p, tol, tol);
    }
  }
  REQUIRE(opt.step_count() == steps);
}

std::vector<std::vector<double>> values(const NamedTensors& params) {
  std::vector<std::vector<double>> out;
  for (auto& [n, t] : params) out.push_back(t.to_vector<double>());
  return out;
}

NamedTensors clone_all(const NamedTensors& ts) {
  NamedTensors out;
  for (auto& [n, t] : ts) {
    Tensor c = t.detach().clone();
    if (t.requires_grad()) c.requires_grad_();
    out.emplace_back(n, c);
  }
  return out;
}

}  // namespace

TEST_CASE("AdamW matches a naive loop in f64", "[cpu]") {
  AdamWOptions o;
  o.lr = 0.01;
  for (Layout layout : {Layout::kContiguous, Layout::kStrided}) {
    INFO((layout == Layout::kStrided ? "strided (op path)" : "contiguous (fused path)"));
    auto params = make_params(DType::kF64, layout);
    AdamW opt(make_param_groups(params, 0.1), o);
    run_against_naive(opt, params, 0.1, 5, 1e-12,
                      [&](Naive& s, const std::vector<double>& g, double lr, double wd) { naive_adamw(s, g, lr, wd, o); });
  }
}

TEST_CASE("AdamW in f32 and bf16 stays close to the naive loop", "[cpu]") {
  AdamWOptions o;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.eps = 1e-6;
  auto run = [&](DType dt, Layout layout, double tol) {
    auto params = make_params(dt, layout);
    AdamW opt(make_param_groups(params, 0.05), o);
    run_against_naive(opt, params, 0.05, 5, tol,
                      [&](Naive& s, const std::vector<double>& g, double lr, double wd) { naive_adamw(s, g, lr, wd, o); });
  };
  run(DType::kF32, Layout::kContiguous, 1e-5);
  run(DType::kF32, Layout::kStrided, 1e-5);
  auto params = make_params(DType::kBF16, Layout::kContiguous);
  // bf16 parameters go through the op path; only a coarse check (one bf16 ulp is ~0.4%).
  AdamW opt(make_param_groups(params, 0.0), o);
  auto before = values(params);
  for (size_t k = 0; k < params.size(); ++k) params[k].second.set_grad(grad_for(params[k].second, k, 0));
  opt.step();
  for (size_t k = 0; k < params.size(); ++k) {
    Naive s;
    s.p = before[k];
    s.m.assign(s.p.size(), 0);
    s.v.assign(s.p.size(), 0);
    naive_adamw(s, params[k].second.grad().to_vector<double>(), opt.lr(), 0, o);
    REQUIRE_CLOSE(params[k].second, s.p, 1e-2, 1e-2);
  }
}

TEST_CASE("SGD variants match a naive loop in f64", "[cpu]") {
  struct Case {
    const char* what;
    SGDOptions o;
    double wd;
  };
  std::vector<Case> cases = {
      {"plain", {0.01, 0, 0, Nesterov::kNo}, 0},
      {"weight decay", {0.01, 0, 0, Nesterov::kNo}, 0.1},
      {"momentum", {0.01, 0.9, 0, Nesterov::kNo}, 0.01},
      {"momentum + dampening", {0.01, 0.9, 0.25, Nesterov::kNo}, 0.01},
      {"nesterov", {0.01, 0.9, 0, Nesterov::kYes}, 0.01},
  };
  for (auto& c : cases) {
    for (Layout layout : {Layout::kContiguous, Layout::kStrided}) {
      INFO(c.what << (layout == Layout::kStrided ? " strided" : " contiguous"));
      auto params = make_params(DType::kF64, layout);
      SGD opt(make_param_groups(params, c.wd), c.o);
      run_against_naive(opt, params, c.wd, 5, 1e-12,
                        [&](Naive& s, const std::vector<double>& g, double lr, double wd) { naive_sgd(s, g, lr, wd, c.o); });
    }
  }
  auto params = make_params(DType::kF32, Layout::kContiguous);
  SGDOptions o{0.01, 0.9, 0, Nesterov::kYes};
  SGD opt(make_param_groups(params, 0.01), o);
  run_against_naive(opt, params, 0.01, 5, 1e-5,
                    [&](Naive& s, const std::vector<double>& g, double lr, double wd) { naive_sgd(s, g, lr, wd, o); });
}

TEST_CASE("make_param_groups: decay for matrices only; lr_scale", "[cpu]") {
  auto params = make_params(DType::kF64, Layout::kContiguous);
  Tensor frozen = zeros({4, 4}, DType::kF64);  // does not require grad: left out
  params.emplace_back("frozen.weight", frozen);
  auto groups = make_param_groups(params, 0.1);
  REQUIRE(groups.size() == 2);
  REQUIRE(groups[0].weight_decay == 0.1);
  REQUIRE(groups[1].weight_decay == 0);
  REQUIRE(groups[0].params.size() == 1);
  REQUIRE(groups[0].params[0].first == "model.layers.0.mlp.up_proj.weight");
  REQUIRE(groups[1].params.size() == 2);

  // With zero gradients AdamW's Adam part is exactly 0: only the decoupled decay moves weights.
  AdamWOptions o;
  o.lr = 0.5;
  AdamW opt(groups, o);
  auto before = values(params);
  for (int s = 0; s < 3; ++s) {
    for (size_t k = 0; k < 3; ++k) params[k].second.set_grad(zeros_like(params[k].second));
    opt.step();
  }
  std::vector<double> decayed = before[0];
  for (double& x : decayed) x *= std::pow(1 - 0.5 * 0.1, 3);
  REQUIRE_CLOSE(params[0].second, decayed, 1e-14, 0);
  REQUIRE(params[1].second.to_vector<double>() == before[1]);
  REQUIRE(params[2].second.to_vector<double>() == before[2]);

  // lr_scale multiplies the lr of its group only.
  auto p2 = make_params(DType::kF64, Layout::kContiguous);
  std::vector<ParamGroup> g2 = {{{p2[0]}, 0.0, 1.0}, {{p2[1]}, 0.0, 0.5}};
  SGD sgd(g2, SGDOptions{0.1, 0, 0, Nesterov::kNo});
  auto b0 = p2[0].second.to_vector<double>(), b1 = p2[1].second.to_vector<double>();
  p2[0].second.set_grad(ones_like(p2[0].second));
  p2[1].second.set_grad(ones_like(p2[1].second));
  sgd.step();
  for (double& x : b0) x -= 0.1;
  for (double& x : b1) x -= 0.05;
  REQUIRE_CLOSE(p2[0].second, b0, 0, 1e-15);
  REQUIRE_CLOSE(p2[1].second, b1, 0, 1e-15);
}

TEST_CASE("Parameters without a gradient are skipped and keep their own step count", "[cpu]") {
  auto params = make_params(DType::kF64, Layout::kContiguous);
  AdamWOptions o;
  AdamW opt(make_param_groups(params, 0.1), o);
  auto before = values(params);
  auto ref = naive_from(params);
  for (int s = 0; s < 2; ++s) {  // only the matrix gets gradients
    Tensor g = grad_for(params[0].second, 0, s);
    params[0].second.set_grad(g);
    naive_adamw(ref[0], g.to_vector<double>(), opt.lr(), 0.1, o);
    opt.step();
  }
  REQUIRE(params[1].second.to_vector<double>() == before[1]);
  REQUIRE(params[2].second.to_vector<double>() == before[2]);
  // Now the bias gets its first gradient: its bias correction uses t = 1, not the global 3.
  Tensor g = grad_for(params[1].second, 1, 7);
  params[1].second.set_grad(g);
  params[0].second.set_grad(Tensor());
  naive_adamw(ref[1], g.to_vector<double>(), opt.lr(), 0, o);
  opt.step();
  REQUIRE_CLOSE(params[1].second, ref[1].p, 1e-12, 1e-12);
  REQUIRE_CLOSE(params[0].second, ref[0].p, 1e-12, 1e-12);
  auto sd = opt.state_dict();
  auto find = [&](const std::string& key) {
    for (auto& [k, t] : sd)
      if (k == key) return t;
    FAIL("no key " << key);
    return Tensor();
  };
  REQUIRE(find("step").item_int() == 3);
  REQUIRE(find("step.model.layers.0.mlp.up_proj.weight").item_int() == 2);
  REQUIRE(find("step.model.layers.0.mlp.up_proj.bias").item_int() == 1);
  REQUIRE(find("step.model.norm.weight").item_int() == 0);
  REQUIRE(find("step").dtype() == DType::kI64);
  REQUIRE(find("step").dim() == 0);

  opt.zero_grad();
  for (auto& [n, t] : params) REQUIRE_FALSE(t.grad().defined());
}

TEST_CASE("state_dict round trip resumes bit for bit", "[cpu]") {
  auto check = [](auto make_opt) {
    auto full_params = make_params(DType::kF32, Layout::kContiguous);
    auto part_params = clone_all(full_params);
    auto feed = [](const NamedTensors& ps, int s) {
      for (size_t k = 0; k < ps.size(); ++k) ps[k].second.set_grad(grad_for(ps[k].second, k, s));
    };
    auto full = make_opt(full_params);
    for (int s = 0; s < 6; ++s) {
      feed(full_params, s);
      full->step();
    }
    auto first = make_opt(part_params);
    for (int s = 0; s < 3; ++s) {
      feed(part_params, s);
      first->step();
    }
    // "Save": detached copies of the model and the optimizer state, as a checkpoint would hold.
    auto saved_model = clone_all(part_params);
    auto saved_state = clone_all(first->state_dict());
    first.reset();
    auto resumed_params = clone_all(saved_model);
    auto second = make_opt(resumed_params);
    second->load_state_dict(saved_state);
    REQUIRE(second->step_count() == 3);
    for (int s = 3; s < 6; ++s) {
      feed(resumed_params, s);
      second->step();
    }
    for (size_t k = 0; k < full_params.size(); ++k) {
      INFO(full_params[k].first);
      const Tensor& r = resumed_params[k].second;
      const Tensor& f = full_params[k].second;
      REQUIRE(r.to_vector<float>() == f.to_vector<float>());
    }
    NamedTensors a = full->state_dict(), b = second->state_dict();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      REQUIRE(a[i].first == b[i].first);
      const Tensor& ta = a[i].second;
      const Tensor& tb = b[i].second;
      REQUIRE(ta.to_vector<double>() == tb.to_vector<double>());
    }
  };
  SECTION("AdamW") {
    check([](const NamedTensors& ps) {
      AdamWOptions o;
      o.lr = 0.01;
      return std::make_unique<AdamW>(make_param_groups(ps, 0.1), o);
    });
  }
  SECTION("SGD with momentum") {
    check([](const NamedTensors& ps) {
      return std::make_unique<SGD>(make_param_groups(ps, 0.1), SGDOptions{0.01, 0.9, 0.1, Nesterov::kNo});
    });
  }
}

TEST_CASE("state_dict key names and load errors", "[cpu]") {
  auto params = make_params(DType::kF64, Layout::kContiguous);
  AdamW opt(make_param_groups(params, 0.1), AdamWOptions{});
  auto sd = opt.state_dict();
  std::vector<std::string> keys;
  for (auto& [k, t] : sd) keys.push_back(k);
  REQUIRE(keys == std::vector<std::string>{"step",
                                           "exp_avg.model.layers.0.mlp.up_proj.weight",
                                           "exp_avg.model.layers.0.mlp.up_proj.bias",
                                           "exp_avg.model.norm.weight",
                                           "exp_avg_sq.model.layers.0.mlp.up_proj.weight",
                                           "exp_avg_sq.model.layers.0.mlp.up_proj.bias",
                                           "exp_avg_sq.model.norm.weight",
                                           "step.model.layers.0.mlp.up_proj.weight",
                                           "step.model.layers.0.mlp.up_proj.bias",
                                           "step.model.norm.weight"});
  SGD plain(make_param_groups(params, 0), SGDOptions{});
  REQUIRE(plain.state_dict().size() == 4);  // no momentum buffer without momentum

  auto missing = sd;
  missing.erase(missing.begin() + 2);
  REQUIRE_THROWS_WITH(opt.load_state_dict(missing),
                      Catch::Contains("AdamW.load_state_dict") &&
                          Catch::Contains("missing keys: exp_avg.model.layers.0.mlp.up_proj.bias"));
  auto extra = sd;
  extra.emplace_back("exp_avg.nope", zeros({1}));
  REQUIRE_THROWS_WITH(opt.load_state_dict(extra), Catch::Contains("unexpected keys: exp_avg.nope"));
  auto wrong = sd;
  wrong[1].second = zeros({7, 5}, DType::kF64);
  REQUIRE_THROWS_WITH(opt.load_state_dict(wrong),
                      Catch::Contains("shape mismatch for 'exp_avg.model.layers.0.mlp.up_proj.weight'") &&
                          Catch::Contains("[7, 5]"));
  auto bad_step = sd;
  bad_step[0].second = scalar_tensor(-1, DType::kI64);
  REQUIRE_THROWS_WITH(opt.load_state_dict(bad_step), Catch::Contains("'step' holds -1"));
  REQUIRE(opt.step_count() == 0);  // nothing was modified
}

TEST_CASE("Optimizer construction errors", "[cpu]") {
  auto params = make_params(DType::kF64, Layout::kContiguous);
  std::vector<ParamGroup> dup = {{{params[0], params[1]}, 0.0}, {{params[0]}, 0.0}};
  REQUIRE_THROWS_WITH(AdamW(dup, AdamWOptions{}), Catch::Contains("appears twice"));
  std::vector<ParamGroup> same = {{{params[0], {"alias", params[0].second}}, 0.0}};
  REQUIRE_THROWS_WITH(AdamW(same, AdamWOptions{}), Catch::Contains("are the same tensor"));
  REQUIRE_THROWS_WITH(SGD(make_param_groups(params, 0), SGDOptions{0.1, 0, 0, Nesterov::kYes}),
                      Catch::Contains("Nesterov momentum needs momentum > 0"));
  AdamWOptions bad;
  bad.beta1 = 1;
  REQUIRE_THROWS_WITH(AdamW(make_param_groups(params, 0), bad), Catch::Contains("beta1"));
  AdamW opt(make_param_groups(params, 0), AdamWOptions{});
  REQUIRE_THROWS_WITH(opt.set_lr(-1), Catch::Contains("learning rate -1"));
  Tensor meta = empty({2, 2}, TensorOptions(DType::kF32).with_device(Device::meta()));
  REQUIRE_THROWS_WITH(SGD(std::vector<ParamGroup>{{{{"m.w", meta}}, 0.0}}, SGDOptions{}),
                      Catch::Contains("'m.w'") && Catch::Contains("meta"));
  // A bad gradient is found before anything changes: the step count, the good parameter and its
  // update count stay as they were (a retry after fixing the gradient is the first step).
  const Tensor before = params[1].second.clone();
  params[1].second.set_grad(ones_like(params[1].second));
  params[0].second.set_grad(zeros_like(params[0].second).to(DType::kF32));
  REQUIRE_THROWS_WITH(opt.step(), Catch::Contains("AdamW.step: parameter 'model.layers.0.mlp.up_proj.weight'"));
  REQUIRE(opt.step_count() == 0);
  REQUIRE_CLOSE(params[1].second, before, 0, 0);
}

TEST_CASE("clip_grad_norm: value, scaling, disabled, non-finite", "[cpu]") {
  auto make = [](std::vector<double> g1, std::vector<double> g2) {
    Tensor a = zeros({2}, DType::kF64).requires_grad_();
    Tensor b = zeros({1}, DType::kF64).requires_grad_();
    Tensor c = zeros({3}, DType::kF64).requires_grad_();  // no grad: skipped
    a.set_grad(from_vector<double>(g1));
    b.set_grad(from_vector<double>(g2));
    return std::vector<Tensor>{a, b, c};
  };
  auto ps = make({3, 4}, {12});  // norm 13
  REQUIRE(clip_grad_norm(ps, 26) == 13);
  REQUIRE(ps[0].grad().to_vector<double>() == std::vector<double>{3, 4});
  REQUIRE(clip_grad_norm(ps, 6.5) == 13);
  const double coef = 6.5 / (13 + 1e-6);
  REQUIRE_CLOSE(ps[0].grad(), std::vector<double>{3 * coef, 4 * coef}, 1e-15, 0);
  REQUIRE_CLOSE(ps[1].grad(), std::vector<double>{12 * coef}, 1e-15, 0);
  REQUIRE(std::abs(clip_grad_norm(ps, 0) - 6.5) < 1e-6);  // disabled: returns the norm only

  ps = make({3, 4}, {12});
  REQUIRE(clip_grad_norm(ps, -1) == 13);
  REQUIRE(ps[1].grad().to_vector<double>() == std::vector<double>{12});

  ps = make({3, std::numeric_limits<double>::infinity()}, {12});
  REQUIRE(std::isinf(clip_grad_norm(ps, 1)));
  REQUIRE(ps[1].grad().to_vector<double>() == std::vector<double>{12});
  ps = make({3, std::nan("")}, {12});
  REQUIRE(std::isnan(clip_grad_norm(ps, 1)));
  REQUIRE(ps[0].grad().to_vector<double>()[0] == 3);
}

TEST_CASE("clip_grad_norm over large, strided and 16-bit gradients", "[cpu]") {
  Tensor big = zeros({301, 257}, DType::kF32).requires_grad_();  // > 4 blocks: threaded path
  big.set_grad(mt::testing::rand(big.shape(), DType::kF32, 3));
  Tensor strided = zeros({13, 9}, DType::kF64).requires_grad_();
  strided.set_grad(noncontig(mt::testing::rand(strided.shape(), DType::kF64, 4)));
  Tensor half = zeros({33}, DType::kBF16).requires_grad_();
  half.set_grad(mt::testing::rand(half.shape(), DType::kBF16, 5));
  double sq = 0;
  for (const Tensor& p : {big, strided, half})
    for (double x : p.grad().to_vector<double>()) sq += x * x;
  const double norm = clip_grad_norm(std::vector<Tensor>{big, strided, half}, 1.0);
  REQUIRE(std::abs(norm - std::sqrt(sq)) < 1e-10 * std::sqrt(sq));
  double after = 0;
  for (const Tensor& p : {big, strided, half})
    for (double x : p.grad().to_vector<double>()) after += x * x;
  REQUIRE(std::abs(std::sqrt(after) - 1.0) < 1e-2);  // bf16 rounding of the scaled grads
  // Named overload agrees.
  NamedTensors named = {{"a", big}};
  REQUIRE(clip_grad_norm(named, 0) > 0);
}

TEST_CASE("LrSchedule: warmup, cosine, floor", "[cpu]") {
  LrSchedule s{1.0, 0.1, 10, 110};
  REQUIRE(s.lr(0) == Approx(0.1).epsilon(1e-15));        // (0 + 1) / 10
  REQUIRE(s.lr(4) == Approx(0.5).epsilon(1e-15));
  REQUIRE(s.lr(9) == 1.0);                                 // last warmup step reaches max_lr
  REQUIRE(s.lr(10) == 1.0);                                // cosine starts at max_lr
  REQUIRE(s.lr(60) == Approx(0.55).epsilon(1e-15));        // midpoint: (max + min) / 2
  REQUIRE(s.lr(35) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4))).epsilon(1e-15));
  REQUIRE(s.lr(109) > 0.1);
  REQUIRE(s.lr(109) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 99 / 100))).epsilon(1e-15));
  REQUIRE(s.lr(110) == 0.1);
  REQUIRE(s.lr(100000) == 0.1);
  LrSchedule no_warmup{2.0, 0.0, 0, 4};
  REQUIRE(no_warmup.lr(0) == 2.0);
  REQUIRE(no_warmup.lr(2) == Approx(1.0).epsilon(1e-15));
  REQUIRE(no_warmup.lr(4) == 0.0);
  REQUIRE_THROWS_WITH(s.lr(-1), Catch::Contains("step -1 is negative"));
  LrSchedule bad{1.0, 0.1, 10, 5};
  REQUIRE_THROWS_WITH(bad.lr(0), Catch::Contains("warmup_steps 10, total_steps 5"));
}

TEST_CASE("MasterWeights: f32 masters accumulate updates too small for bf16", "[cpu]") {
  const int kSteps = 100;
  Tensor w = ones({4}, DType::kBF16).requires_grad_();
  Tensor c = full({4}, 1e-4, DType::kBF16);  // d(sum(w * c))/dw = c
  MasterWeights mw({{"w", w}});
  REQUIRE_FALSE(mw.pass_through());
  REQUIRE(mw.master_params()[0].second.dtype() == DType::kF32);
  SGD opt({{mw.master_params(), 0.0}}, SGDOptions{1.0, 0, 0, Nesterov::kNo});

  Tensor pure = ones({4}, DType::kBF16).requires_grad_();  // the same training, all in bf16
  SGD pure_opt({{{{"w", pure}}, 0.0}}, SGDOptions{1.0, 0, 0, Nesterov::kNo});
  for (int s = 0; s < kSteps; ++s) {
    w.set_grad(Tensor());
    sum(mul(w, c)).backward();
    REQUIRE(w.grad().dtype() == DType::kBF16);
    mw.grads_to_master();
    opt.step();
    opt.zero_grad();
    mw.master_to_model();

    pure.set_grad(Tensor());
    sum(mul(pure, c)).backward();
    pure_opt.step();
  }
  const double step = static_cast<double>(static_cast<float>(BFloat16(1e-4f)));
  for (double x : pure.to_vector<double>()) REQUIRE(x == 1.0);  // each step rounds back to 1
  for (double x : mw.master_params()[0].second.to_vector<double>())
    REQUIRE(std::abs(x - (1 - kSteps * step)) < 1e-5);
  const double expect = static_cast<float>(BFloat16(static_cast<float>(1 - kSteps * step)));
  for (double x : w.to_vector<double>()) REQUIRE(x == expect);
  REQUIRE(expect < 0.99);

  // Masters survive a state_dict round trip (resume must not start from the rounded weights).
  auto saved = clone_all(mw.state_dict());
  REQUIRE(saved.size() == 1);
  MasterWeights fresh({{"w", w}});
  fresh.load_state_dict(saved);
  REQUIRE(fresh.master_params()[0].second.to_vector<float>() == mw.master_params()[0].second.to_vector<float>());
  REQUIRE_THROWS_WITH(fresh.load_state_dict({}), Catch::Contains("missing keys: w"));
  // Undefined model grads clear the master grads.
  w.set_grad(Tensor());
  mw.master_params()[0].second.set_grad(ones({4}));
  mw.grads_to_master();
  REQUIRE_FALSE(mw.master_params()[0].second.grad().defined());
}

TEST_CASE("MasterWeights: f32 parameters pass through without copies", "[cpu]") {
  Tensor w = mt::testing::rand({3, 2}, DType::kF32, 9).requires_grad_();
  Tensor h = zeros({2}, DType::kF16).requires_grad_();
  MasterWeights all32({{"w", w}});
  REQUIRE(all32.pass_through());
  REQUIRE(all32.master_params()[0].second.same(w));
  REQUIRE(all32.state_dict().empty());
  w.set_grad(ones_like(w));
  all32.grads_to_master();
  all32.master_to_model();
  REQUIRE(all32.master_params()[0].second.grad().same(w.grad()));
  MasterWeights mixed({{"w", w}, {"h", h}});
  REQUIRE(mixed.master_params()[0].second.same(w));
  REQUIRE_FALSE(mixed.master_params()[1].second.same(h));
  REQUIRE(mixed.master_params()[1].second.dtype() == DType::kF32);
}

namespace {
struct Tiny : Module {
  Tensor& w;
  Tensor& b;
  Tensor& idx;
  Tiny()
      : w(register_parameter("w", mt::testing::rand({3, 4}, DType::kF32, 11))),
        b(register_parameter("b", mt::testing::rand({4}, DType::kF32, 12))),
        idx(register_buffer("idx", arange(4))) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return {add(matmul(in[0], w), b)}; }
};
}  // namespace

TEST_CASE("cast_parameters converts in place, keeping the tensor objects", "[cpu]") {
  auto m = std::make_shared<Tiny>();
  Tensor handle = m->w;  // held elsewhere, e.g. by an optimizer
  auto before = handle.to_vector<float>();
  m->w.set_grad(ones_like(m->w));
  cast_parameters(*m, DType::kBF16);
  REQUIRE(handle.dtype() == DType::kBF16);
  REQUIRE(m->get_parameter("b").dtype() == DType::kBF16);
  REQUIRE(m->get_buffer("idx").dtype() == DType::kI64);
  REQUIRE_FALSE(handle.grad().defined());
  REQUIRE(handle.requires_grad());
  auto after = handle.to_vector<float>();
  for (size_t i = 0; i < before.size(); ++i) REQUIRE(after[i] == static_cast<float>(BFloat16(before[i])));
  // The module still trains: forward and backward in bf16.
  Tensor x = mt::testing::rand({2, 3}, DType::kBF16, 13);
  sum((*m)(x)).backward();
  REQUIRE(handle.grad().dtype() == DType::kBF16);
  cast_parameters(*m, DType::kF32);
  REQUIRE(handle.dtype() == DType::kF32);
  REQUIRE(handle.to_vector<float>() == after);
  Tensor meta = empty({2}, TensorOptions(DType::kF32).with_device(Device::meta()));
  REQUIRE_THROWS_WITH(cast_tensor_in_place(meta, DType::kBF16), Catch::Contains("meta"));
}

TEST_CASE("Mixed precision in one pass matches the copy path: 16-bit grads, clipping scale, model copies",
          "[cpu]") {
  // Path A: grads_to_master, clip_grad_norm (scales the f32 grads), AdamW, master_to_model.
  // Path B: attach_model_grads, the norm alone, AdamW::set_grad_scale and set_param_copies (one
  // fused pass). The same weights up to the rounding of the scaled gradient (f32 either way).
  for (DType dt : {DType::kBF16, DType::kF16}) {
    INFO(dtype_name(dt));
    auto model = [&] {
      NamedTensors ps = make_params(DType::kF32, Layout::kContiguous);
      for (auto& [name, p] : ps) p = p.detach().to(dt).requires_grad_();
      return ps;
    };
    NamedTensors ma = model(), mb = model();
    MasterWeights wa(ma), wb(mb);
    AdamWOptions o;
    o.lr = 0.05;
    AdamW oa(make_param_groups(wa.master_params(), 0.1), o), ob(make_param_groups(wb.master_params(), 0.1), o);
    ob.set_param_copies(wb.model_copies());
    for (int step = 0; step < 5; ++step) {
      for (size_t k = 0; k < ma.size(); ++k) {
        Tensor g = mul(grad_for(ma[k].second, k, step), 30).to(dt);  // large: clipping scales
        ma[k].second.set_grad(g);
        mb[k].second.set_grad(g.clone());
      }
      wa.grads_to_master();
      const double na = clip_grad_norm(wa.master_params(), 1.0);
      oa.step();
      oa.zero_grad();
      wa.master_to_model();

      wb.attach_model_grads();
      REQUIRE(wb.master_params()[0].second.grad().dtype() == dt);  // the model's grad, no copy
      const double nb = clip_grad_norm(wb.master_params(), 0);
      REQUIRE(nb == na);  // 16-bit to f32 is exact: the same squares
      REQUIRE(nb > 1);
      ob.set_grad_scale(1.0 / (nb + 1e-6));
      ob.step();
      ob.zero_grad();
    }
    for (size_t k = 0; k < ma.size(); ++k) {
      INFO(ma[k].first);
      REQUIRE_CLOSE(wb.master_params()[k].second, wa.master_params()[k].second, 1e-6, 1e-7);
      // The model copies are the rounded masters.
      REQUIRE_CLOSE(mb[k].second, wb.master_params()[k].second.to(dt), 0, 0);
    }
  }
  // A strided model parameter takes the tensor-op fallback, with the same results.
  Tensor w = noncontig(mt::testing::rand({4, 6}, DType::kF32, 3));
  Tensor w16 = w.to(DType::kBF16);
  NamedTensors master{{"w", w.clone().requires_grad_()}};
  AdamWOptions o;
  o.lr = 0.05;
  AdamW fused(make_param_groups(master, 0.0), o);
  Tensor strided_copy = noncontig(w16);
  fused.set_param_copies({{"w", strided_copy}});
  master[0].second.set_grad(mt::testing::rand({4, 6}, DType::kBF16, 4));
  fused.set_grad_scale(0.5);
  fused.step();
  REQUIRE_CLOSE(strided_copy, master[0].second.to(DType::kBF16), 0, 0);
  REQUIRE_THROWS_WITH(fused.set_grad_scale(0), Catch::Contains("gradient scale"));
  REQUIRE_THROWS_WITH(fused.set_param_copies({{"w", w}}), Catch::Contains("bf16 or f16"));
}
