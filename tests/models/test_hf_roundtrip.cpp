// Import -> export through the real models: a checkpoint written from a model, loaded into a
// fresh (meta-built) model and exported again gives byte-identical files, for llama (untied and
// tied), mixtral, f32 and bf16 on disk, single-file and sharded.
#include <filesystem>
#include <unistd.h>

#include <fstream>

#include "models/hf_checkpoint.h"
#include "models/llama.h"
#include "testing.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void expect_same_dirs(const fs::path& a, const fs::path& b) {
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(a)) names.push_back(e.path().filename().string());
  INFO("directory " << a.string());
  REQUIRE(!names.empty());
  for (auto& n : names) {
    INFO("file " << n);
    REQUIRE(fs::exists(b / n));
    REQUIRE(read_bytes(a / n) == read_bytes(b / n));
  }
}

void roundtrip(const std::string& name, ModelConfig cfg, DType dtype, int64_t shard_bytes) {
  fs::path dir = fs::temp_directory_path() / ("mt_hf_rt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  manual_seed(11);
  auto model = build_causal_lm(cfg);
  write_hf_checkpoint((dir / "a").string(), cfg, hf_state(*model, cfg), dtype, shard_bytes);

  HfCheckpoint ck = read_hf_checkpoint((dir / "a").string());
  std::shared_ptr<CausalLM> fresh;
  {
    InitDeviceGuard meta(Device::meta());
    fresh = build_causal_lm(ck.config);
  }
  load_into_module(*fresh, ck);
  write_hf_checkpoint((dir / "b").string(), ck.config, hf_state(*fresh, ck.config), dtype, shard_bytes);
  expect_same_dirs(dir / "a", dir / "b");
  if (dtype == DType::kF32) {  // f32 on disk: the imported weights are the exported ones, exactly
    auto w0 = model->named_parameters(), w1 = fresh->named_parameters();
    REQUIRE(w0.size() == w1.size());
    for (size_t i = 0; i < w0.size(); ++i) REQUIRE(w0[i].second.to_vector<float>() == w1[i].second.to_vector<float>());
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("HF import -> export is byte-identical through the model", "[cpu]") {
  ModelConfig tied = builtin_config("llama-tiny");
  tied.tie_word_embeddings = true;
  roundtrip("llama_f32", builtin_config("llama-tiny"), DType::kF32, 0);
  roundtrip("llama_bf16", builtin_config("llama-tiny"), DType::kBF16, 0);
  roundtrip("llama_tied", tied, DType::kF32, 0);
  roundtrip("llama_sharded", builtin_config("llama-tiny"), DType::kF32, 200000);
  roundtrip("mixtral_f16", builtin_config("mixtral-tiny"), DType::kF16, 0);
}
