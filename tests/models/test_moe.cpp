// Mixtral tests: HF parameter names and shapes, the sparse MoE block against a naive loop
// reference (f64), finite-difference gradients through router and experts, the load-balancing
// loss against a naive computation, meta-device init and errors.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "models/moe.h"
#include "model_testing.h"
#include "testing.h"

using namespace mt;
using namespace mt::testing;
using Catch::Contains;

namespace {

ModelConfig tiny_mixtral() {
  ModelConfig c;
  c.model_type = "mixtral";
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 6;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 64;
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.router_aux_loss_coef = 0.1;
  return c;
}

using Names = std::vector<std::pair<std::string, Shape>>;

// What HF's MixtralForCausalLM.named_parameters() lists, in its order.
Names hf_mixtral_names(const ModelConfig& c) {
  const int64_t H = c.hidden_size, D = c.resolved_head_dim(), I = c.intermediate_size;
  const int64_t q = c.num_attention_heads * D, kv = c.num_key_value_heads * D;
  Names n{{"model.embed_tokens.weight", {c.vocab_size, H}}};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    n.emplace_back(p + "self_attn.q_proj.weight", Shape{q, H});
    n.emplace_back(p + "self_attn.k_proj.weight", Shape{kv, H});
    n.emplace_back(p + "self_attn.v_proj.weight", Shape{kv, H});
    n.emplace_back(p + "self_attn.o_proj.weight", Shape{H, q});
    n.emplace_back(p + "block_sparse_moe.gate.weight", Shape{c.num_local_experts, H});
    for (int64_t e = 0; e < c.num_local_experts; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      n.emplace_back(x + "w1.weight", Shape{I, H});
      n.emplace_back(x + "w2.weight", Shape{H, I});
      n.emplace_back(x + "w3.weight", Shape{I, H});
    }
    n.emplace_back(p + "input_layernorm.weight", Shape{H});
    n.emplace_back(p + "post_attention_layernorm.weight", Shape{H});
  }
  n.emplace_back("model.norm.weight", Shape{H});
  if (!c.tie_word_embeddings) n.emplace_back("lm_head.weight", Shape{c.vocab_size, H});
  return n;
}




using Vec = std::vector<double>;

// y [N, out] = x [N, in] @ w[out, in]^T
Vec matvec(const Vec& x, int64_t N, const Vec& w, int64_t in, int64_t out) {
  Vec y(static_cast<size_t>(N * out), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[static_cast<size_t>(n * in + i)] * w[static_cast<size_t>(o * in + i)];
      y[static_cast<size_t>(n * out + o)] = s;
    }
  return y;
}

// Top-k of one row of probabilities: indices, largest first (ties: lower index first).
std::vector<int64_t> topk_row(const double* p, int64_t E, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(E));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

Vec softmax_rows(const Vec& x, int64_t N, int64_t E) {
  Vec p(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, x[static_cast<size_t>(n * E + e)]);
    for (int64_t e = 0; e < E; ++e) z += (p[static_cast<size_t>(n * E + e)] = std::exp(x[static_cast<size_t>(n * E + e)] - mx));
    for (int64_t e = 0; e < E; ++e) p[static_cast<size_t>(n * E + e)] /= z;
  }
  return p;
}

}  // namespace

TEST_CASE("mixtral: parameter names and shapes are Hugging Face's", "[cpu]") {
  ModelConfig c = tiny_mixtral();
  c.tie_word_embeddings = GENERATE(false, true);
  auto m = build_causal_lm(c);
  Names got;
  for (auto& [n, t] : m->named_parameters()) got.emplace_back(n, t.shape());
  REQUIRE(got == hf_mixtral_names(c));
  int64_t count = 0;
  for (auto& t : m->parameters()) count += t.numel();
  REQUIRE(count == c.num_parameters());
}

