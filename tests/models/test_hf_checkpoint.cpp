// Hugging Face checkpoint directories: single-file and sharded round trips, in-place overwrite
// switching layouts, atomic creation, deterministic bytes, every inconsistency between index and
// shards, and loading into / exporting from a Module with HF parameter names (tied and untied
// lm_head, dtype conversion, meta parameters, one error listing every mismatch).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "models/safetensors.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using mt::testing::TempDir;

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<uint8_t> file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<uint8_t> b(static_cast<size_t>(c.numel() * dtype_size(c.dtype())));
  if (!b.empty()) std::memcpy(b.data(), c.data_ptr(), b.size());
  return b;
}

void require_same_tensors(const std::vector<std::pair<std::string, Tensor>>& got,
                          const std::vector<std::pair<std::string, Tensor>>& want) {
  std::map<std::string, Tensor> w(want.begin(), want.end());
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : got) {
    INFO(name);
    REQUIRE(w.count(name));
    REQUIRE(t.dtype() == w[name].dtype());
    REQUIRE(t.shape() == w[name].shape());
    REQUIRE(bytes_of(t) == bytes_of(w[name]));
  }
}

// A module with nothing but parameters (forward is never called here).
struct Leaf : Module {
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return inputs; }
};

// The parameter layout of transformers' LlamaForCausalLM, without the computation: the real
// LLaMA module lives in models/llama.h.
struct TinyHfLlama : Module {
  enum class Tie { kNo, kYes };
  std::shared_ptr<Leaf> embed, lm_head;

  TinyHfLlama(const ModelConfig& c, Tie tie) {
    const int64_t h = c.hidden_size, hd = c.resolved_head_dim(), v = c.vocab_size, f = c.intermediate_size;
    auto linear = [](int64_t out, int64_t in) {
      auto l = std::make_shared<Leaf>();
      l->param_normal("weight", {out, in}, 0.0, 0.02);
      return l;
    };
    auto norm = [](int64_t n) {
      auto l = std::make_shared<Leaf>();
      l->param_uniform("weight", {n}, 0.5, 1.5);
      return l;
    };
    auto model = std::make_shared<Leaf>();
    embed = std::make_shared<Leaf>();
    embed->param_normal("weight", {v, h}, 0.0, 0.02);
    model->register_module("embed_tokens", embed);
    auto layers = std::make_shared<ModuleList>();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      auto layer = std::make_shared<Leaf>();
      auto attn = std::make_shared<Leaf>();
      attn->register_module("q_proj", linear(c.num_attention_heads * hd, h));
      attn->register_module("k_proj", linear(c.num_key_value_heads * hd, h));
      attn->register_module("v_proj", linear(c.num_key_value_heads * hd, h));
      attn->register_module("o_proj", linear(h, c.num_attention_heads * hd));
      layer->register_module("self_attn", attn);
      auto mlp = std::make_shared<Leaf>();
      mlp->register_module("gate_proj", linear(f, h));
      mlp->register_module("up_proj", linear(f, h));
      mlp->register_module("down_proj", linear(h, f));
      layer->register_module("mlp", mlp);
      layer->register_module("input_layernorm", norm(h));
      layer->register_module("post_attention_layernorm", norm(h));
      layers->push_back(layer);
    }
    model->register_module("layers", layers);
    model->register_module("norm", norm(h));
    auto rotary = std::make_shared<Leaf>();
    rotary->register_buffer("inv_freq", ones({hd / 2}));  // not in HF files (non-persistent)
    model->register_module("rotary_emb", rotary);
    register_module("model", model);
    lm_head = std::make_shared<Leaf>();
    if (tie == Tie::kYes)
      lm_head->register_parameter("weight", embed->get_parameter("weight"));
    else
      lm_head->param_normal("weight", {v, h}, 0.0, 0.02);
    register_module("lm_head", lm_head);
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return inputs; }
};

ModelConfig tiny_config(bool tied) {
  ModelConfig c = builtin_config("llama-tiny");
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.tie_word_embeddings = tied;
  return c;
}

void require_params_equal(const Module& a, const Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    REQUIRE(pa[i].first == pb[i].first);
    REQUIRE(bytes_of(pa[i].second) == bytes_of(pb[i].second));
  }
}

}  // namespace

