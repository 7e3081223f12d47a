// Built-in model shapes and config validation.
#include "models/config.h"

#include <algorithm>

#include "runtime/error.h"

namespace mt {

void ModelConfig::validate() const {
  MT_CHECK(model_type == "llama" || model_type == "mixtral",
           "config: model_type '{}' is not supported (llama or mixtral)", model_type);
  MT_CHECK(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_hidden_layers > 0,
           "config: vocab_size, hidden_size, intermediate_size and num_hidden_layers must be positive "
           "(got {}, {}, {}, {})", vocab_size, hidden_size, intermediate_size, num_hidden_layers);
  MT_CHECK(num_attention_heads > 0 && num_key_value_heads > 0 && num_attention_heads % num_key_value_heads == 0,
           "config: num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
           num_attention_heads, num_key_value_heads);
  MT_CHECK(head_dim > 0 || hidden_size % num_attention_heads == 0,
           "config: hidden_size ({}) is not divisible by num_attention_heads ({}) and head_dim is not set",
           hidden_size, num_attention_heads);
  MT_CHECK(resolved_head_dim() % 2 == 0, "config: head_dim {} must be even for rotary embeddings",
           resolved_head_dim());
  if (is_moe())
    MT_CHECK(num_local_experts > 0 && num_experts_per_tok > 0 && num_experts_per_tok <= num_local_experts,
             "config: mixtral needs 0 < num_experts_per_tok ({}) <= num_local_experts ({})",
             num_experts_per_tok, num_local_experts);
  MT_CHECK(attention_dropout >= 0 && attention_dropout < 1 && residual_dropout >= 0 && residual_dropout < 1,
           "config: dropout probabilities must be in [0, 1), got attention {} residual {}", attention_dropout,
           residual_dropout);
}

int64_t ModelConfig::num_parameters() const {
  const int64_t h = hidden_size, hd = resolved_head_dim();
  const int64_t q = num_attention_heads * hd, kv = num_key_value_heads * hd;
  int64_t attn = h * q + 2 * h * kv + q * h;
  if (attention_bias) attn += q + 2 * kv + h;
  int64_t mlp = 3 * h * intermediate_size + (mlp_bias ? 2 * intermediate_size + h : 0);
  if (is_moe()) mlp = num_local_experts * 3 * h * intermediate_size + h * num_local_experts;
  int64_t layer = attn + mlp + 2 * h;
  int64_t emb = vocab_size * h;
  return emb + (tie_word_embeddings ? 0 : emb) + num_hidden_layers * layer + h;
}

namespace {

ModelConfig llama(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t max_pos, double theta, double eps) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = max_pos;
  c.rope_theta = theta;
  c.rms_norm_eps = eps;
  return c;
}

}  // namespace

ModelConfig builtin_config(const std::string& name) {
  ModelConfig c;
  if (name == "llama-tiny") {
    // Byte-level vocabulary, small enough to train on two CPU cores in minutes.
    c = llama(256, 128, 344, 4, 4, 2, 1024, 10000.0, 1e-5);
  } else if (name == "llama-125m") {
    c = llama(32000, 768, 2048, 12, 12, 12, 2048, 10000.0, 1e-5);
  } else if (name == "llama-1b") {  // Llama 3.2 1B shapes
    c = llama(128256, 2048, 8192, 16, 32, 8, 131072, 500000.0, 1e-5);
    c.head_dim = 64;
    c.tie_word_embeddings = true;
    c.rope_scaling = {RopeScaling::Type::kLlama3, 32.0, 1.0, 4.0, 8192};
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
  } else if (name == "llama-3-8b") {
    c = llama(128256, 4096, 14336, 32, 32, 8, 8192, 500000.0, 1e-5);
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
  } else if (name == "mixtral-tiny") {
    c = llama(256, 128, 256, 2, 4, 2, 1024, 1000000.0, 1e-5);
    c.model_type = "mixtral";
    c.num_local_experts = 4;
    c.num_experts_per_tok = 2;
  } else if (name == "mixtral-8x7b") {
    c = llama(32000, 4096, 14336, 32, 32, 8, 32768, 1000000.0, 1e-5);
    c.model_type = "mixtral";
    c.num_local_experts = 8;
    c.num_experts_per_tok = 2;
  } else {
    std::string names;
    for (auto& n : builtin_config_names()) names += (names.empty() ? "" : ", ") + n;
    MT_FAIL("unknown model config '{}' (built-in: {}; or give a path to a config.json)", name, names);
  }
  c.validate();
  return c;
}

std::vector<std::string> builtin_config_names() {
  return {"llama-tiny", "llama-125m", "llama-1b", "llama-3-8b", "mixtral-tiny", "mixtral-8x7b"};
}

bool is_builtin_config(const std::string& name) {
  auto names = builtin_config_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace mt