TEST_CASE("mixtral: sparse MoE block equals a naive loop reference in f64", "[cpu]") {
  ModelConfig c = tiny_mixtral();
  c.num_experts_per_tok = GENERATE(1, 2, 3);
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts, K = c.num_experts_per_tok;
  auto block = std::make_shared<MixtralSparseMoeBlock>(c, DType::kF64);
  randomize(*block, 21, 1.0);
  Tensor x = testing::rand(Shape{2, 5, H}, DType::kF64, 5);
  auto out = (*block)(std::vector<Tensor>{x});
  REQUIRE(out.size() == 2);
  REQUIRE(out[0].shape() == Shape{2, 5, H});
  REQUIRE(out[1].shape() == Shape{10, E});

  const int64_t N = 10;
  Vec xv = x.to_vector<double>();
  Vec logits = matvec(xv, N, block->get_parameter("gate.weight").to_vector<double>(), H, E);
  REQUIRE_CLOSE(out[1], logits, 0, 1e-12);
  Vec probs = softmax_rows(logits, N, E);
  Vec y(static_cast<size_t>(N * H), 0.0);
  std::vector<int> used(static_cast<size_t>(E), 0);
  for (int64_t n = 0; n < N; ++n) {
    auto sel = topk_row(&probs[static_cast<size_t>(n * E)], E, K);
    double z = 0;
    for (auto e : sel) z += probs[static_cast<size_t>(n * E + e)];
    Vec xn(xv.begin() + n * H, xv.begin() + (n + 1) * H);
    for (auto e : sel) {
      used[static_cast<size_t>(e)] = 1;
      const std::string p = "experts." + std::to_string(e) + ".";
      Vec g = matvec(xn, 1, block->get_parameter(p + "w1.weight").to_vector<double>(), H, I);
      Vec u = matvec(xn, 1, block->get_parameter(p + "w3.weight").to_vector<double>(), H, I);
      for (int64_t i = 0; i < I; ++i) g[static_cast<size_t>(i)] = g[static_cast<size_t>(i)] / (1 + std::exp(-g[static_cast<size_t>(i)])) * u[static_cast<size_t>(i)];
      Vec d = matvec(g, 1, block->get_parameter(p + "w2.weight").to_vector<double>(), I, H);
      const double w = probs[static_cast<size_t>(n * E + e)] / z;
      for (int64_t h = 0; h < H; ++h) y[static_cast<size_t>(n * H + h)] += w * d[static_cast<size_t>(h)];
    }
  }
  REQUIRE(std::accumulate(used.begin(), used.end(), 0) >= 2);  // routing is not degenerate
  REQUIRE_CLOSE(out[0].reshape(Shape{N, H}), y, 0, 1e-10);
}

TEST_CASE("mixtral: the capacity factor drops rows in training only", "[cpu]") {
  // In eval mode every routed row is computed (HF's Mixtral has no capacity), so a generation step
  // over one cached token and a full forward agree.
  ModelConfig c = tiny_mixtral();
  auto block = std::make_shared<MixtralSparseMoeBlock>(c, DType::kF64);
  randomize(*block, 21, 1.0);
  block->set_capacity_factor(0.25);  // C = ceil(0.25 * N * k / E): most rows over it
  Tensor x = testing::rand(Shape{2, 5, c.hidden_size}, DType::kF64, 5);
  Tensor train_out = (*block)(std::vector<Tensor>{x})[0];
  REQUIRE(block->dropped_rows() > 0);
  block->eval();
  Tensor eval_out = (*block)(std::vector<Tensor>{x})[0];
  REQUIRE(block->dropped_rows() == 0);
  block->set_capacity_factor(0);
  REQUIRE_CLOSE(eval_out, (*block)(std::vector<Tensor>{x})[0], 0, 0);  // the dropless output
  CHECK(max(abs(sub(train_out, eval_out))).item() > 0);  // training dropped rows
}

