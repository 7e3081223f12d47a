// Built-in model shapes and config validation.
#include "models/config.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "runtime/error.h"

namespace mt {

namespace {

// "1048576 (2^20)" for a power of two, else the number.
std::string bound_text(int64_t v) {
  if (v > 0 && (v & (v - 1)) == 0) return fmt::format("{} (2^{})", v, std::countr_zero(static_cast<uint64_t>(v)));
  return fmt::format("{}", v);
}

// Checks one field at a time, each error naming the source and the field as config.json spells it.
struct FieldChecker {
  const std::string& source;

  void size(const char* field, int64_t v, int64_t lo, int64_t hi) const {
    MT_CHECK(v >= lo, "{}: {} = {} must be at least {}", source, field, v, lo);
    MT_CHECK(v <= hi, "{}: {} = {} is too large (at most {}; see docs/models.md, \"Bounds\")", source, field, v,
             bound_text(hi));
  }
  void positive(const char* field, double v) const {
    MT_CHECK(v > 0 && std::isfinite(v), "{}: {} = {} must be positive and finite", source, field, v);
  }
  void non_negative(const char* field, double v) const {
    MT_CHECK(v >= 0 && std::isfinite(v), "{}: {} = {} must be >= 0 and finite", source, field, v);
  }
  void probability(const char* field, double v) const {
    MT_CHECK(v >= 0 && v < 1, "{}: {} = {} is a dropout probability and must be in [0, 1)", source, field, v);
  }
};

// The parameter count in T: double for the overflow-free bound check, int64_t for the exact count
// of a validated config.
template <class T>
T count_parameters(const ModelConfig& c) {
  const T h = static_cast<T>(c.hidden_size), hd = static_cast<T>(c.resolved_head_dim());
  const T inter = static_cast<T>(c.intermediate_size), layers = static_cast<T>(c.num_hidden_layers);
  const T q = static_cast<T>(c.num_attention_heads) * hd, kv = static_cast<T>(c.num_key_value_heads) * hd;
  T attn = h * q + 2 * h * kv + q * h;
  if (c.attention_bias) attn += q + 2 * kv + h;
  T mlp = 3 * h * inter + (c.mlp_bias ? 2 * inter + h : 0);
  if (c.is_moe()) {
    const T experts = static_cast<T>(c.num_local_experts);
    mlp = experts * 3 * h * inter + h * experts;
  }
  const T layer = attn + mlp + 2 * h;
  const T emb = static_cast<T>(c.vocab_size) * h;
  return emb + (c.tie_word_embeddings ? 0 : emb) + layers * layer + h;
}

}  // namespace

void ModelConfig::validate(const std::string& source) const {
  const FieldChecker f{source};
  MT_CHECK(model_type == "llama" || model_type == "mixtral",
           "{}: model_type '{}' is not supported (llama or mixtral)", source, model_type);
  // Sizes first, each against its bound, so that no product below can overflow.
  f.size("vocab_size", vocab_size, 1, kMaxVocabSize);
  f.size("hidden_size", hidden_size, 1, kMaxWidth);
  f.size("intermediate_size", intermediate_size, 1, kMaxWidth);
  f.size("num_hidden_layers", num_hidden_layers, 1, kMaxLayers);
  f.size("num_attention_heads", num_attention_heads, 1, kMaxHeads);
  f.size("num_key_value_heads", num_key_value_heads, 1, kMaxHeads);
  f.size("head_dim", head_dim, 0, kMaxWidth);
  f.size("max_position_embeddings", max_position_embeddings, 1, kMaxPositions);
  MT_CHECK(num_attention_heads % num_key_value_heads == 0,
           "{}: num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})", source,
           num_attention_heads, num_key_value_heads);
  MT_CHECK(head_dim > 0 || hidden_size % num_attention_heads == 0,
           "{}: hidden_size ({}) is not divisible by num_attention_heads ({}) and head_dim is not set", source,
           hidden_size, num_attention_heads);
  MT_CHECK(resolved_head_dim() % 2 == 0, "{}: head_dim {} must be even for rotary embeddings", source,
           resolved_head_dim());
  f.positive("rms_norm_eps", rms_norm_eps);
  // The rotary tables are computed in float32, as transformers does.
  MT_CHECK(rope_theta > 0 && std::isfinite(static_cast<float>(rope_theta)),
           "{}: rope_theta = {} must be positive and finite in float32 (at most {:g})", source, rope_theta,
           static_cast<double>(std::numeric_limits<float>::max()));
  if (rope_scaling.type != RopeScaling::Type::kNone)
    MT_CHECK(rope_scaling.factor >= 1 && std::isfinite(rope_scaling.factor),
             "{}: rope_scaling.factor = {} must be >= 1 and finite", source, rope_scaling.factor);
  if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    f.positive("rope_scaling.low_freq_factor", rope_scaling.low_freq_factor);
    f.positive("rope_scaling.high_freq_factor", rope_scaling.high_freq_factor);
    MT_CHECK(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor,
             "{}: rope_scaling.high_freq_factor ({}) must be greater than rope_scaling.low_freq_factor ({})", source,
             rope_scaling.high_freq_factor, rope_scaling.low_freq_factor);
    f.size("rope_scaling.original_max_position_embeddings", rope_scaling.original_max_position_embeddings, 1,
           kMaxPositions);
  }
  f.non_negative("initializer_range", initializer_range);
  MT_CHECK(bos_token_id >= -1, "{}: bos_token_id = {} must be a token id or null", source, bos_token_id);
  MT_CHECK(eos_token_id >= -1, "{}: eos_token_id = {} must be a token id or null", source, eos_token_id);
  if (is_moe()) {
    f.size("num_local_experts", num_local_experts, 1, kMaxExperts);
    MT_CHECK(num_experts_per_tok > 0 && num_experts_per_tok <= num_local_experts,
             "{}: mixtral needs 0 < num_experts_per_tok ({}) <= num_local_experts ({})", source,
             num_experts_per_tok, num_local_experts);
    f.non_negative("router_aux_loss_coef", router_aux_loss_coef);
    f.non_negative("mt_router_z_loss_coef", router_z_loss_coef);
    f.non_negative("mt_moe_capacity_factor", moe_capacity_factor);
    MT_CHECK(!attention_bias && !mlp_bias,
             "{}: mixtral has no biases (attention_bias {}, mlp_bias {}): Hugging Face's Mixtral builds its attention "
             "and experts without them", source, attention_bias, mlp_bias);
  }
  f.probability("attention_dropout", attention_dropout);
  f.probability("mt_residual_dropout", residual_dropout);
  const double params = num_parameters_approx();
  MT_CHECK(params <= static_cast<double>(kMaxParameters),
           "{}: the model would have {:.3g} parameters, more than the {} meshtrain accepts (vocab_size {}, "
           "hidden_size {}, intermediate_size {}, num_hidden_layers {}{}; see docs/models.md, \"Bounds\")",
           source, params, bound_text(kMaxParameters), vocab_size, hidden_size, intermediate_size,
           num_hidden_layers, is_moe() ? fmt::format(", num_local_experts {}", num_local_experts) : "");
}

int64_t ModelConfig::num_parameters() const {
  MT_ASSERT(num_parameters_approx() <= static_cast<double>(kMaxParameters), "num_parameters of an unvalidated config");
  return count_parameters<int64_t>(*this);
}

double ModelConfig::num_parameters_approx() const { return count_parameters<double>(*this); }

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
