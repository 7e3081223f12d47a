// ModelConfig: built-in shapes, config.json round trips (llama with llama3/linear rope scaling,
// mixtral), real-world Llama-3.2-1B and Mixtral-8x7B config.json files, transformers' defaults for
// absent fields, resolve_config, and errors that name the file and the field.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <unistd.h>

#include "models/config.h"
#include "models/hf_config.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using mt::testing::TempDir;

void require_same(const ModelConfig& a, const ModelConfig& b) {
  REQUIRE(a.model_type == b.model_type);
  REQUIRE(a.vocab_size == b.vocab_size);
  REQUIRE(a.hidden_size == b.hidden_size);
  REQUIRE(a.intermediate_size == b.intermediate_size);
  REQUIRE(a.num_hidden_layers == b.num_hidden_layers);
  REQUIRE(a.num_attention_heads == b.num_attention_heads);
  REQUIRE(a.num_key_value_heads == b.num_key_value_heads);
  REQUIRE(a.head_dim == b.head_dim);
  REQUIRE(a.max_position_embeddings == b.max_position_embeddings);
  REQUIRE(a.rms_norm_eps == b.rms_norm_eps);
  REQUIRE(a.rope_theta == b.rope_theta);
  REQUIRE(a.rope_scaling.type == b.rope_scaling.type);
  if (a.rope_scaling.type != RopeScaling::Type::kNone) REQUIRE(a.rope_scaling.factor == b.rope_scaling.factor);
  if (a.rope_scaling.type == RopeScaling::Type::kLlama3) {
    REQUIRE(a.rope_scaling.low_freq_factor == b.rope_scaling.low_freq_factor);
    REQUIRE(a.rope_scaling.high_freq_factor == b.rope_scaling.high_freq_factor);
    REQUIRE(a.rope_scaling.original_max_position_embeddings == b.rope_scaling.original_max_position_embeddings);
  }
  REQUIRE(a.tie_word_embeddings == b.tie_word_embeddings);
  REQUIRE(a.attention_bias == b.attention_bias);
  REQUIRE(a.mlp_bias == b.mlp_bias);
  REQUIRE(a.initializer_range == b.initializer_range);
  REQUIRE(a.torch_dtype == b.torch_dtype);
  REQUIRE(a.bos_token_id == b.bos_token_id);
  REQUIRE(a.eos_token_id == b.eos_token_id);
  if (a.is_moe()) {
    REQUIRE(a.num_local_experts == b.num_local_experts);
    REQUIRE(a.num_experts_per_tok == b.num_experts_per_tok);
    REQUIRE(a.router_aux_loss_coef == b.router_aux_loss_coef);
    REQUIRE(a.output_router_logits == b.output_router_logits);
  }
  REQUIRE(a.attention_dropout == b.attention_dropout);
  REQUIRE(a.residual_dropout == b.residual_dropout);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Llama-3.2-1B's config.json as published (transformers 4.45).
const char* kLlama32_1B = R"({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
)";

// Mixtral-8x7B-v0.1's config.json as published.
const char* kMixtral8x7B = R"({
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1e6,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// The same model saved by transformers 5, which writes "rope_parameters" (with rope_theta inside)
// and "dtype" instead of "rope_scaling", "rope_theta" and "torch_dtype".
const char* kLlama32_1B_v5 = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "dtype": "bfloat16",
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pad_token_id": null,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rope_type": "llama3"
  },
  "tie_word_embeddings": true,
  "transformers_version": "5.0.0",
  "use_cache": true,
  "vocab_size": 128256
})";

}  // namespace