TEST_CASE("mixtral: a capacity factor however large is dropless, not an overflow", "[cpu]") {
  REQUIRE(expert_capacity(0.5, 10, 2, 4) == 3);   // ceil(0.5 * 20 / 4)
  REQUIRE(expert_capacity(1e-9, 10, 2, 4) == 1);  // at least one row
  REQUIRE(expert_capacity(8, 10, 2, 4) == 20);    // 40 capped at every row
  // The factor as written: 1.1 x 50 / 5 is 11 rows (the product of the doubles is 11.000000000000002).
  REQUIRE(expert_capacity(1.1, 50, 1, 5) == 11);
  REQUIRE(expert_capacity(1.1, 25, 2, 5) == 11);
  REQUIRE(expert_capacity(1.1, 51, 1, 5) == 12);  // 11.22
  for (double f : {1e18, 1e19, 1e30, 1e300}) REQUIRE(expert_capacity(f, 10, 2, 4) == 20);
  // Training with a factor of 1e19 drops nothing: the dropless output (a capacity of 1 until
  // 2026-12-07, from a conversion that overflowed).
  ModelConfig c = tiny_mixtral();
  auto block = std::make_shared<MixtralSparseMoeBlock>(c, DType::kF64);
  randomize(*block, 21, 1.0);
  Tensor x = testing::rand(Shape{2, 5, c.hidden_size}, DType::kF64, 5);
  block->set_capacity_factor(1e19);
  Tensor huge = (*block)(std::vector<Tensor>{x})[0];
  REQUIRE(block->dropped_rows() == 0);
  block->set_capacity_factor(0);
  REQUIRE_CLOSE(huge, (*block)(std::vector<Tensor>{x})[0], 0, 0);
}

TEST_CASE("mixtral: load-balancing loss equals a naive computation", "[cpu]") {
  const int64_t E = 4, K = 2;
  std::vector<Tensor> rl = {testing::rand(Shape{6, E}, DType::kF64, 1, -2, 2),
                            testing::rand(Shape{6, E}, DType::kF64, 2, -2, 2)};
  Tensor got = load_balancing_loss(rl, E, K);
  // Concatenate, softmax, top-k one-hot: tokens_per_expert [K, E] = mean over tokens of the
  // mask, router_prob_per_expert [E] = mean probability; loss = E * sum(tpe * rppe).
  Vec all;
  for (auto& t : rl)
    for (double v : t.to_vector<double>()) all.push_back(v);
  const int64_t N = 12;
  Vec probs = softmax_rows(all, N, E);
  Vec tpe(static_cast<size_t>(K * E), 0.0), rppe(static_cast<size_t>(E), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    auto sel = topk_row(&probs[static_cast<size_t>(n * E)], E, K);
    for (int64_t j = 0; j < K; ++j) tpe[static_cast<size_t>(j * E + sel[static_cast<size_t>(j)])] += 1.0 / N;
    for (int64_t e = 0; e < E; ++e) rppe[static_cast<size_t>(e)] += probs[static_cast<size_t>(n * E + e)] / N;
  }
  double expect = 0;
  for (int64_t j = 0; j < K; ++j)
    for (int64_t e = 0; e < E; ++e) expect += tpe[static_cast<size_t>(j * E + e)] * rppe[static_cast<size_t>(e)];
  expect *= E;
  REQUIRE(got.dtype() == DType::kF64);
  REQUIRE(got.item() == Approx(expect).epsilon(1e-13));
  // Uniform routing probabilities give exactly top_k (the balanced optimum).
  REQUIRE(load_balancing_loss({zeros(Shape{8, E})}, E, K).item() == Approx(2.0));
  REQUIRE(load_balancing_loss({zeros(Shape{8, E})}, E, K).dtype() == DType::kF32);

  REQUIRE_THROWS_WITH(load_balancing_loss({zeros(Shape{8, 3})}, E, K), Contains("num_experts = 4"));
  REQUIRE_THROWS_WITH(load_balancing_loss({}, E, K), Contains("no router logits"));
  REQUIRE_THROWS_WITH(load_balancing_loss({zeros(Shape{8, E})}, E, 5), Contains("top_k 5"));
}

TEST_CASE("mixtral: loss = cross entropy + coef * aux loss of the router logits", "[cpu]") {
  ModelConfig c = tiny_mixtral();
  c.output_router_logits = true;
  auto m = build_causal_lm(c, DType::kF64);
  randomize(*m, 3);
  Tensor ids = ids_tensor(kIds, 2, 5), tg = ids_tensor(kTargets, 2, 5);
  auto out = m->forward({ids});
  REQUIRE(out.size() == 3);  // logits + one router-logits tensor per layer
  REQUIRE(out[0].shape() == Shape{2, 5, 11});
  REQUIRE(out[1].shape() == Shape{10, 4});
  double ce = cross_entropy(out[0], tg).item();
  double aux = load_balancing_loss({out[1], out[2]}, 4, 2).item();
  REQUIRE(m->loss(ids, tg).item() == Approx(ce + 0.1 * aux).epsilon(1e-13));
  c.output_router_logits = false;
  auto m2 = build_causal_lm(c, DType::kF64);
  m2->load_state_dict(m->state_dict());
  REQUIRE(m2->loss(ids, tg).item() == Approx(ce).epsilon(1e-13));
}

