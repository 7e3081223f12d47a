// Greedy and sampled decoding over CausalLM::last_logits, with or without the KV cache.
#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace mt {

void check_sampling(const SamplingOptions& o) {
  MT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
           "sampling: temperature {} must be a finite number >= 0 (0: greedy)", o.temperature);
  MT_CHECK(o.top_k >= 0, "sampling: top_k {} must be >= 0 (0: every token)", o.top_k);
  MT_CHECK(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1,
           "sampling: top_p {} must be in (0, 1] (1: every token)", o.top_p);
}

namespace {

// The row's token: greedy, or drawn with `u` in [0, 1) from the kept candidates.
int64_t pick(const double* z, int64_t V, const SamplingOptions& o, double u, int64_t row) {
  int64_t best = 0;
  for (int64_t i = 0; i < V; ++i) {
    MT_CHECK(!std::isnan(z[i]) && z[i] != INFINITY, "sampling: row {} has a {} logit at token {}", row,
             std::isnan(z[i]) ? "NaN" : "+inf", i);
    if (z[i] > z[best]) best = i;
  }
  MT_CHECK(z[best] != -INFINITY, "sampling: every logit of row {} is -inf", row);
  if (o.temperature == 0 || o.top_k == 1) return best;
  // Candidates by logit, highest first (lower id first among equal ones), top_k of them.
  std::vector<int64_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  auto higher = [&](int64_t a, int64_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), higher);
  ids.resize(static_cast<size_t>(k));
  std::vector<double> p(ids.size());
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((z[ids[i]] - z[best]) / o.temperature);
  // top_p: the fewest candidates whose probability reaches top_p (at least one).
  size_t keep = ids.size();
  if (o.top_p < 1) {
    double cum = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += p[i] / sum;
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  const double target = u * kept;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (cum > target) return ids[i];
  }
  return ids[keep - 1];  // u * kept rounded up to the sum
}

}  // namespace

std::vector<int64_t> sample_next(const Tensor& logits, const SamplingOptions& opts, Generator& gen) {
  check_sampling(opts);
  MT_CHECK(logits.dim() == 2 && is_floating(logits.dtype()) && logits.size(1) >= 1,
           "sample_next: logits must be floating [B, V], got {}", logits.desc());
  const int64_t B = logits.size(0), V = logits.size(1);
  const Tensor z = logits.to(Device::cpu()).to(DType::kF64).contiguous();
  const bool greedy = opts.temperature == 0 || opts.top_k == 1;
  std::vector<double> u(static_cast<size_t>(B), 0.0);
  if (!greedy && B > 0) u = uniform(Shape{B}, 0, 1, DType::kF64, &gen).to_vector<double>();
  std::vector<int64_t> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) out[static_cast<size_t>(b)] = pick(z.data<double>() + b * V, V, opts, u[static_cast<size_t>(b)], b);
  return out;
}

std::vector<std::vector<int64_t>> generate(CausalLM& model, const Tensor& prompt, const GenerateOptions& opts,
                                           const std::function<void(int64_t, const Tensor&)>& on_logits) {
  check_sampling(opts.sampling);
  // Generation runs on one device: its KV cache and sampling work on plain tensors.
  MT_CHECK(!prompt.is_distributed(), "generate: the prompt is a DTensor ({}); give a plain i64 [B, T] tensor",
           prompt.desc());
  for (const auto& [name, p] : model.named_parameters())
    MT_CHECK(!p.is_distributed(),
             "generate: parameter {} is a DTensor (the model was parallelized); generation runs on one device: "
             "gather the weights (full_tensors(hf_state(model, config))) into a model built without a plan and "
             "generate with that (docs/generate.md)",
             name);
  MT_CHECK(prompt.dim() == 2 && prompt.dtype() == DType::kI64 && prompt.size(0) >= 1 && prompt.size(1) >= 1,
           "generate: the prompt must be i64 [B, T] with B, T >= 1, got {}", prompt.desc());
  MT_CHECK(opts.max_new_tokens >= 1, "generate: max_new_tokens {} must be >= 1", opts.max_new_tokens);
  const int64_t B = prompt.size(0), T = prompt.size(1), V = model.config().vocab_size;
  {
    const std::vector<int64_t> ids = prompt.to(Device::cpu()).contiguous().to_vector<int64_t>();
    for (size_t i = 0; i < ids.size(); ++i)
      MT_CHECK(ids[i] >= 0 && ids[i] < V, "generate: prompt token {} (row {}, position {}) is outside the vocabulary [0, {})",
               ids[i], static_cast<int64_t>(i) / T, static_cast<int64_t>(i) % T, V);
  }
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  Generator gen(opts.seed);
  KvCache cache(T + opts.max_new_tokens - 1);
  struct Restore {
    CausalLM& m;
    bool training;
    ~Restore() {
      m.set_kv_cache(nullptr);
      if (training) m.train();
    }
  } restore{model, was_training};
  if (opts.kv_cache) model.set_kv_cache(&cache);

  std::vector<std::vector<int64_t>> out(static_cast<size_t>(B));
  std::vector<bool> ended(static_cast<size_t>(B), false);
  Tensor context = prompt;  // without the cache: the whole prefix
  Tensor feed = prompt;     // with it: what this step adds
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    const Tensor logits = model.last_logits(opts.kv_cache ? feed : context);
    if (on_logits) on_logits(step, logits);
    std::vector<int64_t> next = sample_next(logits, opts.sampling, gen);
    bool all_ended = true;
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = static_cast<size_t>(b);
      if (ended[i]) {
        next[i] = out[i].back();  // a finished row keeps feeding its last token; nothing is recorded
      } else {
        out[i].push_back(next[i]);
        ended[i] = std::find(opts.eos_token_ids.begin(), opts.eos_token_ids.end(), next[i]) != opts.eos_token_ids.end();
      }
      all_ended = all_ended && ended[i];
    }
    if (all_ended || step + 1 == opts.max_new_tokens) break;
    feed = from_vector(next, Shape{B, 1}, DType::kI64).to(prompt.device());
    if (!opts.kv_cache) context = cat({context, feed}, 1);
  }
  return out;
}

}  // namespace mt
