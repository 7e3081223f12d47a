// Saving and loading training checkpoints (see train_state.h for the layout).
#include "tools/cli/train_state.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/hf_checkpoint.h"
#include "models/json_io.h"
#include "models/safetensors.h"
#include "runtime/error.h"

namespace mt::cli {
namespace fs = std::filesystem;

namespace {

void write_text_atomic(const fs::path& path, const std::string& text) {
  write_file_atomically(path.string(), [&](std::ostream& out) { out << text; });
}

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), "cannot read {}", path.string());
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const ModelConfig& config, const NamedTensors& model_f32,
                            const NamedTensors& optimizer_state, const TrainState& s) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, "checkpoint directory {} cannot be created: {}", dir, ec.message());
  const std::string name = fmt::format("step-{:08d}", s.step);
  const fs::path final_path = fs::path(dir) / name;
  const fs::path tmp = fs::path(dir) / (name + ".tmp." + std::to_string(getpid()));
  fs::remove_all(tmp);
  try {
    write_hf_checkpoint(tmp.string(), config, model_f32, DType::kF32);
    write_safetensors((tmp / "optimizer.safetensors").string(), optimizer_state);
    nlohmann::json j = {{"format", "meshtrain-train-state-1"},
                        {"step", s.step},
                        {"seed", s.seed},
                        {"rng_offset", s.rng_offset},
                        {"data_position", s.data_position},
                        {"precision", s.precision},
                        {"batch", s.batch},
                        {"seq", s.seq},
                        {"accum", s.accum}};
    write_text_atomic(tmp / "trainer_state.json", j.dump(2) + "\n");
    fs::remove_all(final_path);
    fs::rename(tmp, final_path);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  write_text_atomic(fs::path(dir) / "latest", name + "\n");
  return final_path.string();
}

LoadedCheckpoint load_latest_checkpoint(const std::string& dir) {
  const fs::path latest = fs::path(dir) / "latest";
  MT_CHECK(fs::exists(latest), "--resume: no checkpoint in {} (the file {} does not exist)", dir, latest.string());
  std::string name = read_text(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  LoadedCheckpoint out;
  out.path = (fs::path(dir) / name).string();
  HfCheckpoint ck = read_hf_checkpoint(out.path);
  out.config = ck.config;
  out.model = std::move(ck.tensors);
  out.optimizer = read_safetensors((fs::path(out.path) / "optimizer.safetensors").string()).tensors;
  const fs::path state_path = fs::path(out.path) / "trainer_state.json";
  nlohmann::json j = read_json_file(state_path.string(), "trainer state");
  try {
    out.state.step = j.at("step").get<int64_t>();
    out.state.seed = j.at("seed").get<uint64_t>();
    out.state.rng_offset = j.at("rng_offset").get<uint64_t>();
    out.state.data_position = j.at("data_position").get<int64_t>();
    out.state.precision = j.at("precision").get<std::string>();
    out.state.batch = j.at("batch").get<int64_t>();
    out.state.seq = j.at("seq").get<int64_t>();
    out.state.accum = j.at("accum").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL("{}: invalid trainer state: {}", state_path.string(), e.what());
  }
  return out;
}

}  // namespace mt::cli