TEST_CASE("mixtral: router z-loss equals a naive computation and joins the loss", "[cpu]") {
  std::vector<Tensor> rl = {testing::rand(Shape{6, 4}, DType::kF64, 1, -3, 3),
                            testing::rand(Shape{5, 4}, DType::kF64, 2, -3, 3)};
  double expect = 0;
  for (auto& t : rl) {
    Vec v = t.to_vector<double>();
    for (size_t n = 0; n < v.size() / 4; ++n) {
      double s = 0;
      for (size_t e = 0; e < 4; ++e) s += std::exp(v[n * 4 + e]);
      expect += std::log(s) * std::log(s) / 11.0;
    }
  }
  REQUIRE(router_z_loss(rl).dtype() == DType::kF64);
  REQUIRE(router_z_loss(rl).item() == Approx(expect).epsilon(1e-13));
  // Large logits stay finite (logsumexp without overflow), in f32 for f32 logits.
  Tensor big = full(Shape{3, 4}, 500.0, DType::kF32);
  REQUIRE(router_z_loss({big}).dtype() == DType::kF32);
  REQUIRE(router_z_loss({big}).item() == Approx(std::pow(500 + std::log(4.0), 2)).epsilon(1e-6));
  REQUIRE_THROWS_WITH(router_z_loss({}), Contains("no router logits"));

  ModelConfig c = tiny_mixtral();
  c.router_z_loss_coef = 0.01;
  auto m = build_causal_lm(c, DType::kF64);
  randomize(*m, 3);
  Tensor ids = ids_tensor(kIds, 2, 5), tg = ids_tensor(kTargets, 2, 5);
  auto out = m->forward({ids});
  const double ce = cross_entropy(out[0], tg).item(), z = router_z_loss({out[1], out[2]}).item();
  REQUIRE(m->loss(ids, tg).item() == Approx(ce + 0.01 * z).epsilon(1e-13));
}

TEST_CASE("mixtral: router losses summed stage by stage (a pipeline) equal one device's, bit for bit", "[cpu]") {
  ModelConfig c = tiny_mixtral();
  c.output_router_logits = true;
  c.router_aux_loss_coef = 0.02;
  c.router_z_loss_coef = 0.001;
  auto m = build_causal_lm(c, DType::kF32);
  randomize(*m, 5);
  Tensor ids = ids_tensor(kIds, 2, 5), tg = ids_tensor(kTargets, 2, 5);
  Tensor whole = m->loss(ids, tg);
  whole.backward();
  std::vector<std::pair<std::string, Tensor>> want;
  for (const auto& [name, p] : m->named_parameters()) want.emplace_back(name, p.grad().clone());
  m->zero_grad();

  // Two stages: the embedding and layer 0, then layer 1, the norm and lm_head. What the first
  // sends (its hidden state and router sums) arrives as leaves, as pipeline_run.cpp receives it.
  const int64_t units = static_cast<int64_t>(m->pipeline_units().size());
  m->set_pipeline_span(0, 2);
  std::vector<Tensor> o0 = m->forward({ids});
  REQUIRE(o0.size() == 2);  // the hidden state, then layer 0's router logits
  std::vector<Tensor> sent{o0[0]};
  for (const Tensor& t : router_sums_tensors(causal_lm_router_sums(c, {}, o0), Device::cpu())) sent.push_back(t);
  REQUIRE(sent.size() == 5);  // hidden, [k, E], [E], z, the count
  std::vector<Tensor> leaves;
  for (const Tensor& t : sent) {
    Tensor leaf = t.detach().clone();
    if (t.requires_grad()) leaf.requires_grad_(true);
    leaves.push_back(leaf);
  }
  REQUIRE(!leaves[1].requires_grad());  // the expert counts need no gradient
  m->set_pipeline_span(2, units);
  std::vector<Tensor> o1 = m->forward({leaves[0]});
  const RouterSums sums = causal_lm_router_sums(c, router_sums_of({leaves.begin() + 1, leaves.end()}), o1);
  REQUIRE(sums.tokens == 20);  // 10 tokens x 2 layers
  Tensor staged = causal_lm_loss(c, o1[0], tg, sums);
  REQUIRE(staged.item() == whole.item());
  staged.backward();
  std::vector<Tensor> roots{sent[0]}, grads{leaves[0].grad()};
  for (size_t i = 1; i < sent.size(); ++i)
    if (sent[i].requires_grad()) {
      roots.push_back(sent[i]);
      grads.push_back(leaves[i].grad());
    }
  REQUIRE(roots.size() == 3);  // the hidden state, the probability sums, z
  backward(roots, grads);
  for (const auto& [name, g] : want) {
    INFO(name);
    REQUIRE_CLOSE(m->get_parameter(name).grad(), g, 0, 0);
  }
  REQUIRE_THROWS_WITH(router_sums_of({zeros(Shape{2})}), Contains("row count last"));
}

