// `meshtrain checkpoint inspect DIR` and `meshtrain export --checkpoint DIR --hf OUT` (docs/cli.md):
// what a sharded training checkpoint holds, and a Hugging Face checkpoint assembled from it one
// tensor at a time (never the whole model in memory).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/shard_reader.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"
#include "tools/cli/train_state.h"

namespace mt::cli {

namespace fs = std::filesystem;

namespace {

// A step directory (holding index.json) or a checkpoint directory whose `latest` names one.
std::string resolve_step_dir(const std::string& dir, const char* what) {
  std::error_code ec;
  MT_CHECK(fs::is_directory(dir, ec), "{} {}: not a directory", what, dir);
  if (fs::exists(fs::path(dir) / kShardedIndexFile, ec)) return dir;
  if (fs::exists(fs::path(dir) / "latest", ec)) {
    const LoadedCheckpoint c = load_latest_checkpoint(dir, /*full=*/false);
    MT_CHECK(c.sharded, "{} {}: `latest` names {}, which is not a sharded checkpoint (no {}): it already is a "
             "Hugging Face checkpoint directory", what, dir, c.path, kShardedIndexFile);
    return c.path;
  }
  MT_FAIL("{} {}: neither a sharded step directory ({}) nor a checkpoint directory with `latest`", what, dir,
          kShardedIndexFile);
}

std::string human_bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1ull << 20));
  return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
}

int run_inspect(int argc, char** argv) {
  if (argc >= 4 && argv[3][0] == '-') Args("checkpoint inspect", {}, argc, argv, 3);  // --help: the usage, exit 0
  MT_CHECK(argc >= 4 && argv[3][0] != '-', "usage: meshtrain checkpoint inspect DIR (a step directory or a "
           "checkpoint directory with `latest`)");
  Args args("checkpoint inspect", {}, argc, argv, 4);
  const std::string step_dir = resolve_step_dir(argv[3], "checkpoint inspect:");
  ShardedCheckpointReader reader(step_dir);
  const ShardedIndex& ix = reader.index();
  std::string plan;
  {
    std::ifstream f(fs::path(step_dir) / "trainer_state.json");
    if (f.good()) {
      try {
        nlohmann::json j = nlohmann::json::parse(f);
        if (j.contains("plan") && j["plan"].is_string()) plan = j["plan"].get<std::string>();
      } catch (...) {
      }
    }
  }
  fmt::print("{}: saved by world {} on {}{}\n", step_dir, ix.world_size, ix.mesh.empty() ? "no mesh" : ix.mesh,
             plan.empty() ? "" : " (plan " + plan + ")");
  uint64_t total = 0;
  for (const auto& t : ix.tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.shape.numel() * dtype_size(t.dtype));
    total += bytes;
    fmt::print("{:9} {:60} {:>16} {:4} {:16} {:3} chunks {}\n", t.group, t.name, fmt::format("{}", t.shape),
               safetensors_dtype_name(t.dtype), t.placements.empty() ? "plain" : t.placements, t.chunks.size(),
               human_bytes(bytes));
  }
  fmt::print("{} tensors, {} in all\n", ix.tensors.size(), human_bytes(total));
  return 0;
}

}  // namespace

int run_checkpoint(int argc, char** argv) {
  const char* sub = argc > 2 ? argv[2] : "";
  if (!std::strcmp(sub, "inspect")) return run_inspect(argc, argv);
  if (!std::strcmp(sub, "--help") || !std::strcmp(sub, "help")) {
    fmt::print("usage: meshtrain checkpoint inspect DIR\n  DIR: a sharded step directory, or a checkpoint "
               "directory whose `latest` names one\n");
    return 0;
  }
  MT_FAIL("meshtrain checkpoint: unknown subcommand '{}' (subcommands: inspect)", sub);
}

int run_export(int argc, char** argv) {
  Args args("export",
            {{"checkpoint", "a sharded step directory, or a checkpoint directory with `latest`", "", false},
             {"hf", "the Hugging Face checkpoint directory to write (must not exist)", "", false},
             {"max-shard-mb", "safetensors files of at most this many MiB (0: one model.safetensors)", "0", false}},
            argc, argv, 2);
  const std::string src = args.required("checkpoint");
  std::string out = args.required("hf");
  while (out.size() > 1 && out.back() == '/') out.pop_back();  // OUT/ names OUT (its temporary is OUT.tmp.PID)
  const double max_mb = args.real("max-shard-mb");
  MT_CHECK(max_mb >= 0 && std::isfinite(max_mb), "meshtrain export: --max-shard-mb must be a number >= 0, got {}",
           args.str("max-shard-mb"));
  std::error_code ec;
  MT_CHECK(!fs::exists(out, ec), "meshtrain export: --hf {} already exists; choose a new directory", out);
  const std::string step_dir = resolve_step_dir(src, "meshtrain export: --checkpoint");
  ShardedCheckpointReader reader(step_dir);
  ModelConfig cfg = load_hf_config((fs::path(step_dir) / kHfConfigFile).string());
  std::vector<const IndexedTensor*> tensors;
  for (const auto& t : reader.index().tensors)
    if (t.group == "model" && !(cfg.tie_word_embeddings && t.name == "lm_head.weight")) tensors.push_back(&t);
  MT_CHECK(!tensors.empty(), "meshtrain export: {} holds no model tensors", reader.index_path());
  // Shards of at most max-shard-mb (a larger tensor gets one of its own), in index order.
  // At least one byte (a tiny value is not "no limit"); past 2^43 MiB every file is one shard.
  const int64_t max_bytes = max_mb == 0        ? 0
                            : max_mb >= 0x1p43 ? INT64_MAX
                                               : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(max_mb * (1 << 20))));
  std::vector<std::vector<const IndexedTensor*>> shards(1);
  int64_t cur = 0, total = 0;
  for (const IndexedTensor* t : tensors) {
    const int64_t b = t->shape.numel() * dtype_size(t->dtype);
    if (max_bytes > 0 && cur > 0 && cur + b > max_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += b;
    total += b;
  }
  remove_stale_temporaries_of(out);  // what an interrupted export left
  const fs::path tmp = out + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  MT_CHECK(!ec, "meshtrain export: cannot create {}: {}", tmp.string(), ec.message());
  try {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name = shards.size() == 1 ? std::string(kHfSingleFile)
                                                  : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1,
                                                                shards.size());
      std::vector<SafetensorsSpec> specs;
      for (const IndexedTensor* t : shards[s]) {
        specs.push_back({t->name, t->dtype, t->shape});
        weight_map[t->name] = name;
      }
      write_safetensors_streamed((tmp / name).string(), specs,
                                 [&](size_t i) { return reader.read_full(*shards[s][i]); }, {{"format", "pt"}});
    }
    cfg.torch_dtype = "float32";
    save_hf_config(cfg, (tmp / kHfConfigFile).string());
    if (shards.size() > 1) {
      const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      const std::string text = index.dump(2) + "\n";
      write_file_atomically((tmp / kHfIndexFile).string(), [&](std::ostream& o) { o << text; });
    }
    fs::rename(tmp, out, ec);
    MT_CHECK(!ec, "meshtrain export: cannot rename {} to {}: {}", tmp.string(), out, ec.message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fmt::print("exported {} tensors ({:.2f} MiB, {} file{}) from {} to {}\n", tensors.size(),
             static_cast<double>(total) / (1 << 20), shards.size(), shards.size() == 1 ? "" : "s", step_dir, out);
  return 0;
}

}  // namespace mt::cli
