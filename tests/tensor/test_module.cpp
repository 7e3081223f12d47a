// Module: dotted paths, lookup errors, state dicts, hooks (order and effect), train/eval,
// deferred meta init + materialize (bit-identical to a CPU build), init records.

#include "tensor/module.h"
#include "testing.h"

using namespace mt;
using mt::testing::same_bits;
using Catch::Contains;

namespace {

// y = x * weight + bias, elementwise (a stand-in for Linear that needs no matmul).
struct Affine : Module {
  Tensor weight, bias;  // copies of the handles: materialize() must keep them valid
  std::vector<std::string>* events = nullptr;
  explicit Affine(int64_t n) {
    weight = param_uniform("weight", {n}, -1, 1);
    bias = param_const("bias", {n}, 0.25);
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    if (events) events->push_back(path() + ".forward");
    return {in[0] * weight + bias};
  }
};

struct Attn : Module {
  std::shared_ptr<Affine> wq, wo;
  explicit Attn(int64_t n) {
    wq = register_module("wq", std::make_shared<Affine>(n));
    wo = register_module("wo", std::make_shared<Affine>(n));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return {(*wo)(tanh((*wq)(in[0])))}; }
};

struct Mlp : Module {
  Tensor gate;
  std::shared_ptr<Affine> up;
  explicit Mlp(int64_t n) {
    gate = param_normal("gate", {n}, 0, 0.5);
    up = register_module("up", std::make_shared<Affine>(n));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return {(*up)(silu(in[0] * gate))}; }
};

struct Block : Module {
  std::shared_ptr<Attn> attn;
  std::shared_ptr<Mlp> mlp;
  explicit Block(int64_t n) {
    attn = register_module("attn", std::make_shared<Attn>(n));
    register_buffer("mask", ones({n}));
    mlp = register_module("mlp", std::make_shared<Mlp>(n));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    Tensor h = in[0] + (*attn)(in[0]) * get_buffer("mask");
    return {h + (*mlp)(h)};
  }
};

struct Model : Module {
  Tensor embed;
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<Affine> head;
  explicit Model(int64_t n = 4, int64_t n_layers = 2) {
    embed = param_normal("embed", {5, n}, 0, 1);
    layers = register_module("layers", std::make_shared<ModuleList>());
    for (int64_t i = 0; i < n_layers; ++i) layers->push_back(std::make_shared<Block>(n));
    head = register_module("head", std::make_shared<Affine>(n));
    register_buffer("pos", arange(n, DType::kI64));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    Tensor h = in[0] + embed.select(0, 0);
    for (const auto& layer : *layers) h = (*layer)(h);
    return {(*head)(h)};
  }
};

std::vector<std::string> keys(const Module::NamedTensors& v) {
  std::vector<std::string> out;
  for (auto& kv : v) out.push_back(kv.first);
  return out;
}

}  // namespace

