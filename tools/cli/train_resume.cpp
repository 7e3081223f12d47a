// Resuming a training run (train_resume.h): the checks against the checkpoint's trainer state and
// the metrics file's tidy-up.
#include "tools/cli/train_resume.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/hf_config.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "tools/cli/trainer.h"

namespace mt::cli {

namespace {

// The flags that shape training after a resume, beyond --batch/--seq/--accum/--precision (which
// must match: check_resume_matches). --steps is recorded too, but only announced when it changes:
// raising it to continue a finished run is the usual way to train longer.
constexpr const char* kResumeSettings[] = {"lr", "min-lr", "warmup", "weight-decay", "beta2", "grad-clip",
                                           "dropout", "optimizer", "moe-aux-loss", "moe-z-loss",
                                           "moe-capacity-factor"};

// The CRC-32, after `crc`, of `points` blocks of `block` bytes of a token file at evenly spaced
// offsets, the first at its start and the last at its end (the whole file when it is no longer
// than the blocks together); its size in `size`. `pattern`: the --data value that named it (in
// errors, when it differs). points 2 with 1 MiB blocks is the fingerprint of checkpoints written
// before 2026-12-07.
uint32_t sampled_crc(const std::string& path, const std::string& pattern, int64_t points, int64_t block, uint32_t crc,
                     int64_t* size) {
  // A pipe would block this open until a writer came, with no message (and cannot be read twice).
  std::error_code ec;
  MT_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec) ||
               std::filesystem::is_directory(path, ec),
           "--data {}: is not a regular file (a pipe or device cannot be read by position; write the tokens to a "
           "file)", path);
  try {
    read_token_file_header(path);  // says what is wrong with a file that is missing or no shard
  } catch (const Error& e) {
    if (path == pattern) throw;
    MT_FAIL("--data {}: {}", pattern, e.what());
  }
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), "--data {}: cannot open it", path);
  f.seekg(0, std::ios::end);
  *size = static_cast<int64_t>(f.tellg());
  const int64_t part = std::min(*size, block);
  std::string buf(static_cast<size_t>(part), '\0');
  const int64_t span = *size - part, q = span / (points - 1), r = span % (points - 1);
  for (int64_t i = 0; i < points; ++i) {
    const int64_t at = q * i + r * i / (points - 1);  // span * i / (points - 1), without overflow
    f.seekg(at);
    f.read(buf.data(), part);
    MT_CHECK(f.good() || part == 0, "--data {}: cannot read it", path);
    crc = crc32_update(crc, buf.data(), buf.size());
  }
  return crc;
}

constexpr const char* kLegacyDataTail = " of the first and last MiB";

// One file: "N bytes, crc32 X of 32 blocks of 64 KiB over the file" (2 MiB read; the whole file up
// to 2 MiB); a same-size change between the blocks is not caught. Several (a pattern): their count,
// total size and one CRC-32 over each file's name, size and 4 blocks of 16 KiB, in order, so that a
// shard added, removed, renamed or rewritten where it is sampled is caught. The embedded corpus: its
// name. `legacy`: the single-file form of checkpoints written before 2026-12-07 (the first and last
// MiB only), to compare with what they recorded.
std::string data_fingerprint(const std::string& data, bool legacy = false) {
  if (data.empty()) return "the embedded corpus";
  const std::vector<std::string> files = data_files(data, "--data");
  int64_t size = 0;
  if (legacy) {
    const uint32_t crc = sampled_crc(files[0], data, 2, int64_t{1} << 20, 0, &size);
    return fmt::format("{} bytes, crc32 {:08x}{}", size, crc, kLegacyDataTail);
  }
  if (files.size() == 1) {
    const uint32_t crc = sampled_crc(files[0], data, 32, int64_t{1} << 16, 0, &size);
    return fmt::format("{} bytes, crc32 {:08x} of 32 blocks of 64 KiB over the file", size, crc);
  }
  uint32_t crc = 0;
  int64_t total = 0;
  for (const std::string& f : files) {
    const std::string name = std::filesystem::path(f).filename().string();
    crc = crc32_update(crc, name.data(), name.size());
    crc = sampled_crc(f, data, 4, int64_t{1} << 14, crc, &size);
    crc = crc32_update(crc, &size, sizeof(size));
    total += size;
  }
  return fmt::format("{} files, {} bytes, crc32 {:08x} of their names, sizes and 4 blocks of 16 KiB of each",
                     files.size(), total, crc);
}