TEST_CASE("hf checkpoint: single-file round trip into a fresh module", "[cpu]") {
  TempDir tmp;
  ModelConfig c = tiny_config(false);
  manual_seed(1);
  TinyHfLlama a(c, TinyHfLlama::Tie::kNo);
  manual_seed(2);
  TinyHfLlama b(c, TinyHfLlama::Tie::kNo);
  auto state = hf_state(a, c);
  REQUIRE(state.size() == 2 + 9 * 2 + 1);
  REQUIRE(state.front().first == "model.embed_tokens.weight");
  REQUIRE(state.back().first == "lm_head.weight");

  const std::string dir = tmp.file("ckpt");
  write_hf_checkpoint(dir, c, state);
  REQUIRE(listing(dir) == std::vector<std::string>{"config.json", "model.safetensors"});
  REQUIRE(listing(tmp.path) == std::vector<std::string>{"ckpt"});  // no "<dir>.tmp.<pid>" left

  HfCheckpoint ck = read_hf_checkpoint(dir);
  REQUIRE(ck.config.hidden_size == 16);
  REQUIRE(ck.config.torch_dtype == "float32");
  require_same_tensors(ck.tensors, state);
  load_into_module(b, ck);
  require_params_equal(a, b);
  REQUIRE(b.get_buffer("model.rotary_emb.inv_freq").to_vector<float>() == std::vector<float>(2, 1.0f));

  // Same input, same bytes; a trailing slash names the same directory.
  write_hf_checkpoint(tmp.file("again") + "/", c, state);
  for (const auto& name : listing(dir)) REQUIRE(file_bytes(fs::path(dir) / name) == file_bytes(tmp.path / "again" / name));
}

TEST_CASE("hf checkpoint: tied embeddings", "[cpu]") {
  TempDir tmp;
  ModelConfig c = tiny_config(true);
  manual_seed(3);
  TinyHfLlama a(c, TinyHfLlama::Tie::kYes);
  auto state = hf_state(a, c);
  for (const auto& [name, t] : state) REQUIRE(name != "lm_head.weight");
  const std::string dir = tmp.file("tied");
  write_hf_checkpoint(dir, c, state);
  HfCheckpoint ck = read_hf_checkpoint(dir);
  REQUIRE(ck.config.tie_word_embeddings);

  manual_seed(4);
  TinyHfLlama b(c, TinyHfLlama::Tie::kYes);
  load_into_module(b, ck);
  require_params_equal(a, b);
  REQUIRE(b.lm_head->get_parameter("weight").same(b.embed->get_parameter("weight")));

  SECTION("a file that also stores lm_head.weight loads; the embedding wins, as in transformers") {
    HfCheckpoint ck2 = ck;
    ck2.tensors.emplace_back("lm_head.weight", zeros({40, 16}));
    manual_seed(5);
    TinyHfLlama d(c, TinyHfLlama::Tie::kYes);
    load_into_module(d, ck2);
    require_params_equal(a, d);
  }
  SECTION("a module with its own lm_head parameter gets a copy of the embedding") {
    manual_seed(6);
    TinyHfLlama u(c, TinyHfLlama::Tie::kNo);
    load_into_module(u, ck);
    REQUIRE(bytes_of(u.lm_head->get_parameter("weight")) == bytes_of(a.embed->get_parameter("weight")));
    REQUIRE(!u.lm_head->get_parameter("weight").same(u.embed->get_parameter("weight")));
    // ... and exports without it when the config ties.
    for (const auto& [name, t] : hf_state(u, c)) REQUIRE(name != "lm_head.weight");
  }
  SECTION("untied config: a missing lm_head.weight is an error") {
    HfCheckpoint ck3 = ck;
    ck3.config.tie_word_embeddings = false;
    manual_seed(7);
    TinyHfLlama u(c, TinyHfLlama::Tie::kNo);
    REQUIRE_THROWS_WITH(load_into_module(u, ck3), Contains("missing from the checkpoint: lm_head.weight"));
  }
}

