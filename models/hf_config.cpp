// config.json <-> ModelConfig. Absent optional fields take the defaults transformers' LlamaConfig
// and MixtralConfig constructors use, so a config means here what it means to transformers.
#include "models/hf_config.h"

#include "models/json_io.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/safetensors.h"
#include "runtime/error.h"

namespace mt {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

// config.json's fields: errors read "config.json '<path>': field '<key>' ...".
JsonFields config_fields(const json& doc, const std::string& path, std::string prefix = "") {
  return JsonFields(doc, fmt::format("config.json '{}'", path), std::move(prefix));
}

// bos/eos: an int, a list of ints (the first is the main one; `rest` receives the others) or null
// (-1: none).
int64_t token_id(const JsonFields& f, const char* key, int64_t dflt, std::vector<int64_t>* rest = nullptr) {
  if (!f.object().contains(key)) return dflt;
  const json& v = f.object().at(key);
  if (v.is_null()) return -1;
  if (v.is_array()) {
    if (v.empty()) f.fail(key, "is an empty list");
    for (size_t i = 1; rest && i < v.size(); ++i) rest->push_back(f.as_int(v[i], key));
    return f.as_int(v[0], key);
  }
  return f.as_int(v, key);
}

// transformers < 5 writes "rope_scaling" (null when unscaled) next to "rope_theta"; transformers
// >= 5 writes "rope_parameters" holding rope_type and rope_theta together.
const char* rope_key(const JsonFields& f) {
  if (f.has("rope_scaling")) return "rope_scaling";
  if (f.has("rope_parameters")) return "rope_parameters";
  return nullptr;
}

RopeScaling parse_rope_scaling(const JsonFields& f, const std::string& path) {
  RopeScaling rs;
  const char* key = rope_key(f);
  if (!key) return rs;
  const json& v = f.at(key);
  if (!v.is_object()) f.fail(key, fmt::format("must be null or an object, got {}", json_brief(v)));
  const std::string prefix = std::string(key) + ".";
  const JsonFields r = config_fields(v, path, prefix);
  std::string type = r.has("rope_type") ? r.get_string("rope_type", "") : r.get_string("type", "");
  if (type.empty()) f.fail(key, "has neither 'rope_type' nor 'type'");
  auto factor = [&] {
    r.require("factor");
    double x = r.get_double("factor", 1.0);
    if (!(x >= 1.0)) f.fail(key, fmt::format("factor must be >= 1, got {}", x));
    return x;
  };
  if (type == "default") return rs;
  if (type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
    rs.factor = factor();
    return rs;
  }
  if (type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    rs.factor = factor();
    for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) r.require(k);
    rs.low_freq_factor = r.get_double("low_freq_factor", 1.0);
    rs.high_freq_factor = r.get_double("high_freq_factor", 4.0);
    rs.original_max_position_embeddings = r.get_int("original_max_position_embeddings", 8192);
    if (!(rs.high_freq_factor > rs.low_freq_factor) || rs.original_max_position_embeddings <= 0)
      f.fail(key, fmt::format("llama3 needs high_freq_factor ({}) > low_freq_factor ({}) and a positive "
                                         "original_max_position_embeddings ({})",
                                         rs.high_freq_factor, rs.low_freq_factor,
                                         rs.original_max_position_embeddings));
    return rs;
  }
  f.fail(key, fmt::format("has rope type '{}', which meshtrain does not support (default, linear, llama3)",
                                     type));
}

}  // namespace