// A flag value as a finite number, if it is one.
bool as_number(const std::string& s, double* v) {
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size() && std::isfinite(*v);
}

// Two flag values are the same when they are the same string or the same finite number ("3e-3"
// and "0.003").
bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  double x = 0, y = 0;
  return as_number(a, &x) && as_number(b, &y) && x == y;
}

// A recorded value as quoted in a message: cut to 80 characters (trainer_state.json is input).
std::string brief(const std::string& v) { return v.size() <= 80 ? v : v.substr(0, 77) + "..."; }

}  // namespace

bool min_lr_as_recorded(const TrainState& saved, const Args& args) {
  if (!args.has("min-lr")) return true;
  const std::string* recorded = saved.setting("min-lr");
  double given = 0, v = 0;
  return recorded && as_number(args.str("min-lr"), &given) && as_number(*recorded, &v) &&
         std::fabs(given - v) <= 1e-12 * std::max(std::fabs(given), std::fabs(v));
}

std::vector<std::pair<std::string, std::string>> resume_settings(const Args& args) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* flag : kResumeSettings)
    out.emplace_back(flag, std::string_view(flag) == "min-lr" ? fmt::format("{}", min_lr_of(args)) : args.str(flag));
  // The dtype gradients are summed in: it changes the sums only with micro-batches of a 16-bit
  // run (recorded as f32 otherwise, so that a flag with no effect is no change).
  const bool sums_16bit = args.str("precision") != "f32" && args.integer("accum") > 1;
  out.emplace_back("accum-dtype", sums_16bit ? args.str("accum-dtype") : "f32");
  out.emplace_back("steps", args.str("steps"));
  out.emplace_back("seed", args.str("seed"));
  out.emplace_back("data", data_fingerprint(args.str("data")));
  return out;
}