TEST_CASE("config: built-in shapes validate and have the published parameter counts", "[cpu]") {
  for (const auto& name : builtin_config_names()) {
    INFO(name);
    REQUIRE(is_builtin_config(name));
    ModelConfig c = builtin_config(name);
    REQUIRE_NOTHROW(c.validate());
    REQUIRE(c.num_parameters() > 0);
  }
  REQUIRE(builtin_config("llama-1b").num_parameters() == 1235814400);       // Llama 3.2 1B
  REQUIRE(builtin_config("llama-3-8b").num_parameters() == 8030261248);     // Llama 3 8B
  REQUIRE(builtin_config("mixtral-8x7b").num_parameters() == 46702792704);  // Mixtral 8x7B
  REQUIRE(!is_builtin_config("gpt2"));
  REQUIRE_THROWS_WITH(builtin_config("gpt2"), Contains("unknown model config 'gpt2'") && Contains("llama-tiny"));
}

TEST_CASE("config: validate names the field at fault", "[cpu]") {
  ModelConfig c;
  c.num_key_value_heads = 3;
  REQUIRE_THROWS_WITH(c.validate(), Contains("num_key_value_heads (3)"));
  c = ModelConfig();
  c.model_type = "mixtral";
  c.num_local_experts = 1;
  c.num_experts_per_tok = 2;
  REQUIRE_THROWS_WITH(c.validate(), Contains("num_experts_per_tok"));
  c = ModelConfig();
  c.residual_dropout = 1.0;
  REQUIRE_THROWS_WITH(c.validate(), Contains("dropout"));
}