TEST_CASE("hf checkpoint: bf16 and f16 files convert on load; integer tensors keep their dtype", "[cpu]") {
  TempDir tmp;
  ModelConfig c = tiny_config(false);
  manual_seed(8);
  TinyHfLlama a(c, TinyHfLlama::Tie::kNo);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const std::string dir = tmp.file(dtype_name(dt));
    auto state = hf_state(a, c);
    state.emplace_back("extra.step", from_vector<int64_t>({12345}));
    write_hf_checkpoint(dir, c, state, dt);
    HfCheckpoint ck = read_hf_checkpoint(dir);
    REQUIRE(ck.config.torch_dtype == (dt == DType::kBF16 ? "bfloat16" : "float16"));
    for (const auto& [name, t] : ck.tensors) {
      INFO(name);
      REQUIRE(t.dtype() == (name == "extra.step" ? DType::kI64 : dt));
    }
    ck.tensors.pop_back();  // extra.step
    manual_seed(9);
    TinyHfLlama b(c, TinyHfLlama::Tie::kNo);
    load_into_module(b, ck);
    for (const auto& [name, p] : b.named_parameters()) {
      INFO(name);
      REQUIRE(p.dtype() == DType::kF32);
      REQUIRE(bytes_of(p) == bytes_of(a.get_parameter(name).to(dt).to(DType::kF32)));
    }
  }
  REQUIRE_THROWS_WITH(write_hf_checkpoint(tmp.file("int"), c, hf_state(a, c), DType::kI64),
                      Contains("not a floating type"));
  REQUIRE(!fs::exists(tmp.file("int")));
}

TEST_CASE("hf checkpoint: sharded write and read", "[cpu]") {
  TempDir tmp;
  ModelConfig c = tiny_config(false);
  manual_seed(10);
  TinyHfLlama a(c, TinyHfLlama::Tie::kNo);
  auto state = hf_state(a, c);
  int64_t total = 0;
  for (const auto& [n, t] : state) total += t.numel() * 4;
  const std::string dir = tmp.file("sharded");
  // 2000 bytes: the 40x16 f32 embedding (2560 bytes) is larger than a shard and gets one alone.
  write_hf_checkpoint(dir, c, state, DType::kF32, 2000);
  auto files = listing(dir);
  REQUIRE(files.front() == "config.json");
  REQUIRE(files.back() == "model.safetensors.index.json");
  const size_t nshards = files.size() - 2;
  REQUIRE(nshards > 2);
  REQUIRE(files[1] == fmt::format("model-00001-of-{:05d}.safetensors", nshards));
  REQUIRE(!fs::exists(fs::path(dir) / "model.safetensors"));

  std::ifstream in(fs::path(dir) / "model.safetensors.index.json");
  auto index = nlohmann::json::parse(in);
  REQUIRE(index["metadata"]["total_size"] == total);
  REQUIRE(index["weight_map"].size() == state.size());
  REQUIRE(index["weight_map"]["model.embed_tokens.weight"] == "model-00001-of-" + fmt::format("{:05d}", nshards) +
                                                                  ".safetensors");
  for (size_t s = 0; s < nshards; ++s) {
    auto f = read_safetensors((fs::path(dir) / files[1 + s]).string());
    int64_t bytes = 0;
    for (const auto& [n, t] : f.tensors) bytes += t.numel() * 4;
    if (f.tensors.size() > 1) REQUIRE(bytes <= 2000);
    REQUIRE(f.metadata.at("format") == "pt");
  }
  HfCheckpoint ck = read_hf_checkpoint(dir);
  require_same_tensors(ck.tensors, state);
  manual_seed(11);
  TinyHfLlama b(c, TinyHfLlama::Tie::kNo);
  load_into_module(b, ck);
  require_params_equal(a, b);

  // A max larger than the data writes one file.
  write_hf_checkpoint(tmp.file("one"), c, state, DType::kF32, total);
  REQUIRE(listing(tmp.file("one")) == std::vector<std::string>{"config.json", "model.safetensors"});
}

