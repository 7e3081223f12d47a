// Text generation with a CausalLM: a prompt's continuation, one token at a time, greedy or
// sampled (temperature, top-k, top-p). With the KV cache (the default) the prompt runs once and
// each later step feeds only the token just chosen; without it every step recomputes the whole
// prefix (the reference the cache is tested against). Sampling reads each step's last-position
// logits to the host as f64 and draws one uniform number per row from a Philox Generator, so a
// seed gives the same tokens on any device whose logits round the same (docs/generate.md).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/llama.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace mt {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (the highest logit, the lowest id among equal ones)
  int64_t top_k = 0;         // sample among the k highest logits only (0: all)
  double top_p = 1.0;        // among the fewest highest probabilities whose sum reaches p (1: all)
};

// Checks the options, naming the one at fault: temperature finite and >= 0, top_k >= 0,
// top_p in (0, 1].
void check_sampling(const SamplingOptions& opts);

// One token per row of logits [B, V] (floating, any device). NaN or +inf logits, or a row whose
// logits are all -inf, are errors naming the row. Draws B uniforms from `gen` unless greedy.
std::vector<int64_t> sample_next(const Tensor& logits, const SamplingOptions& opts, Generator& gen);

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  std::vector<int64_t> eos_token_ids;  // a row ends after any of these (none: never); all rows ended stops
  bool kv_cache = true;
  uint64_t seed = 1337;
};

// The tokens each row of prompt [B, T] (i64, on the model's device) continues with: at most
// max_new_tokens, the eos token included when a row ends with it. The model runs in eval mode
// without gradients (its mode is restored). With the cache, prompt length + max_new_tokens - 1
// positions are held. `on_logits(step, logits [B, V])`, when set, sees every step's logits.
std::vector<std::vector<int64_t>> generate(CausalLM& model, const Tensor& prompt, const GenerateOptions& opts,
                                           const std::function<void(int64_t, const Tensor&)>& on_logits = {});

}  // namespace mt