TEST_CASE("config: sizes are bounded and nonsense values refused, each error naming the field", "[cpu]") {
  const int64_t huge = int64_t{1} << 62;
  auto bad = [](auto edit, const std::string& what) {
    ModelConfig c = builtin_config("llama-tiny");
    edit(c);
    REQUIRE_THROWS_WITH(c.validate("cfg.json"), Contains("cfg.json: ") && Contains(what));
  };
  bad([&](ModelConfig& c) { c.vocab_size = huge; }, "vocab_size = 4611686018427387904 is too large (at most 16777216");
  bad([&](ModelConfig& c) { c.hidden_size = huge; }, "hidden_size = 4611686018427387904 is too large");
  bad([&](ModelConfig& c) { c.intermediate_size = huge; }, "intermediate_size = 4611686018427387904 is too large");
  bad([&](ModelConfig& c) { c.num_hidden_layers = 1'000'000'000; }, "num_hidden_layers = 1000000000 is too large");
  bad([&](ModelConfig& c) { c.num_attention_heads = huge; }, "num_attention_heads = 4611686018427387904");
  bad([&](ModelConfig& c) { c.num_key_value_heads = huge; }, "num_key_value_heads = 4611686018427387904");
  bad([&](ModelConfig& c) { c.head_dim = huge; }, "head_dim = 4611686018427387904 is too large");
  bad([&](ModelConfig& c) { c.max_position_embeddings = huge; }, "max_position_embeddings = 4611686018427387904");
  bad([&](ModelConfig& c) { c.max_position_embeddings = 0; }, "max_position_embeddings = 0 must be at least 1");
  bad([&](ModelConfig& c) { c.vocab_size = 0; }, "vocab_size = 0 must be at least 1");
  bad([&](ModelConfig& c) { c.hidden_size = -128; }, "hidden_size = -128 must be at least 1");
  bad([&](ModelConfig& c) { c.rms_norm_eps = -1e-6; }, "rms_norm_eps = -1e-06 must be positive and finite");
  bad([&](ModelConfig& c) { c.rms_norm_eps = 0; }, "rms_norm_eps = 0 must be positive");
  bad([&](ModelConfig& c) { c.rms_norm_eps = std::nan(""); }, "rms_norm_eps = nan");
  bad([&](ModelConfig& c) { c.rope_theta = 0; }, "rope_theta = 0 must be positive and finite in float32");
  bad([&](ModelConfig& c) { c.rope_theta = -1; }, "rope_theta = -1");
  bad([&](ModelConfig& c) { c.rope_theta = 1e39; }, "rope_theta = 1e+39");
  bad([&](ModelConfig& c) { c.rope_theta = std::numeric_limits<double>::infinity(); }, "rope_theta = inf");
  bad([&](ModelConfig& c) { c.initializer_range = -0.02; }, "initializer_range = -0.02 must be >= 0");
  bad([&](ModelConfig& c) { c.initializer_range = std::nan(""); }, "initializer_range = nan");
  bad([&](ModelConfig& c) { c.attention_dropout = 1.0; }, "attention_dropout = 1 is a dropout probability");
  bad([&](ModelConfig& c) { c.residual_dropout = -0.5; }, "mt_residual_dropout = -0.5");
  bad([&](ModelConfig& c) { c.bos_token_id = -2; }, "bos_token_id = -2");
  bad([&](ModelConfig& c) {
    c.rope_scaling = {RopeScaling::Type::kLinear, std::numeric_limits<double>::infinity(), 1, 4, 8192};
  }, "rope_scaling.factor = inf");
  bad([&](ModelConfig& c) { c.rope_scaling = {RopeScaling::Type::kLlama3, 8, 0, 4, 8192}; },
      "rope_scaling.low_freq_factor = 0 must be positive");
  bad([&](ModelConfig& c) { c.rope_scaling = {RopeScaling::Type::kLlama3, 8, 1, 4, 0}; },
      "rope_scaling.original_max_position_embeddings = 0");
  bad([&](ModelConfig& c) {
    c.model_type = "mixtral";
    c.num_local_experts = 1'000'000;
  }, "num_local_experts = 1000000 is too large (at most 4096");
  bad([&](ModelConfig& c) {
    c.model_type = "mixtral";
    c.num_local_experts = 4;
    c.router_aux_loss_coef = -1;
  }, "router_aux_loss_coef = -1 must be >= 0");
  // Every field within its bound, the product not: the parameter bound, computed without overflow.
  bad([&](ModelConfig& c) {
    c.vocab_size = kMaxVocabSize;
    c.hidden_size = kMaxWidth;
  }, "more than the 1099511627776 (2^40) meshtrain accepts");
  bad([&](ModelConfig& c) {
    c.model_type = "mixtral";
    c.hidden_size = c.intermediate_size = kMaxWidth;
    c.num_hidden_layers = kMaxLayers;
    c.num_local_experts = kMaxExperts;
  }, "parameters, more than");
  // The largest built-in models stay far inside the bounds.
  for (const auto& name : builtin_config_names()) REQUIRE_NOTHROW(builtin_config(name).validate());
}

TEST_CASE("config: config.json sizes beyond int64 or absurd are refused naming the file and field", "[cpu]") {
  TempDir dir;
  auto check = [&](const std::string& fields, const std::string& what) {
    const std::string p = dir.write("big.json", R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, )" + fields + "}");
    REQUIRE_THROWS_WITH(load_hf_config(p), Contains("config.json '" + p + "'") && Contains(what));
  };
  check(R"("max_position_embeddings": 4611686018427387904)",
        "max_position_embeddings = 4611686018427387904 is too large");
  check(R"("num_key_value_heads": 18446744073709551615)", "field 'num_key_value_heads' = 18446744073709551615 is too large");
  check(R"("head_dim": 1e30)", "field 'head_dim' = 1e+30 is too large");
  check(R"("head_dim": 1e9)", "head_dim = 1000000000 is too large");
  check(R"("rms_norm_eps": -1e-5)", "rms_norm_eps = -1e-05 must be positive");
  check(R"("rope_theta": 0)", "rope_theta = 0 must be positive");
  check(R"("initializer_range": -1)", "initializer_range = -1 must be >= 0");
  check(R"("max_position_embeddings": 0)", "max_position_embeddings = 0 must be at least 1");
}

TEST_CASE("config: llama config.json round trip with every field set", "[cpu]") {
  TempDir dir;
  ModelConfig c = builtin_config("llama-1b");
  c.vocab_size = 1000;
  c.hidden_size = 96;
  c.intermediate_size = 250;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1.25e-5;
  c.rope_theta = 123456.5;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 8.0, 1.5, 3.5, 2048};
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  c.mlp_bias = true;
  c.initializer_range = 0.0125;
  c.torch_dtype = "bfloat16";
  c.bos_token_id = 5;
  c.eos_token_id = 6;
  c.attention_dropout = 0.1;
  c.residual_dropout = 0.05;
  const std::string path = dir.file("config.json");
  save_hf_config(c, path);
  require_same(load_hf_config(path), c);

  auto j = read_json(path);
  REQUIRE(j["architectures"] == nlohmann::json::array({"LlamaForCausalLM"}));
  REQUIRE(j["model_type"] == "llama");
  REQUIRE(j["hidden_act"] == "silu");
  REQUIRE(j["rope_scaling"]["rope_type"] == "llama3");
  REQUIRE(j["torch_dtype"] == "bfloat16");
  REQUIRE(j["mt_residual_dropout"] == 0.05);
  REQUIRE(!j.contains("num_local_experts"));
  REQUIRE(fs::directory_iterator(dir.path) != fs::directory_iterator());
  for (const auto& e : fs::directory_iterator(dir.path)) REQUIRE(e.path().filename() == "config.json");

  SECTION("linear rope scaling, no head_dim, null token ids") {
    c.rope_scaling = {RopeScaling::Type::kLinear, 4.0, 1.0, 4.0, 8192};
    c.head_dim = 0;
    c.hidden_size = 192;
    c.bos_token_id = -1;
    save_hf_config(c, path);
    auto j2 = read_json(path);
    REQUIRE(j2["rope_scaling"]["type"] == "linear");
    REQUIRE(!j2.contains("head_dim"));
    REQUIRE(j2["bos_token_id"].is_null());
    require_same(load_hf_config(path), c);
  }
  SECTION("no rope scaling") {
    c.rope_scaling = RopeScaling();
    save_hf_config(c, path);
    REQUIRE(read_json(path)["rope_scaling"].is_null());
    require_same(load_hf_config(path), c);
  }
}