TEST_CASE("module: dotted paths of a nested model in registration order", "[cpu]") {
  manual_seed(1);
  auto m = std::make_shared<Model>();
  std::vector<std::string> expect_params = {"embed"};
  for (std::string l : {"layers.0", "layers.1"})
    for (std::string p : {".attn.wq.weight", ".attn.wq.bias", ".attn.wo.weight", ".attn.wo.bias", ".mlp.gate",
                          ".mlp.up.weight", ".mlp.up.bias"})
      expect_params.push_back(l + p);
  expect_params.push_back("head.weight");
  expect_params.push_back("head.bias");
  REQUIRE(keys(m->named_parameters()) == expect_params);
  REQUIRE(m->parameters().size() == expect_params.size());
  for (const Tensor& p : m->parameters()) REQUIRE(p.requires_grad());

  REQUIRE(keys(m->named_buffers()) == std::vector<std::string>{"pos", "layers.0.mask", "layers.1.mask"});

  std::vector<std::string> mods;
  for (auto& [path, mod] : m->named_modules()) mods.push_back(path);
  std::vector<std::string> expect_mods = {"", "layers"};
  for (std::string l : {"layers.0", "layers.1"})
    for (std::string s : {"", ".attn", ".attn.wq", ".attn.wo", ".mlp", ".mlp.up"}) expect_mods.push_back(l + s);
  expect_mods.push_back("head");
  REQUIRE(mods == expect_mods);

  std::vector<std::string> children;
  for (auto& [name, mod] : m->named_children()) children.push_back(name);
  REQUIRE(children == std::vector<std::string>{"layers", "head"});

  // state_dict: per module its parameters, then its buffers, then the children.
  std::vector<std::string> expect_state = {"embed", "pos"};
  for (std::string l : {"layers.0", "layers.1"})
    for (std::string p : {".mask", ".attn.wq.weight", ".attn.wq.bias", ".attn.wo.weight", ".attn.wo.bias",
                          ".mlp.gate", ".mlp.up.weight", ".mlp.up.bias"})
      expect_state.push_back(l + p);
  expect_state.push_back("head.weight");
  expect_state.push_back("head.bias");
  REQUIRE(keys(m->state_dict()) == expect_state);

  REQUIRE(m->get_module("layers.1.attn")->path() == "layers.1.attn");
  REQUIRE(m->get_module("")->path().empty());
  REQUIRE(m->get_module("layers.0.mlp.up").get() == m->layers->at<Block>(0)->mlp->up.get());
  REQUIRE(m->get_parameter("layers.1.mlp.gate").same(m->layers->at<Block>(1)->mlp->gate));
  REQUIRE(m->get_buffer("layers.0.mask").shape() == Shape{4});
  REQUIRE(m->layers->size() == 2);
}

TEST_CASE("module: shard units are listed with paths from the module asked", "[cpu]") {
  manual_seed(1);
  auto m = std::make_shared<Model>();
  auto& attn = *m->layers->get_module("1.attn");
  attn.declare_shard_unit("wq.weight", 0, 2, "head");
  m->declare_shard_unit("embed", 1, 4, "row");
  auto units = m->shard_units();
  REQUIRE(units.size() == 2);
  REQUIRE(units[0].param == "embed");
  REQUIRE(units[1].param == "layers.1.attn.wq.weight");
  REQUIRE((units[1].dim == 0 && units[1].size == 2 && units[1].what == "head"));
  REQUIRE(attn.shard_units().at(0).param == "wq.weight");
  REQUIRE_THROWS_WITH(attn.declare_shard_unit("wo.weight", 0, 0, "x"),
                      Contains("size > 0") && Contains("layers.1.attn"));
}

TEST_CASE("module: a parameter read outside its module is declared by path", "[cpu]") {
  manual_seed(1);
  auto m = std::make_shared<Model>();
  REQUIRE(m->shared_uses().empty());
  m->declare_shared_use("embed");
  m->declare_shared_use("layers.1.mlp.gate");
  REQUIRE(m->shared_uses() == std::vector<std::string>{"embed", "layers.1.mlp.gate"});
  REQUIRE_THROWS_WITH(m->declare_shared_use("layers.1.mlp.gat"), Contains("did you mean 'gate'"));
  REQUIRE(m->shared_uses().size() == 2);
}