// --resume: the settings recorded in the checkpoint against this run's. A run that changes them
// would go on as another run than the one it resumes (another schedule, optimizer, regularization
// or data) without a word: refused unless --allow-changes, which prints each change. --seed only
// when given: the checkpoint's seed is the one used.
void check_resume_settings(const TrainState& s, const std::vector<std::pair<std::string, std::string>>& now,
                           const Args& args, const std::string& where, const ModelConfig& saved_config) {
  std::vector<std::string> changes;
  // The MoE settings: the checkpoint's config.json holds the values its run trained with (the flags
  // applied to the config), and a resumed run starts from that config, so a flag not given keeps
  // them; a flag given is a change when it differs from them. (The recorded flag strings were
  // compared until 2026-12-07: a resume without the flags was called a change that was none.)
  for (const FlagSpec& f : moe_loss_flags()) {
    const std::string& flag = f.name;
    if (args.str(flag).empty() || !saved_config.is_moe()) continue;  // apply_moe_loss_flags refuses the latter
    const double was = moe_setting(saved_config, flag);
    double v = 0;
    if (as_number(args.str(flag), &v) && v != was)
      changes.push_back(fmt::format("--{} {} (the checkpoint's: {})", flag, args.str(flag), was));
  }
  for (const auto& [key, saved] : s.settings) {
    if (key.starts_with("moe-")) continue;  // above
    // Not given: the checkpoint's seed and final rate are the ones used (train.cpp).
    if (key == "seed" && !args.has(key)) continue;
    if (key == "min-lr" && min_lr_as_recorded(s, args)) continue;
    // Another optimizer has other state (Muon's momentum, 8-bit codes): what the checkpoint holds
    // cannot become it, with --allow-changes or without.
    if (key == "optimizer" && !same_value(args.str("optimizer"), saved)) {
      const bool sharded = std::filesystem::exists(std::filesystem::path(where) / "index.json");
      MT_FAIL("--resume: --optimizer {}, but {} was trained with {}, whose state cannot become {}'s; resume with "
              "--optimizer {}, or start a new run from its weights ({}train --hf {} --optimizer {})",
              args.str("optimizer"), where, brief(saved), args.str("optimizer"), brief(saved),
              sharded ? fmt::format("meshtrain export --checkpoint {} --hf OUT, then ", where) : "",
              sharded ? "OUT" : where, args.str("optimizer"));
    }
    if (key == "steps") {
      if (!same_value(args.str("steps"), saved))
        fmt::print("--steps {}: the learning-rate schedule now spans {} steps (the checkpoint's run: {}); from "
                   "step {} on the rate follows the new one\n",
                   args.str("steps"), args.str("steps"), brief(saved), s.step + 1);
      continue;
    }
    for (const auto& [k, now_value] : now) {
      if (k != key) continue;
      // A checkpoint from before 2026-12-07 recorded the data's first and last MiB: compared so.
      const bool legacy = key == "data" && !args.str("data").empty() && saved.ends_with(kLegacyDataTail) &&
                          data_files(args.str("data"), "--data").size() == 1;
      const std::string v = legacy ? data_fingerprint(args.str("data"), true) : now_value;
      if (!same_value(v, saved))
        changes.push_back(key == "data" ? fmt::format("--data {} ({}; the checkpoint's: {})",
                                                       args.str("data").empty() ? "(none)" : args.str("data"), v,
                                                       brief(saved))
                                        : fmt::format("--{} {} (the checkpoint's: {})", key, v, brief(saved)));
    }
  }
  if (changes.empty()) return;
  MT_CHECK(args.flag("allow-changes"),
           "--resume: this run's settings differ from those {} was trained with: {}; resuming would go on as "
           "another run. Pass the checkpoint's values, or --allow-changes to resume with these",
           where, fmt::join(changes, ", "));
  fmt::print("resuming with changed settings (--allow-changes): {}\n", fmt::join(changes, ", "));
}

void check_resume_model(const ModelConfig& saved, const Args& args, const std::string& where) {
  if (!args.str("hf").empty())
    fmt::print("--hf {}: not read on --resume (the weights are {}'s)\n", args.str("hf"), where);
  if (!args.has("config")) return;
  const ModelConfig want = resolve_config(args.str("config"));
  auto shape = [](const ModelConfig& c) {
    return fmt::format("{} with {} layers, hidden {}, intermediate {}, {} heads ({} kv), vocabulary {}{}",
                       c.is_moe() ? "mixtral" : "llama", c.num_hidden_layers, c.hidden_size, c.intermediate_size,
                       c.num_attention_heads, c.num_key_value_heads, c.vocab_size,
                       c.is_moe() ? fmt::format(", {} experts", c.num_local_experts) : "");
  };
  MT_CHECK(shape(want) == shape(saved) && want.num_parameters() == saved.num_parameters(),
           "--resume: --config {} is {}, but {} holds {}; drop --config (a resumed run's model is the "
           "checkpoint's) or use another --checkpoint-dir",
           args.str("config"), shape(want), where, shape(saved));
  // The same shapes, but another computation (RoPE, the norm's eps, biases, routing): the run
  // would go on with the checkpoint's config and drop --config without a word. Refused, naming
  // the fields. Not compared: what flags set (dropout, the MoE loss coefficients and capacity:
  // resume settings) and what only initialization or generation reads.
  auto rope = [](const RopeScaling& r) {
    if (r.type == RopeScaling::Type::kNone) return std::string("none");
    return fmt::format("{} (factor {}, low {}, high {}, original {})",
                       r.type == RopeScaling::Type::kLinear ? "linear" : "llama3", r.factor, r.low_freq_factor,
                       r.high_freq_factor, r.original_max_position_embeddings);
  };
  const std::pair<const char*, std::pair<std::string, std::string>> fields[] = {
      {"head_dim", {fmt::format("{}", want.resolved_head_dim()), fmt::format("{}", saved.resolved_head_dim())}},
      {"max_position_embeddings",
       {fmt::format("{}", want.max_position_embeddings), fmt::format("{}", saved.max_position_embeddings)}},
      {"rms_norm_eps", {fmt::format("{}", want.rms_norm_eps), fmt::format("{}", saved.rms_norm_eps)}},
      {"rope_theta", {fmt::format("{}", want.rope_theta), fmt::format("{}", saved.rope_theta)}},
      {"rope_scaling", {rope(want.rope_scaling), rope(saved.rope_scaling)}},
      {"tie_word_embeddings", {fmt::format("{}", want.tie_word_embeddings), fmt::format("{}", saved.tie_word_embeddings)}},
      {"attention_bias", {fmt::format("{}", want.attention_bias), fmt::format("{}", saved.attention_bias)}},
      {"mlp_bias", {fmt::format("{}", want.mlp_bias), fmt::format("{}", saved.mlp_bias)}},
      {"num_experts_per_tok",
       {fmt::format("{}", want.is_moe() ? want.num_experts_per_tok : 0),
        fmt::format("{}", saved.is_moe() ? saved.num_experts_per_tok : 0)}},
  };
  std::vector<std::string> differ;
  for (const auto& [name, v] : fields)
    if (v.first != v.second) differ.push_back(fmt::format("{} {} (the checkpoint's: {})", name, v.first, v.second));
  MT_CHECK(differ.empty(), "--resume: --config {} differs from the model {} was trained as: {}; drop --config (a "
           "resumed run's model is the checkpoint's) or use another --checkpoint-dir",
           args.str("config"), where, fmt::join(differ, ", "));
}