TEST_CASE("hf checkpoint: overwriting a directory switches layouts and keeps other files", "[cpu]") {
  TempDir tmp;
  ModelConfig c = tiny_config(false);
  manual_seed(12);
  TinyHfLlama a(c, TinyHfLlama::Tie::kNo);
  auto state = hf_state(a, c);
  const std::string dir = tmp.file("ow");
  write_hf_checkpoint(dir, c, state, DType::kF32, 1000);
  std::ofstream(fs::path(dir) / "tokenizer.json") << "{}";
  const size_t many = listing(dir).size();

  // Sharded -> single file: the index and shards go.
  write_hf_checkpoint(dir, c, state, DType::kBF16);
  REQUIRE(listing(dir) == std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"});
  REQUIRE(read_hf_checkpoint(dir).tensors.front().second.dtype() == DType::kBF16);

  // Single file -> fewer shards than before: model.safetensors goes, stale shards do not linger.
  write_hf_checkpoint(dir, c, state, DType::kF32, 1000);
  REQUIRE(listing(dir).size() == many);
  write_hf_checkpoint(dir, c, state, DType::kF32, 6000);
  auto files = listing(dir);
  REQUIRE(std::count(files.begin(), files.end(), "model.safetensors") == 0);
  REQUIRE(files.size() < many);
  for (const auto& f : files)
    if (f.rfind("model-", 0) == 0) REQUIRE(f.find(fmt::format("-of-{:05d}", files.size() - 3)) != std::string::npos);
  require_same_tensors(read_hf_checkpoint(dir).tensors, state);
  REQUIRE(listing(tmp.path) == std::vector<std::string>{"ow"});
}

TEST_CASE("hf checkpoint: unreadable directories and inconsistent shards", "[cpu]") {
  TempDir tmp;
  ModelConfig c = tiny_config(false);
  manual_seed(13);
  TinyHfLlama a(c, TinyHfLlama::Tie::kNo);
  auto state = hf_state(a, c);

  const std::string none = tmp.file("none");
  REQUIRE_THROWS_WITH(read_hf_checkpoint(none), Contains(none) && Contains("not a directory"));
  fs::create_directory(none);
  REQUIRE_THROWS_WITH(read_hf_checkpoint(none), Contains(none + "/config.json") && Contains("does not exist"));
  save_hf_config(c, none + "/config.json");
  REQUIRE_THROWS_WITH(read_hf_checkpoint(none),
                      Contains(none) && Contains("neither model.safetensors nor model.safetensors.index.json"));

  const std::string dir = tmp.file("sh");
  write_hf_checkpoint(dir, c, state, DType::kF32, 2000);
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::ifstream in(index_path);
  const auto index = nlohmann::json::parse(in);
  in.close();
  auto write_index = [&](const nlohmann::json& j) { std::ofstream(index_path) << j.dump(); };
  const std::string ip = index_path.string();
  const std::string shard1 = "model-00001-of-" + index["weight_map"]["lm_head.weight"].get<std::string>().substr(15);
  const std::string last = index["weight_map"]["lm_head.weight"];
  // A tensor sharing its shard with others (so the shard stays referenced when it is remapped).
  std::map<std::string, int> per_shard;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) ++per_shard[it.value()];
  std::string shared_name, shared_shard;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it)
    if (per_shard[it.value()] > 1 && it.value() != shard1) shared_name = it.key(), shared_shard = it.value();
  REQUIRE(!shared_name.empty());

  SECTION("a missing shard") {
    fs::remove(fs::path(dir) / last);
    REQUIRE_THROWS_WITH(read_hf_checkpoint(dir), Contains(ip) && Contains(last) && Contains("does not exist"));
  }
  SECTION("the index names a tensor its shard lacks") {
    auto j = index;
    j["weight_map"]["model.layers.9.mlp.up_proj.weight"] = last;
    write_index(j);
    REQUIRE_THROWS_WITH(read_hf_checkpoint(dir), Contains(ip) && Contains("model.layers.9.mlp.up_proj.weight") &&
                                                     Contains(last) && Contains("does not contain it"));
  }
  SECTION("the index maps a tensor to another shard") {
    auto j = index;
    j["weight_map"][shared_name] = shard1;
    write_index(j);
    REQUIRE_THROWS_WITH(read_hf_checkpoint(dir), Contains(shared_name) && Contains(shared_shard) &&
                                                     Contains("maps it to '" + shard1 + "'"));
  }
  SECTION("a shard holds a tensor the index does not list") {
    auto j = index;
    j["weight_map"].erase(shared_name);
    write_index(j);
    REQUIRE_THROWS_WITH(read_hf_checkpoint(dir), Contains(shared_shard) && Contains("'" + shared_name + "'") &&
                                                     Contains("does not list"));
  }
  SECTION("a shard the index no longer names is ignored") {
    auto j = index;
    j["weight_map"].erase("lm_head.weight");
    write_index(j);
    REQUIRE(read_hf_checkpoint(dir).tensors.size() == state.size() - 1);
  }
  SECTION("a tensor in two shards") {
    auto f = read_safetensors((fs::path(dir) / last).string());
    f.tensors.emplace_back("model.embed_tokens.weight", zeros({40, 16}));
    write_safetensors((fs::path(dir) / last).string(), f.tensors);
    REQUIRE_THROWS_WITH(read_hf_checkpoint(dir), Contains("'model.embed_tokens.weight' appears in two shards") &&
                                                     Contains(shard1) && Contains(last));
  }
  SECTION("an index that is not JSON or names a path outside the directory") {
    std::ofstream(index_path) << "{\"weight_map\": ";
    REQUIRE_THROWS_WITH(read_hf_checkpoint(dir), Contains(ip) && Contains("not valid JSON"));
    write_index({{"weight_map", {{"lm_head.weight", "../x.safetensors"}}}});
    REQUIRE_THROWS_WITH(read_hf_checkpoint(dir), Contains(ip) && Contains("not a plain file name"));
    write_index({{"metadata", {}}});
    REQUIRE_THROWS_WITH(read_hf_checkpoint(dir), Contains(ip) && Contains("weight_map"));
  }
  SECTION("a corrupt shard names the shard") {
    auto bytes = file_bytes(fs::path(dir) / last);
    bytes.back() ^= 1;
    std::ofstream(fs::path(dir) / last, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                                static_cast<std::streamsize>(bytes.size()));
    REQUIRE_THROWS_WITH(read_hf_checkpoint(dir), Contains(last) && Contains("checksum mismatch"));
  }
}