TEST_CASE("module: lookup and registration errors name the path and list nearby names", "[cpu]") {
  manual_seed(1);
  auto m = std::make_shared<Model>();
  REQUIRE_THROWS_WITH(m->get_parameter("layers.0.attn.wq.weigth"),
                      Contains("no parameter 'weigth' in 'layers.0.attn.wq'") && Contains("did you mean 'weight'") &&
                          Contains("weight, bias"));
  REQUIRE_THROWS_WITH(m->get_module("layers.2.attn"),
                      Contains("no submodule '2' in 'layers'") && Contains("layers.2.attn") && Contains("0, 1"));
  REQUIRE_THROWS_WITH(m->get_module("layer"), Contains("did you mean 'layers'"));
  REQUIRE_THROWS_WITH(m->get_parameter("layers.0.attn"), Contains("'attn' is a submodule"));
  REQUIRE_THROWS_WITH(m->get_parameter("layers.0.mask"), Contains("'mask' is a buffer"));
  auto wq = m->get_module("layers.0.attn.wq");
  REQUIRE_THROWS_WITH(wq->register_parameter("weight", zeros({2})),
                      Contains("'weight' already names a parameter of module 'layers.0.attn.wq'"));
  REQUIRE_THROWS_WITH(wq->register_buffer("a.b", zeros({2})), Contains("must not contain '.'"));
  REQUIRE_THROWS_WITH(m->register_parameter("", zeros({2})), Contains("empty name in the root module"));
  REQUIRE_THROWS_WITH(m->register_module("head", std::make_shared<Affine>(2)),
                      Contains("'head' already names a submodule"));
  REQUIRE_THROWS_WITH(wq->register_module("loop", m), Contains("its own descendant"));
  REQUIRE_THROWS_WITH(m->layers->at(5), Contains("ModuleList 'layers': index 5 out of range for 2"));
  REQUIRE_THROWS_WITH(m->layers->at<Affine>(0), Contains("not of the requested module type"));
  REQUIRE_THROWS_WITH((*m->layers)(ones({4})), Contains("container"));
}

TEST_CASE("module: tied parameters are listed once but saved under every path", "[cpu]") {
  struct Tied : Module {
    std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return in; }
  };
  auto root = std::make_shared<Tied>();
  auto a = root->register_module("a", std::make_shared<Affine>(3));
  auto b = root->register_module("b", std::make_shared<Tied>());
  b->register_parameter("w", a->weight);
  REQUIRE(keys(root->named_parameters()) == std::vector<std::string>{"a.weight", "a.bias"});
  REQUIRE(keys(root->state_dict()) == std::vector<std::string>{"a.weight", "a.bias", "b.w"});
}

TEST_CASE("module: state_dict round trip into a fresh model, with dtype conversion", "[cpu]") {
  manual_seed(1);
  auto a = std::make_shared<Model>();
  manual_seed(2);
  auto b = std::make_shared<Model>();
  Tensor x = mt::testing::rand({4}, DType::kF32, 3);
  REQUIRE_FALSE(same_bits((*a)(x), (*b)(x)));
  LoadResult r = b->load_state_dict(a->state_dict());
  REQUIRE(r.missing_keys.empty());
  REQUIRE(r.unexpected_keys.empty());
  auto sa = a->state_dict(), sb = b->state_dict();
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    REQUIRE(same_bits(sa[i].second, sb[i].second));
    REQUIRE_FALSE(sa[i].second.same(sb[i].second));  // copied, not aliased
  }
  REQUIRE(same_bits((*a)(x), (*b)(x)));
  REQUIRE(b->get_parameter("head.weight").requires_grad());

  // f64 values load into the f32 model, converted.
  Module::NamedTensors wide;
  for (auto& [k, t] : a->state_dict()) wide.emplace_back(k, t.to(is_floating(t.dtype()) ? DType::kF64 : t.dtype()));
  wide[0].second = full(wide[0].second.shape(), 1.5, DType::kF64);
  manual_seed(3);
  auto c = std::make_shared<Model>();
  c->load_state_dict(wide);
  REQUIRE(c->get_parameter("embed").dtype() == DType::kF32);
  REQUIRE(c->get_parameter("embed").to_vector<float>() == std::vector<float>(20, 1.5f));
  REQUIRE(same_bits(c->get_parameter("layers.1.mlp.gate"), a->get_parameter("layers.1.mlp.gate")));
}