TEST_CASE("config: mixtral config.json round trip", "[cpu]") {
  TempDir dir;
  ModelConfig c = builtin_config("mixtral-tiny");
  c.num_local_experts = 6;
  c.num_experts_per_tok = 3;
  c.router_aux_loss_coef = 0.015;
  c.output_router_logits = true;
  c.torch_dtype = "float16";
  const std::string path = dir.file("config.json");
  save_hf_config(c, path);
  require_same(load_hf_config(path), c);
  auto j = read_json(path);
  REQUIRE(j["architectures"] == nlohmann::json::array({"MixtralForCausalLM"}));
  REQUIRE(j["num_local_experts"] == 6);
  REQUIRE(j["sliding_window"].is_null());
  // Built-ins round-trip too.
  for (const auto& name : builtin_config_names()) {
    INFO(name);
    ModelConfig b = builtin_config(name);
    save_hf_config(b, path);
    require_same(load_hf_config(path), b);
  }
}

TEST_CASE("config: the published Llama-3.2-1B and Mixtral-8x7B config.json files", "[cpu]") {
  TempDir dir;
  ModelConfig c = load_hf_config(dir.write("llama.json", kLlama32_1B));
  ModelConfig want = builtin_config("llama-1b");
  want.torch_dtype = "bfloat16";
  require_same(c, want);
  REQUIRE(c.rope_scaling.type == RopeScaling::Type::kLlama3);
  REQUIRE(c.rope_scaling.factor == 32.0);
  REQUIRE(c.num_parameters() == 1235814400);

  // The Instruct variant lists several eos ids: the first is eos_token_id, the others are kept too.
  std::string instruct = kLlama32_1B;
  auto pos = instruct.find("\"eos_token_id\": 128001");
  instruct.replace(pos, std::string("\"eos_token_id\": 128001").size(), "\"eos_token_id\": [128001, 128008, 128009]");
  const ModelConfig ic = load_hf_config(dir.write("instruct.json", instruct));
  REQUIRE(ic.eos_token_id == 128001);
  REQUIRE(ic.extra_eos_token_ids == std::vector<int64_t>{128008, 128009});  // generation stops at any
  save_hf_config(ic, dir.file("instruct_out.json"));  // and the list round-trips
  REQUIRE(load_hf_config(dir.file("instruct_out.json")).extra_eos_token_ids == ic.extra_eos_token_ids);

  require_same(load_hf_config(dir.write("llama_v5.json", kLlama32_1B_v5)), want);

  ModelConfig m = load_hf_config(dir.write("mixtral.json", kMixtral8x7B));
  ModelConfig mw = builtin_config("mixtral-8x7b");
  mw.torch_dtype = "bfloat16";
  mw.router_aux_loss_coef = 0.02;
  require_same(m, mw);
}