TEST_CASE("hf checkpoint: an unwritable destination leaves nothing behind", "[cpu]") {
  TempDir tmp;
  ModelConfig c = tiny_config(false);
  manual_seed(14);
  TinyHfLlama a(c, TinyHfLlama::Tie::kNo);
  auto state = hf_state(a, c);
  std::ofstream(tmp.file("plain")) << "x";
  const std::string under_file = tmp.file("plain") + "/ckpt";
  REQUIRE_THROWS_WITH(write_hf_checkpoint(under_file, c, state), Contains(under_file));
  REQUIRE_THROWS_WITH(write_hf_checkpoint(tmp.file("plain"), c, state),
                      Contains(tmp.file("plain")) && Contains("not a directory"));
  // A failure midway (a meta tensor has no data) removes the half-written temporary directory.
  auto bad = state;
  bad.emplace_back("meta.weight", empty({4}, TensorOptions().with_device(Device::meta())));
  REQUIRE_THROWS_WITH(write_hf_checkpoint(tmp.file("half"), c, bad), Contains("'meta.weight' has no data"));
  auto dup = state;
  dup.push_back(state.front());
  REQUIRE_THROWS_WITH(write_hf_checkpoint(tmp.file("half"), c, dup),
                      Contains("'model.embed_tokens.weight' is given twice"));
  REQUIRE(listing(tmp.path) == std::vector<std::string>{"plain"});
  // Nested parents are created.
  write_hf_checkpoint(tmp.file("a/b/ckpt"), c, state);
  REQUIRE(listing(tmp.path / "a" / "b") == std::vector<std::string>{"ckpt"});
}