TEST_CASE("module: load_state_dict errors name the keys and shapes and modify nothing", "[cpu]") {
  manual_seed(1);
  auto a = std::make_shared<Model>();
  manual_seed(2);
  auto b = std::make_shared<Model>();
  Tensor before = b->get_parameter("embed").clone();

  auto missing = a->state_dict();
  missing.pop_back();  // head.bias
  REQUIRE_THROWS_WITH(b->load_state_dict(missing), Contains("missing keys: head.bias"));
  auto unexpected = a->state_dict();
  unexpected.emplace_back("layers.0.extra", zeros({1}));
  REQUIRE_THROWS_WITH(b->load_state_dict(unexpected), Contains("unexpected keys: layers.0.extra"));
  auto bad_shape = a->state_dict();
  bad_shape[2].second = zeros({3, 2});  // layers.0.mask
  REQUIRE_THROWS_WITH(b->load_state_dict(bad_shape),
                      Contains("shape mismatch for 'layers.0.mask': the state has [3, 2] but the model has [4]"));
  auto dup = a->state_dict();
  dup.push_back(dup[0]);
  REQUIRE_THROWS_WITH(b->load_state_dict(dup), Contains("key 'embed' appears twice"));
  REQUIRE(same_bits(b->get_parameter("embed"), before));

  // Non-strict: reports, loads what matches.
  LoadResult r = b->load_state_dict(unexpected, Strict::kNo);
  REQUIRE(r.unexpected_keys == std::vector<std::string>{"layers.0.extra"});
  r = b->load_state_dict(missing, Strict::kNo);
  REQUIRE(r.missing_keys == std::vector<std::string>{"head.bias"});
  REQUIRE(same_bits(b->get_parameter("embed"), a->get_parameter("embed")));
  REQUIRE_THROWS_WITH(b->load_state_dict(bad_shape, Strict::kNo), Contains("shape mismatch for 'layers.0.mask'"));
}

TEST_CASE("module: train/eval recurse, zero_grad clears grads", "[cpu]") {
  manual_seed(1);
  auto m = std::make_shared<Model>();
  REQUIRE(m->is_training());
  m->eval();
  for (auto& [p, mod] : m->named_modules()) REQUIRE_FALSE(mod->is_training());
  m->layers->at(1)->train();
  REQUIRE(m->get_module("layers.1.attn.wq")->is_training());
  REQUIRE_FALSE(m->get_module("layers.0.attn.wq")->is_training());
  sum((*m)(ones({4}))).backward();
  for (auto& [p, t] : m->named_parameters()) REQUIRE(t.grad().defined());
  m->zero_grad();
  for (auto& [p, t] : m->named_parameters()) REQUIRE_FALSE(t.grad().defined());
}

// ---- hooks --------------------------------------------------------------------------------------

namespace {

struct TwoLayer : Module {
  std::shared_ptr<ModuleList> layers;
  std::vector<std::string>* events;
  explicit TwoLayer(std::vector<std::string>* ev) : events(ev) {
    layers = register_module("layers", std::make_shared<ModuleList>());
    for (int i = 0; i < 2; ++i) layers->push_back(std::make_shared<Affine>(3))->events = ev;
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    events->push_back("model.forward");
    Tensor h = in[0];
    for (const auto& l : *layers) h = tanh((*l)(h));
    return {h};
  }
};

std::string label(const Module& m) { return m.path().empty() ? "model" : m.path(); }

std::vector<HookHandle> record_all_hooks(Module& m, std::vector<std::string>& ev) {
  std::vector<HookHandle> hs;
  hs.push_back(m.register_forward_pre_hook([&ev](Module& mm, std::vector<Tensor>&) { ev.push_back(label(mm) + ".forward_pre"); }));
  hs.push_back(m.register_forward_hook([&ev](Module& mm, const std::vector<Tensor>&, std::vector<Tensor>&) {
    ev.push_back(label(mm) + ".forward_hook");
  }));
  hs.push_back(m.register_backward_pre_hook([&ev](Module& mm, std::vector<Tensor>& go) {
    REQUIRE(go.size() == 1);
    REQUIRE(go[0].defined());
    ev.push_back(label(mm) + ".backward_pre");
  }));
  hs.push_back(m.register_backward_hook([&ev](Module& mm, std::vector<Tensor>& gi, const std::vector<Tensor>& go) {
    REQUIRE(gi.size() == 1);
    REQUIRE(go.size() == 1);
    ev.push_back(label(mm) + ".backward" + (gi[0].defined() ? "" : "(no grad_input)"));
  }));
  return hs;
}

}  // namespace