TEST_CASE("config: absent fields take transformers' defaults", "[cpu]") {
  TempDir dir;
  ModelConfig c = load_hf_config(dir.write("min.json", R"({"model_type": "llama", "vocab_size": 100,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
      "head_dim": null, "rope_scaling": null})"));
  REQUIRE(c.num_key_value_heads == 8);
  REQUIRE(c.head_dim == 0);
  REQUIRE(c.resolved_head_dim() == 8);
  REQUIRE(c.max_position_embeddings == 2048);
  REQUIRE(c.rms_norm_eps == 1e-6);
  REQUIRE(c.rope_theta == 10000.0);
  REQUIRE(c.rope_scaling.type == RopeScaling::Type::kNone);
  REQUIRE(!c.tie_word_embeddings);
  REQUIRE(c.torch_dtype == "float32");
  REQUIRE(c.bos_token_id == 1);
  REQUIRE(c.eos_token_id == 2);
  REQUIRE(c.residual_dropout == 0.0);

  ModelConfig m = load_hf_config(dir.write("minm.json", R"({"model_type": "mixtral", "vocab_size": 100,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
      "dtype": "bfloat16", "rope_scaling": {"rope_type": "default"}})"));
  REQUIRE(m.num_key_value_heads == 8);
  REQUIRE(m.num_local_experts == 8);
  REQUIRE(m.num_experts_per_tok == 2);
  REQUIRE(m.router_aux_loss_coef == 0.001);
  REQUIRE(m.rms_norm_eps == 1e-5);
  REQUIRE(m.rope_theta == 1e6);
  REQUIRE(m.max_position_embeddings == 131072);
  REQUIRE(m.torch_dtype == "bfloat16");  // transformers >= 4.56 writes "dtype"
  REQUIRE(m.rope_scaling.type == RopeScaling::Type::kNone);

  // MixtralConfig maps an explicit null to num_attention_heads (an absent key is 8), and it has no
  // bias fields: a stray attention_bias / mlp_bias is ignored, as transformers ignores it.
  ModelConfig mn = load_hf_config(dir.write("mnull.json", R"({"model_type": "mixtral", "vocab_size": 100,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": null, "attention_bias": true, "mlp_bias": true})"));
  REQUIRE(mn.num_key_value_heads == 4);
  REQUIRE(!mn.attention_bias);
  REQUIRE(!mn.mlp_bias);
  save_hf_config(mn, dir.file("mnull_out.json"));
  REQUIRE(!read_json(dir.file("mnull_out.json")).contains("attention_bias"));
  mn.attention_bias = true;  // a Mixtral with biases is no Hugging Face Mixtral
  REQUIRE_THROWS_WITH(mn.validate("m"), Contains("mixtral has no biases") && Contains("attention_bias true"));

  // transformers 5: rope_theta inside rope_parameters.
  ModelConfig v5 = load_hf_config(dir.write("v5.json", R"({"model_type": "mixtral", "vocab_size": 100,
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
      "rope_parameters": {"rope_theta": 25000.0, "rope_type": "default"}})"));
  REQUIRE(v5.rope_theta == 25000.0);
  REQUIRE(v5.rope_scaling.type == RopeScaling::Type::kNone);
}

