// Hugging Face config.json for LLaMA and Mixtral: reading one into a ModelConfig (with the
// defaults transformers applies to absent fields) and writing one that transformers loads as
// LlamaForCausalLM / MixtralForCausalLM. Errors name the file and the field. See
// docs/checkpoints.md for the field list and what is refused.
#pragma once

#include <string>

#include "models/config.h"

namespace mt {

// Reads a config.json. model_type must be "llama" or "mixtral"; vocab_size, hidden_size,
// intermediate_size, num_hidden_layers and num_attention_heads are required; other fields take
// transformers' defaults for that model_type. rope_scaling may be null, "default", "linear" or
// "llama3" (others are refused). bos/eos ids may be an int, a list (the first is taken) or null
// (-1). meshtrain's "mt_residual_dropout" is read too. The result is validated.
ModelConfig load_hf_config(const std::string& path);

// Writes config.json (atomically) with "architectures", "model_type", "hidden_act": "silu" and
// every field of ModelConfig; load_hf_config(path) gives `config` back.
void save_hf_config(const ModelConfig& config, const std::string& path);

// A built-in name (builtin_config_names()), a path to a config.json, or a directory holding one.
ModelConfig resolve_config(const std::string& name_or_path);

}  // namespace mt