TEST_CASE("module hooks: full firing order over forward and backward of a 2-layer model", "[cpu]") {
  manual_seed(1);
  std::vector<std::string> ev;
  auto m = std::make_shared<TwoLayer>(&ev);
  std::vector<HookHandle> handles;
  for (auto& [p, mod] : m->named_modules())
    if (p != "layers")
      for (auto& h : record_all_hooks(*mod, ev)) handles.push_back(h);

  Tensor x = mt::testing::rand({3}).to(DType::kF32).requires_grad_();
  Tensor y = (*m)(x);
  sum(y).backward();
  std::vector<std::string> expect = {
      "model.forward_pre",     "model.forward",      "layers.0.forward_pre", "layers.0.forward",
      "layers.0.forward_hook", "layers.1.forward_pre", "layers.1.forward",   "layers.1.forward_hook",
      "model.forward_hook",    "model.backward_pre", "layers.1.backward_pre", "layers.1.backward",
      "layers.0.backward_pre", "layers.0.backward",  "model.backward"};
  REQUIRE(ev == expect);

  // Without an input that requires grad, the backward hooks fire at the outputs, with an
  // undefined grad_input.
  ev.clear();
  sum((*m)(x.detach())).backward();
  std::vector<std::string> expect_no_input = {
      "model.backward_pre",    "model.backward(no grad_input)",    "layers.1.backward_pre",
      "layers.1.backward",     "layers.0.backward_pre", "layers.0.backward(no grad_input)"};
  REQUIRE(std::vector<std::string>(ev.begin() + 9, ev.end()) == expect_no_input);

  // Removed handles stop firing, also for a graph recorded before the removal.
  ev.clear();
  Tensor y2 = (*m)(x);
  for (auto& h : handles) h.remove();
  sum(y2).backward();
  REQUIRE(ev == std::vector<std::string>{"model.forward_pre", "model.forward", "layers.0.forward_pre",
                                         "layers.0.forward", "layers.0.forward_hook", "layers.1.forward_pre",
                                         "layers.1.forward", "layers.1.forward_hook", "model.forward_hook"});
  ev.clear();
  sum((*m)(x)).backward();
  REQUIRE(ev == std::vector<std::string>{"model.forward", "layers.0.forward", "layers.1.forward"});
}