TEST_CASE("config: bad config.json files name the file and the field", "[cpu]") {
  TempDir dir;
  const std::string base = R"("vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 8)";
  auto check = [&](const std::string& text, const std::string& what) {
    const std::string p = dir.write("bad.json", text);
    REQUIRE_THROWS_WITH(load_hf_config(p), Contains(p) && Contains(what));
  };
  const std::string missing = dir.file("missing.json");
  REQUIRE_THROWS_WITH(load_hf_config(missing), Contains(missing) && Contains("does not exist"));
  check("{\"model_type\": \"llama\",", "not valid JSON");
  check("[]", "must hold a JSON object");
  check("{" + base + "}", "field 'model_type' is missing");
  check(R"({"model_type": "gpt2", )" + base + "}", "model_type' is 'gpt2'");
  check(R"({"model_type": "llama", "vocab_size": 100, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 8})", "field 'hidden_size' is missing");
  check(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": "64", "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 8})", "field 'hidden_size' must be an integer");
  check(R"({"model_type": "llama", "tie_word_embeddings": 1, )" + base + "}",
        "field 'tie_word_embeddings' must be true or false");
  check(R"({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}, )" + base + "}",
        "rope type 'yarn'");
  check(R"({"model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}, )" + base + "}",
        "does not support");
  check(R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, )" + base + "}",
        "field 'rope_scaling.low_freq_factor' is missing");
  check(R"({"model_type": "llama", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}, )" + base + "}",
        "field 'rope_parameters' has rope type 'yarn'");
  check(R"({"model_type": "llama", "rope_scaling": {"factor": 2.0}, )" + base + "}",
        "neither 'rope_type' nor 'type'");
  check(R"({"model_type": "llama", "rope_scaling": {"type": "linear"}, )" + base + "}",
        "field 'rope_scaling.factor' is missing");
  check(R"({"model_type": "llama", "hidden_act": "gelu", )" + base + "}", "field 'hidden_act' is 'gelu'");
  check(R"({"model_type": "llama", "torch_dtype": "int8", )" + base + "}", "field 'torch_dtype' is 'int8'");
  check(R"({"model_type": "llama", "num_key_value_heads": 3, )" + base + "}", "num_key_value_heads (3)");
  check(R"({"model_type": "llama", "eos_token_id": [], )" + base + "}", "field 'eos_token_id' is an empty list");
  check(R"({"model_type": "mixtral", "sliding_window": 4096, )" + base + "}", "field 'sliding_window' is 4096");
  check(R"({"model_type": "mixtral", "num_local_experts": 1, )" + base + "}", "num_experts_per_tok");
}

TEST_CASE("config: save_hf_config refuses an invalid config or an unwritable path", "[cpu]") {
  TempDir dir;
  ModelConfig bad;
  bad.num_key_value_heads = 3;
  REQUIRE_THROWS_WITH(save_hf_config(bad, dir.file("c.json")), Contains("num_key_value_heads"));
  const std::string p = dir.file("no/such/dir/config.json");
  REQUIRE_THROWS_WITH(save_hf_config(ModelConfig(), p), Contains(p) && Contains("cannot write"));
  REQUIRE(fs::is_empty(dir.path));
}

TEST_CASE("config: resolve_config takes a built-in name, a file or a directory", "[cpu]") {
  TempDir dir;
  require_same(resolve_config("llama-tiny"), builtin_config("llama-tiny"));
  ModelConfig c = builtin_config("mixtral-tiny");
  save_hf_config(c, dir.file("config.json"));
  require_same(resolve_config(dir.file("config.json")), c);
  require_same(resolve_config(dir.path.string()), c);
  fs::create_directory(dir.path / "empty");
  REQUIRE_THROWS_WITH(resolve_config(dir.file("empty")), Contains("has no config.json"));
  REQUIRE_THROWS_WITH(resolve_config("llama-huge"),
                      Contains("'llama-huge' is neither a built-in name") && Contains("mixtral-tiny"));
}