TEST_CASE("mixtral: loss gradients match finite differences (f64)", "[cpu]") {
  ModelConfig c = tiny_mixtral();
  c.output_router_logits = GENERATE(false, true);
  auto m = build_causal_lm(c, DType::kF64);
  randomize(*m, 17);
  Tensor ids = ids_tensor(kIds, 2, 5), tg = ids_tensor(kTargets, 2, 5);
  std::vector<Tensor> ps;
  for (const char* n : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                        "model.layers.0.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.gate.weight",
                        "model.layers.0.block_sparse_moe.experts.1.w1.weight",
                        "model.layers.1.block_sparse_moe.experts.2.w2.weight",
                        "model.layers.0.post_attention_layernorm.weight", "model.norm.weight"})
    ps.push_back(m->get_parameter(n));
  REQUIRE_GRADCHECK([&](const std::vector<Tensor>&) { return m->loss(ids, tg); }, ps, 1e-6, 1e-7, 1e-5);
  // The router learns from the language-model loss alone, through the routing weights.
  REQUIRE(ps[2].grad().defined());
  double g = 0;
  for (double v : ps[2].grad().to_vector<double>()) g += std::abs(v);
  REQUIRE(g > 0);
}

TEST_CASE("mixtral: meta construction + materialize equals direct construction bit for bit", "[cpu]") {
  ModelConfig c = tiny_mixtral();
  manual_seed(77);
  auto direct = build_causal_lm(c);
  manual_seed(77);
  std::shared_ptr<CausalLM> meta;
  {
    InitDeviceGuard g(Device::meta());
    meta = build_causal_lm(c);
  }
  meta->materialize();
  require_same_model(*direct, *meta);
}

TEST_CASE("mixtral: f32 and bf16 forwards are close to f64", "[cpu]") {
  ModelConfig c = tiny_mixtral();
  auto m64 = build_causal_lm(c, DType::kF64);
  randomize(*m64, 8, 0.3);
  Tensor ids = ids_tensor(kIds, 2, 5);
  Tensor ref = m64->forward({ids})[0];
  auto m32 = build_causal_lm(c, DType::kF32);
  m32->load_state_dict(m64->state_dict());
  REQUIRE_CLOSE(m32->forward({ids})[0], ref, 1e-4, 1e-4);
  auto m16 = build_causal_lm(c, DType::kBF16);
  m16->load_state_dict(m64->state_dict());
  auto o16 = m16->forward({ids});
  REQUIRE(o16[0].dtype() == DType::kF32);
  REQUIRE(o16[1].dtype() == DType::kBF16);
  REQUIRE_CLOSE(o16[0], ref, 0.05, 0.1);
}

TEST_CASE("mixtral: invalid expert configs throw", "[cpu]") {
  ModelConfig c = tiny_mixtral();
  c.num_experts_per_tok = 5;
  REQUIRE_THROWS_WITH(build_causal_lm(c), Contains("num_experts_per_tok"));
  auto block = std::make_shared<MixtralSparseMoeBlock>(tiny_mixtral(), DType::kF32);
  REQUIRE_THROWS_WITH((*block)(zeros(Shape{3, 8})), Contains("[B, T, H]"));
}