TEST_CASE("module hooks: modifications of inputs, outputs and gradients take effect", "[cpu]") {
  manual_seed(1);
  auto m = std::make_shared<Affine>(3);
  Tensor x = mt::testing::rand({3}).requires_grad_();
  auto run = [&] {
    x.set_grad(Tensor());
    m->zero_grad();
    Tensor y = (*m)(x);
    sum(y * y).backward();
    return std::make_tuple(y.detach(), x.grad(), m->weight.grad());
  };
  auto [y0, gx0, gw0] = run();
  Tensor w = m->weight.detach().to(DType::kF64), b = m->bias.detach().to(DType::kF64);

  SECTION("forward pre hook replaces the input") {
    auto h = m->register_forward_pre_hook([](Module&, std::vector<Tensor>& in) { in[0] = in[0] * 2.0; });
    auto [y, gx, gw] = run();
    REQUIRE_CLOSE(y, (x.detach() * 2.0) * w + b, 1e-6, 1e-6);
    h.remove();
    REQUIRE_CLOSE(std::get<0>(run()), y0, 0, 0);
  }
  SECTION("forward hook replaces the output") {
    auto h = m->register_forward_hook(
        [](Module&, const std::vector<Tensor>&, std::vector<Tensor>& out) { out[0] = out[0] + 1.0; });
    auto [y, gx, gw] = run();
    REQUIRE_CLOSE(y, y0 + 1.0, 1e-6, 1e-6);
    h.remove();
  }
  SECTION("backward hook doubling grad_inputs doubles the input grad only") {
    auto h = m->register_backward_hook([](Module&, std::vector<Tensor>& gi, const std::vector<Tensor>& go) {
      REQUIRE(go[0].shape() == Shape{3});
      gi[0] = gi[0] * 2.0;
    });
    auto [y, gx, gw] = run();
    REQUIRE_CLOSE(gx, gx0 * 2.0, 0, 0);
    REQUIRE_CLOSE(gw, gw0, 0, 0);
    h.remove();
    REQUIRE_CLOSE(std::get<1>(run()), gx0, 0, 0);
  }
  SECTION("backward pre hook scaling grad_outputs scales every gradient behind it") {
    std::vector<Tensor> seen_go;
    auto h1 = m->register_backward_pre_hook([](Module&, std::vector<Tensor>& go) { go[0] = go[0] * 3.0; });
    auto h2 = m->register_backward_hook(
        [&](Module&, std::vector<Tensor>&, const std::vector<Tensor>& go) { seen_go = go; });
    auto [y, gx, gw] = run();
    REQUIRE_CLOSE(gx, gx0 * 3.0, 1e-12, 0);
    REQUIRE_CLOSE(gw, gw0 * 3.0, 1e-6, 0);
    REQUIRE_CLOSE(seen_go[0], y0 * 6.0, 1e-6, 1e-6);  // the hook sees the modified grad_outputs
  }
  SECTION("a hook changing a gradient's shape is an error naming the module") {
    auto outer = std::make_shared<Model>();
    outer->get_module("head")->register_backward_hook(
        [](Module&, std::vector<Tensor>& gi, const std::vector<Tensor>&) { gi[0] = zeros({2}); });
    REQUIRE_THROWS_WITH(sum((*outer)(ones({4}))).backward(),
                        Contains("backward hook of module 'head': grad_input 0") && Contains("[2]"));
  }
}

// ---- deferred init ------------------------------------------------------------------------------

TEST_CASE("module: meta init + materialize equals a CPU build bit for bit", "[cpu]") {
  manual_seed(42);
  auto cpu = std::make_shared<Model>();
  uint64_t after_cpu = default_generator().offset();
  manual_seed(42);
  std::shared_ptr<Model> lazy;
  {
    InitDeviceGuard guard(Device::meta());
    REQUIRE(init_device().is_meta());
    lazy = std::make_shared<Model>();
  }
  REQUIRE(init_device().is_cpu());
  REQUIRE(default_generator().offset() == after_cpu);  // blocks reserved on meta too
  for (auto& [p, t] : lazy->named_parameters()) {
    INFO(p);
    REQUIRE(t.is_meta());
    REQUIRE(t.requires_grad());
  }
  REQUIRE_THROWS_WITH((*lazy)(ones({4})), Contains("meta"));
  Tensor held = lazy->head->weight;  // a handle taken before materialize
  lazy->materialize();
  REQUIRE_FALSE(held.is_meta());
  auto a = cpu->named_parameters(), b = lazy->named_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    REQUIRE(b[i].second.device().is_cpu());
    REQUIRE(b[i].second.requires_grad());
    REQUIRE(same_bits(a[i].second, b[i].second));
  }
  Tensor x = mt::testing::rand({4}, DType::kF32, 5);
  REQUIRE(same_bits((*cpu)(x), (*lazy)(x)));
}

