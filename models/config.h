// Model configuration: the fields of a Hugging Face config.json for model_type "llama" and
// "mixtral" that change the computation, plus meshtrain's dropout switches. Built-in names give
// the shapes of well-known models; hf_config.h reads and writes config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

// Hugging Face rope_scaling. kLlama3 is Llama 3.1's frequency-band rescaling.
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// Upper bounds on the sizes a config may give (docs/models.md, "Bounds"). Each is far above every
// published model of these families, and together they keep every size product below 2^63, so
// size arithmetic cannot overflow once validate() has passed. kMaxParameters bounds the whole model
// (2^40, 1.1e12 parameters: 4 TiB in f32) before anything is allocated.
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;           // 16,777,216 (token ids are int32)
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;               // hidden, intermediate, head_dim
inline constexpr int64_t kMaxLayers = 4096;                          // num_hidden_layers
inline constexpr int64_t kMaxHeads = int64_t{1} << 16;               // attention / key-value heads
inline constexpr int64_t kMaxPositions = int64_t{1} << 24;           // max_position_embeddings
inline constexpr int64_t kMaxExperts = 4096;                         // num_local_experts
inline constexpr int64_t kMaxParameters = int64_t{1} << 40;          // the whole model

struct ModelConfig {
  std::string model_type = "llama";  // "llama" or "mixtral"
  int64_t vocab_size = 256;
  int64_t hidden_size = 64;
  int64_t intermediate_size = 172;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  double initializer_range = 0.02;
  std::string torch_dtype = "float32";  // dtype written to / read from config.json
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  // The further ids of a list-valued eos_token_id, after the first (Llama 3.1 Instruct:
  // [128001, 128008, 128009]); generation stops at any of them. Written back as the list.
  std::vector<int64_t> extra_eos_token_ids;
  // Mixtral.
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 2;
  double router_aux_loss_coef = 0.02;
  bool output_router_logits = false;  // adds the load-balancing loss to the training loss
  double router_z_loss_coef = 0.0;     // meshtrain extension (mt_router_z_loss_coef): ST-MoE z-loss
  double moe_capacity_factor = 0.0;    // meshtrain extension (mt_moe_capacity_factor): 0 = dropless
  // meshtrain extensions (not in HF configs; default 0 = off).
  double attention_dropout = 0.0;
  double residual_dropout = 0.0;

  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  bool is_moe() const { return model_type == "mixtral"; }
  // Throws naming the field (and `source`, e.g. "config.json '/path'") when a value is out of
  // range (sizes above the k* bounds, eps/theta not positive and finite, probabilities outside
  // [0, 1), ...), the shapes do not fit together, or the parameter count exceeds kMaxParameters.
  void validate(const std::string& source = "config") const;
  // Parameter count (tied embeddings counted once). Exact for a validated config.
  int64_t num_parameters() const;
  // The same in double: finite and overflow-free for any field values (validate() bounds it).
  double num_parameters_approx() const;
};

// llama-tiny, llama-125m, llama-1b, llama-3-8b, mixtral-tiny, mixtral-8x7b.
ModelConfig builtin_config(const std::string& name);
std::vector<std::string> builtin_config_names();
bool is_builtin_config(const std::string& name);

}  // namespace mt