// A resumed run appends to its metrics file. A run that died after its last checkpoint left lines
// of the steps it is about to train again: those (a "step" above `start`) are dropped first, so that
// every step appears once. A last line without its newline was cut by a failed write (a full
// disk): dropped too unless it is a whole JSON line, which gets its newline (the resumed run's
// first line was glued onto the cut one until 2026-11-28). The file is rewritten atomically, and
// only when something changes.
void drop_metrics_after(const std::string& path, int64_t start) {
  std::ifstream in(path);
  if (!in.good()) return;  // a new file
  std::string line, kept;
  int64_t dropped = 0;
  // The last line had no newline: it was not a whole JSON line (dropped), or it was (kept and ended,
  // unless it is a step after `start`, dropped as such).
  bool cut_dropped = false, cut_kept = false;
  while (std::getline(in, line)) {
    const bool last_without_newline = in.eof();
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (last_without_newline && !j.is_object()) {
      cut_dropped = true;
      continue;
    }
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > start) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
    cut_kept = last_without_newline;
  }
  MT_CHECK(in.eof(), "--metrics {}: cannot read it: {}", path, std::strerror(errno));
  if (dropped == 0 && !cut_dropped && !cut_kept) return;
  write_file_atomically(path, [&](std::ostream& o) { o << kept; });
  std::vector<std::string> what;
  if (dropped > 0)
    what.push_back(fmt::format("dropped {} line(s) of steps after {} (written by a run that went on past its last "
                               "checkpoint)", dropped, start));
  if (cut_dropped) what.push_back("dropped its last line, cut short by a failed write");
  if (cut_kept) what.push_back("ended its last line, whose newline a failed write had cut");
  fmt::print("--metrics {}: {}\n", path, fmt::join(what, "; "));
}

void check_resume_matches(const TrainState& s, const Args& args) {
  auto same = [&](const char* flag, int64_t saved) {
    MT_CHECK(args.integer(flag) == saved, "--resume: --{} is {} but the checkpoint was trained with {}", flag,
             args.integer(flag), saved);
  };
  same("batch", s.batch);
  same("seq", s.seq);
  same("accum", s.accum);
  MT_CHECK(args.str("precision") == s.precision, "--resume: --precision is {} but the checkpoint used {}",
           args.str("precision"), s.precision);
}

}  // namespace mt::cli