ModelConfig load_hf_config(const std::string& path) {
  std::error_code ec;
  MT_CHECK(fs::is_regular_file(path, ec), "config.json '{}': file does not exist", path);
  json doc = read_json_file(path, "config.json");
  MT_CHECK(doc.is_object(), "config.json '{}': must hold a JSON object, got {}", path, doc.type_name());
  const JsonFields f = config_fields(doc, path);

  ModelConfig c;
  f.require("model_type");
  c.model_type = f.get_string("model_type", "");
  MT_CHECK(c.model_type == "llama" || c.model_type == "mixtral",
           "config.json '{}': field 'model_type' is '{}', which meshtrain does not support (llama or mixtral)", path,
           c.model_type);
  const bool moe = c.model_type == "mixtral";

  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"})
    f.require(k);
  c.vocab_size = f.get_int("vocab_size", 0);
  c.hidden_size = f.get_int("hidden_size", 0);
  c.intermediate_size = f.get_int("intermediate_size", 0);
  c.num_hidden_layers = f.get_int("num_hidden_layers", 0);
  c.num_attention_heads = f.get_int("num_attention_heads", 0);
  // LlamaConfig defaults num_key_value_heads to num_attention_heads. MixtralConfig defaults it to 8
  // when the key is absent, but maps an explicit null to num_attention_heads (as LlamaConfig does).
  const bool kv_absent = !doc.contains("num_key_value_heads");
  c.num_key_value_heads = f.get_int("num_key_value_heads", moe && kv_absent ? 8 : c.num_attention_heads);
  c.head_dim = f.get_int("head_dim", 0);
  c.max_position_embeddings = f.get_int("max_position_embeddings", moe ? 4096 * 32 : 2048);
  c.rms_norm_eps = f.get_double("rms_norm_eps", moe ? 1e-5 : 1e-6);
  c.rope_theta = f.get_double("rope_theta", moe ? 1e6 : 10000.0);
  if (!f.has("rope_theta") && f.has("rope_parameters") && f.at("rope_parameters").is_object())
    c.rope_theta =
        config_fields(f.at("rope_parameters"), path, "rope_parameters.").get_double("rope_theta", c.rope_theta);
  c.rope_scaling = parse_rope_scaling(f, path);
  c.tie_word_embeddings = f.get_bool("tie_word_embeddings", false);
  // Hugging Face's Mixtral has no biases (MixtralConfig has neither field; its attention and
  // experts are built without): a stray key in a Mixtral config.json is ignored, as transformers does.
  if (!moe) {
    c.attention_bias = f.get_bool("attention_bias", false);
    c.mlp_bias = f.get_bool("mlp_bias", false);
  }
  c.initializer_range = f.get_double("initializer_range", 0.02);
  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  c.torch_dtype = f.has("torch_dtype") ? f.get_string("torch_dtype", "") : f.get_string("dtype", "float32");
  MT_CHECK(c.torch_dtype == "float32" || c.torch_dtype == "bfloat16" || c.torch_dtype == "float16" ||
               c.torch_dtype == "float64",
           "config.json '{}': field 'torch_dtype' is '{}' (float32, bfloat16, float16 or float64)", path,
           c.torch_dtype);
  c.bos_token_id = token_id(f, "bos_token_id", 1);
  c.eos_token_id = token_id(f, "eos_token_id", 2, &c.extra_eos_token_ids);
  c.attention_dropout = f.get_double("attention_dropout", 0.0);
  c.residual_dropout = f.get_double("mt_residual_dropout", 0.0);
  if (moe) {
    c.num_local_experts = f.get_int("num_local_experts", 8);
    c.num_experts_per_tok = f.get_int("num_experts_per_tok", 2);
    c.router_aux_loss_coef = f.get_double("router_aux_loss_coef", 0.001);
    c.output_router_logits = f.get_bool("output_router_logits", false);
    c.router_z_loss_coef = f.get_double("mt_router_z_loss_coef", 0.0);
    c.moe_capacity_factor = f.get_double("mt_moe_capacity_factor", 0.0);
    // Sliding-window attention changes the result only for sequences longer than the window.
    if (f.has("sliding_window")) {
      int64_t w = f.get_int("sliding_window", 0);
      MT_CHECK(w >= c.max_position_embeddings,
               "config.json '{}': field 'sliding_window' is {}: sliding-window attention is not supported (use null "
               "or a window >= max_position_embeddings {})", path, w, c.max_position_embeddings);
    }
  }
  const std::string act = f.get_string("hidden_act", "silu");
  MT_CHECK(act == "silu", "config.json '{}': field 'hidden_act' is '{}'; meshtrain's MLP is SwiGLU (silu)", path, act);

  c.validate(fmt::format("config.json '{}'", path));
  return c;
}

void save_hf_config(const ModelConfig& c, const std::string& path) {
  c.validate(fmt::format("save_hf_config '{}'", path));
  const bool moe = c.is_moe();
  ordered_json j;
  j["architectures"] = {moe ? "MixtralForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  if (c.head_dim > 0) j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      // "type" too: transformers before 4.43 only read that key.
      j["rope_scaling"] = {{"rope_type", "linear"}, {"type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_scaling.factor},
                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (!moe) {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
  }
  j["initializer_range"] = c.initializer_range;
  j["torch_dtype"] = c.torch_dtype;
  j["bos_token_id"] = c.bos_token_id >= 0 ? ordered_json(c.bos_token_id) : ordered_json(nullptr);
  if (c.eos_token_id >= 0 && !c.extra_eos_token_ids.empty()) {
    std::vector<int64_t> all = {c.eos_token_id};
    all.insert(all.end(), c.extra_eos_token_ids.begin(), c.extra_eos_token_ids.end());
    j["eos_token_id"] = all;
  } else {
    j["eos_token_id"] = c.eos_token_id >= 0 ? ordered_json(c.eos_token_id) : ordered_json(nullptr);
  }
  if (moe) {
    j["num_local_experts"] = c.num_local_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
    j["mt_router_z_loss_coef"] = c.router_z_loss_coef;
    j["mt_moe_capacity_factor"] = c.moe_capacity_factor;
    j["sliding_window"] = nullptr;
  }
  j["attention_dropout"] = c.attention_dropout;
  j["mt_residual_dropout"] = c.residual_dropout;
  j["use_cache"] = true;
  const std::string text = j.dump(2) + "\n";
  write_file_atomically(path, [&](std::ostream& out) { out << text; });
}

ModelConfig resolve_config(const std::string& name_or_path) {
  if (is_builtin_config(name_or_path)) return builtin_config(name_or_path);
  std::error_code ec;
  if (fs::is_directory(name_or_path, ec)) {
    fs::path p = fs::path(name_or_path) / "config.json";
    MT_CHECK(fs::is_regular_file(p, ec), "model config: directory '{}' has no config.json", name_or_path);
    return load_hf_config(p.string());
  }
  if (fs::exists(name_or_path, ec)) return load_hf_config(name_or_path);
  std::string names;
  for (const auto& n : builtin_config_names()) names += (names.empty() ? "" : ", ") + n;
  MT_FAIL("model config '{}' is neither a built-in name ({}) nor an existing config.json or directory", name_or_path,
          names);
}

}  // namespace mt