TEST_CASE("module: init records give increasing offsets and can fill a shard", "[cpu]") {
  manual_seed(9);
  uint64_t start = default_generator().offset();
  auto m = std::make_shared<Model>();
  std::vector<std::string> random_params = {"embed", "layers.0.attn.wq.weight", "layers.0.attn.wo.weight",
                                            "layers.0.mlp.gate", "layers.0.mlp.up.weight", "layers.1.attn.wq.weight",
                                            "head.weight"};
  uint64_t prev = start;
  for (size_t i = 0; i < random_params.size(); ++i) {
    const InitRecord* r = m->init_record(random_params[i]);
    INFO(random_params[i]);
    REQUIRE(r != nullptr);
    REQUIRE(r->kind == InitRecord::Kind::kRandom);
    REQUIRE(r->seed == 9);
    if (i == 0)
      REQUIRE(r->offset == start);
    else
      REQUIRE(r->offset > prev);
    prev = r->offset;
  }
  const InitRecord* e = m->init_record("embed");
  REQUIRE(m->init_record("layers.0.attn.wq.weight")->offset == e->offset + random_blocks(e->dist, e->dtype, 20, e->a, e->b));
  REQUIRE(e->dist == RandomDist::kNormal);
  REQUIRE(e->shape == Shape{5, 4});
  const InitRecord* c = m->init_record("head.bias");
  REQUIRE(c->kind == InitRecord::Kind::kConstant);
  REQUIRE(c->value == 0.25);
  REQUIRE_THROWS_WITH(m->init_record("head.nope"), Contains("no parameter 'nope'"));

  // A shard: rows 1..3 of embed, and a column slice, regenerated from the record alone.
  Tensor full_w = m->get_parameter("embed").detach();
  Tensor rows = empty({3, 4});
  e->fill(rows, 1 * 4, Shape{4, 1});
  REQUIRE(same_bits(rows, full_w.narrow(0, 1, 3)));
  Tensor cols = empty({5, 2});
  e->fill(cols, 2, Shape{4, 1});
  REQUIRE(same_bits(cols, full_w.narrow(1, 2, 2)));
}

TEST_CASE("module: materialize and load_state_dict on meta tensors", "[cpu]") {
  manual_seed(1);
  auto ref = std::make_shared<Model>();
  std::shared_ptr<Model> lazy;
  {
    InitDeviceGuard guard(Device::meta());
    lazy = std::make_shared<Model>();
    lazy->register_buffer("cache", empty({2}, TensorOptions().with_device(Device::meta())));
  }
  REQUIRE_THROWS_WITH(lazy->materialize(), Contains("without an init record") && Contains("cache"));
  auto state = ref->state_dict();
  state.emplace_back("cache", full({2}, 3.0));
  lazy->load_state_dict(state);
  for (auto& [k, t] : lazy->state_dict()) REQUIRE_FALSE(t.is_meta());
  REQUIRE(lazy->get_buffer("cache").to_vector<float>() == std::vector<float>{3, 3});
  REQUIRE(same_bits(lazy->get_parameter("layers.1.attn.wo.weight"), ref->get_parameter("layers.1.attn.wo.weight")));
  REQUIRE(lazy->head->bias.requires_grad());
  lazy->materialize();  // nothing left on meta: no-op
}

TEST_CASE("module: param helpers draw what the random ops draw, at the same stream position", "[cpu]") {
  struct P : Module {
    std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return in; }
  };
  manual_seed(5);
  Tensor u = uniform({3, 5}, -2, 2);
  Tensor n = normal({4, 2}, 1, 3, DType::kF64);
  manual_seed(5);
  P m;  // not owned by a shared_ptr: still usable
  m.param_uniform("u", {3, 5}, -2, 2);
  m.param_normal("n", {4, 2}, 1, 3, DType::kF64);
  REQUIRE(same_bits(m.get_parameter("u"), u));
  REQUIRE(same_bits(m.get_parameter("n"), n));
  REQUIRE(m.named_modules().size() == 1);
  REQUIRE_THROWS_WITH(m.param_normal("i", {2}, 0, 1, DType::kI64), Contains("floating dtype"));
  uint64_t before = default_generator().offset();
  REQUIRE_THROWS_WITH(m.param_uniform("u", {2}, 0, 1), Contains("already names a parameter"));
  REQUIRE(default_generator().offset() == before);  // a failed creation reserves nothing
}