TEST_CASE("hf checkpoint: load_into_module lists every mismatch and changes nothing", "[cpu]") {
  ModelConfig c = tiny_config(false);
  manual_seed(15);
  TinyHfLlama a(c, TinyHfLlama::Tie::kNo);
  HfCheckpoint ck{c, hf_state(a, c)};
  manual_seed(16);
  TinyHfLlama b(c, TinyHfLlama::Tie::kNo);
  std::vector<std::vector<uint8_t>> before;
  for (const auto& [n, p] : b.named_parameters()) before.push_back(bytes_of(p));

  HfCheckpoint bad = ck;
  bad.tensors.erase(bad.tensors.begin() + 1);  // model.layers.0.self_attn.q_proj.weight
  bad.tensors.emplace_back("model.layers.0.self_attn.rotary.weight", zeros({2}));
  for (auto& [n, t] : bad.tensors)
    if (n == "model.layers.1.mlp.down_proj.weight") t = zeros({24, 16});
  REQUIRE_THROWS_WITH(
      load_into_module(b, bad),
      Contains("missing from the checkpoint: model.layers.0.self_attn.q_proj.weight") &&
          Contains("not in the model: model.layers.0.self_attn.rotary.weight") &&
          Contains("'model.layers.1.mlp.down_proj.weight' is [24, 16] in the checkpoint but [16, 24] in the model"));
  size_t i = 0;
  for (const auto& [n, p] : b.named_parameters()) REQUIRE(bytes_of(p) == before[i++]);

  HfCheckpoint twice = ck;
  twice.tensors.push_back(ck.tensors.front());
  REQUIRE_THROWS_WITH(load_into_module(b, twice), Contains("'model.embed_tokens.weight' appears twice"));
}

// The errors of a checkpoint read from files name its directory and, per tensor, the shard file; the
// inv_freq buffers older transformers versions saved are skipped (computed from the config).
TEST_CASE("hf checkpoint: load errors name the directory and the shard of each tensor", "[cpu]") {
  TempDir tmp;
  ModelConfig c = tiny_config(false);
  manual_seed(18);
  TinyHfLlama a(c, TinyHfLlama::Tie::kNo);
  auto state = hf_state(a, c);
  state.emplace_back("model.layers.1.self_attn.rotary_emb.inv_freq", ones({2}));
  const std::string ok_dir = tmp.file("old_transformers");
  write_hf_checkpoint(ok_dir, c, state, DType::kF32, 2048);
  manual_seed(19);
  TinyHfLlama b(c, TinyHfLlama::Tie::kNo);
  load_into_module(b, read_hf_checkpoint(ok_dir));
  require_params_equal(a, b);

  state.emplace_back("model.layers.x.self_attn.rotary_emb.inv_freq", ones({2}));  // not a layer number
  for (auto& [n, t] : state)
    if (n == "model.layers.1.mlp.down_proj.weight") t = zeros({24, 16});
  const std::string dir = tmp.file("sharded");
  write_hf_checkpoint(dir, c, state, DType::kF32, 2048);
  HfCheckpoint ck = read_hf_checkpoint(dir);
  REQUIRE(ck.source == dir);
  const std::string down = ck.file_of.at("model.layers.1.mlp.down_proj.weight");
  const std::string extra = ck.file_of.at("model.layers.x.self_attn.rotary_emb.inv_freq");
  REQUIRE(down.rfind("model-", 0) == 0);
  try {
    load_into_module(b, ck);
    FAIL("load_into_module accepted a mismatched checkpoint");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find(fmt::format("checkpoint '{}'", dir)) != std::string::npos);
    REQUIRE(msg.find(fmt::format("not in the model: model.layers.x.self_attn.rotary_emb.inv_freq (in {})", extra)) !=
            std::string::npos);
    REQUIRE(msg.find(fmt::format("'model.layers.1.mlp.down_proj.weight' (in {}) is [24, 16]", down)) !=
            std::string::npos);
    REQUIRE(msg.find("layers.1.self_attn.rotary_emb") == std::string::npos);
  }
}

TEST_CASE("hf checkpoint: loading gives meta parameters storage", "[cpu]") {
  ModelConfig c = tiny_config(true);
  manual_seed(17);
  TinyHfLlama a(c, TinyHfLlama::Tie::kYes);
  HfCheckpoint ck{c, hf_state(a, c)};
  std::unique_ptr<TinyHfLlama> m;
  {
    InitDeviceGuard guard(Device::meta());
    m = std::make_unique<TinyHfLlama>(c, TinyHfLlama::Tie::kYes);
  }
  REQUIRE(m->get_parameter("model.norm.weight").is_meta());
  load_into_module(*m, ck);
  for (const auto& [n, p] : m->named_parameters()) REQUIRE(!p.is_meta());
  require_params_equal(a, *m);
  REQUIRE(m->lm_head->get_parameter("weight").same(m->embed->get_parameter("weight")));
}
