// Saving and loading training checkpoints, and the rules that keep their history safe (see
// train_state.h for the layout and docs/checkpoints.md, "Checkpoint history", for the rules).
#include "tools/cli/train_state.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <nlohmann/json.hpp>

#include "checkpoint/shard_reader.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "models/json_io.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "tools/cli/outputs.h"

namespace mt::cli {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLatest = "latest";
constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kStateFormat = "meshtrain-train-state-1";

// The step directories this process committed, per checkpoint directory (as given): --keep prunes
// among these and its resumed lineage only (apply_retention).
std::mutex g_written_mu;
std::map<std::string, std::set<int64_t>> g_written;

std::string step_name(int64_t step) { return step_dir_name(step); }

// The step of a step directory's name (`step-` and 1 to 18 digits), or -1 for any other name.
int64_t step_of_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// The PID a temporary's name ends with (`step-N.tmp.PID`, `step-N.tmp.PID.tmp.PID` from the
// directory writer, `step-N.old.PID`, `latest.tmp.PID`), or 0 when `name` is no such temporary.
long temporary_owner(const std::string& name) {
  if (name.rfind("step-", 0) != 0 && name.rfind("latest.", 0) != 0) return 0;
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == name.size() || name.size() - dot > 10) return 0;
  for (size_t i = dot + 1; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return 0;
  const size_t kind = name.rfind('.', dot - 1);
  if (kind == std::string::npos) return 0;
  const std::string k = name.substr(kind + 1, dot - kind - 1);
  if (k != "tmp" && k != "old") return 0;
  return std::stol(name.substr(dot + 1));
}

bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

void write_text_atomic(const fs::path& path, const std::string& text) {
  write_file_atomically(path.string(), [&](std::ostream& out) { out << text; });
}

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), "cannot read {}", path.string());
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// `s` without its trailing white space (the newline of `latest` and of the lock file).
std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// The step directory name `dir`/latest holds, or "" when there is no `latest`.
std::string latest_name(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / kLatest, ec) ? trimmed(read_text(dir / kLatest)) : "";
}

// Step directories in `dir`, by step (temporaries and other entries are not step directories).
std::map<int64_t, fs::path> step_dirs(const fs::path& dir) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = step_of_name(it->path().filename().string());
    if (step >= 0 && it->is_directory(ec)) out.emplace(step, it->path());
  }
  return out;
}

// trainer_state.json of the step directory `step_dir`, every field checked.
TrainState read_train_state(const fs::path& step_dir) {
  const fs::path file = step_dir / kStateFile;
  const nlohmann::json j = read_json_file(file.string(), "trainer state");
  MT_CHECK(j.is_object(), "{}: the trainer state must be a JSON object", file.string());
  const auto format = j.find("format");
  MT_CHECK(format != j.end() && *format == kStateFormat, "{}: field 'format' must be \"{}\", got {}", file.string(),
           kStateFormat, format == j.end() ? "nothing" : json_brief(*format));
  const JsonFields f(j, file.string());
  TrainState s;
  s.step = f.int_at("step", 1);
  const int64_t dir_step = step_of_name(step_dir.filename().string());
  MT_CHECK(s.step == dir_step, "{}: field 'step' is {} but the directory is {}", file.string(), s.step,
           step_dir.filename().string());
  s.seed = f.uint_at("seed");
  s.rng_offset = f.uint_at("rng_offset");
  s.data_position = f.int_at("data_position", 0);
  const auto precision = j.find("precision");
  MT_CHECK(precision != j.end() && (*precision == "f32" || *precision == "bf16"),
           "{}: field 'precision' must be \"f32\" or \"bf16\", got {}", file.string(),
           precision == j.end() ? "nothing" : json_brief(*precision));
  s.precision = precision->get<std::string>();
  s.batch = f.int_at("batch", 1);
  s.seq = f.int_at("seq", 1);
  s.accum = f.int_at("accum", 1);
  s.warmup_steps = f.has("warmup_steps") ? f.int_at("warmup_steps", 0) : -1;
  if (const auto settings = j.find("settings"); settings != j.end() && !settings->is_null()) {
    MT_CHECK(settings->is_object(), "{}: field 'settings' must be an object, got {}", file.string(),
             json_brief(*settings));
    for (const auto& [k, v] : settings->items()) {
      MT_CHECK(v.is_string(), "{}: field 'settings.{}' must be a string, got {}", file.string(), k, json_brief(v));
      s.settings.emplace_back(k, v.get<std::string>());
    }
  }
  return s;
}

// The step directory <dir>/latest names, with its state. Errors name `latest` when it is empty or
// names no step directory, and trainer_state.json when that is invalid.
struct Latest {
  fs::path path;
  TrainState state;
};
Latest read_latest(const fs::path& dir) {
  const fs::path latest = dir / kLatest;
  std::error_code ec, link_ec;
  const fs::file_status st = fs::status(latest, ec);
  MT_CHECK(!fs::is_symlink(fs::symlink_status(latest, link_ec)) || fs::exists(st),
           "--resume: {} is a symbolic link that does not resolve ({}); it must be a file naming the newest step "
           "directory", latest.string(), ec ? ec.message() : std::string("no such file"));
  if (!fs::exists(st)) {
    // A run stopped between committing a step directory and writing `latest` (a full disk, a kill
    // during its first save): each step directory is renamed into place whole, so the newest one is
    // complete and is where the run resumes (the two refusals, "no checkpoint" and "already holds
    // checkpoints", sent the user to each other until 2026-11-28).
    const std::map<int64_t, fs::path> steps = step_dirs(dir);
    MT_CHECK(!steps.empty(), "--resume: no checkpoint in {} (the file {} does not exist)", dir.string(),
             latest.string());
    Latest out;
    out.path = steps.rbegin()->second;
    out.state = read_train_state(out.path);
    // Once per process: the history check and the load both read it.
    static bool announced = false;
    if (!std::exchange(announced, true))
      fmt::print(stderr, "meshtrain: notice: {} does not exist (a run stopped before writing it); resuming from "
                 "{}, the newest step directory\n", latest.string(), out.path.string());
    return out;
  }
  MT_CHECK(fs::is_regular_file(st), "--resume: {} is not a regular file (it must name the newest step directory, "
           "e.g. step-00000004)", latest.string());
  const std::string name = trimmed(read_text(latest));
  MT_CHECK(!name.empty(), "{}: the file is empty; it must name the newest step directory (e.g. step-00000004)",
           latest.string());
  MT_CHECK(step_of_name(name) >= 0, "{}: '{}' is not a step directory name (step-NNNNNNNN)", latest.string(),
           name.substr(0, 80));
  Latest out;
  out.path = dir / name;
  MT_CHECK(fs::is_directory(out.path, ec), "{}: names {}, which does not exist", latest.string(), out.path.string());
  out.state = read_train_state(out.path);
  return out;
}

// Puts the complete directory `fresh` in place of the existing `target` with no moment at which
// `target` is missing: renameat2(RENAME_EXCHANGE) swaps the two names in one step, after which
// `fresh` names the old directory, which is removed. A file system without the exchange gets the
// old directory renamed aside first (a short window without `target`, docs/checkpoints.md).
void replace_directory(const fs::path& fresh, const fs::path& target) {
  std::error_code ec;
  if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(fresh, ec);
    return;
  }
  const int err = errno;
  MT_CHECK(err == EINVAL || err == ENOSYS || err == EOPNOTSUPP, "cannot replace {}: {}", target.string(),
           std::strerror(err));
  const fs::path old = target.string() + ".old." + std::to_string(::getpid());
  fs::remove_all(old, ec);
  fs::rename(target, old, ec);
  MT_CHECK(!ec, "cannot move {} aside to replace it: {}", target.string(), ec.message());
  fs::rename(fresh, target, ec);
  if (ec) {
    std::error_code back;
    fs::rename(old, target, back);
    MT_FAIL("cannot rename {} into place: {}", target.string(), ec.message());
  }
  fs::remove_all(old, ec);
}

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step-{:08d}", step); }

namespace {

// Without --overwrite a save may neither replace a step directory nor move `latest` back. Checked
// when a save starts and again when it commits: an asynchronous sharded save commits a whole
// checkpoint interval later, and another process may have written meanwhile.
void check_save_target(const std::string& dir, int64_t step) {
  std::error_code ec;
  const std::string name = step_name(step);
  const fs::path final_path = fs::path(dir) / name;
  MT_CHECK(!fs::exists(final_path, ec),
           "checkpoint {} already exists and this run did not write it; pass --overwrite to replace it",
           final_path.string());
  const std::string named = latest_name(dir);  // none: step_of_name gives -1
  MT_CHECK(step_of_name(named) < step,
           "{} names {}, a later step than {}: saving would move it back; pass --overwrite to allow it",
           (fs::path(dir) / kLatest).string(), named, name);
}

}  // namespace

void prepare_checkpoint_save(const std::string& dir, int64_t step, Overwrite overwrite) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, "checkpoint directory {} cannot be created: {}", dir, ec.message());
  remove_stale_temporaries(dir);
  if (overwrite == Overwrite::kRefuse) check_save_target(dir, step);
}

void write_train_state(const std::string& step_dir, const TrainState& s) {
  nlohmann::json j = {{"format", kStateFormat},
                      {"step", s.step},
                      {"seed", s.seed},
                      {"rng_offset", s.rng_offset},
                      {"data_position", s.data_position},
                      {"precision", s.precision},
                      {"batch", s.batch},
                      {"seq", s.seq},
                      {"accum", s.accum},
                      {"world_size", s.world_size},
                      {"plan", s.plan},
                      {"warmup_steps", s.warmup_steps}};
  nlohmann::json settings = nlohmann::json::object();
  for (const auto& [k, v] : s.settings) settings[k] = v;
  j["settings"] = settings;
  write_text_atomic(fs::path(step_dir) / kStateFile, j.dump(2) + "\n");
}

void write_checkpoint_config(const std::string& step_dir, const ModelConfig& config) {
  // A step directory holds the f32 master weights whatever the run's --precision or its --hf
  // input's dtype: config.json says so (it kept a bf16 input's "bfloat16" until 2026-12-07).
  ModelConfig c = config;
  c.torch_dtype = "float32";
  save_hf_config(c, (fs::path(step_dir) / kHfConfigFile).string());
}

std::string commit_step_directory(const std::string& dir, const std::string& tmp_dir, int64_t step,
                                  Overwrite overwrite) {
  const std::string name = step_name(step);
  const fs::path final_path = fs::path(dir) / name, tmp(tmp_dir);
  std::error_code ec;
  try {
    fsync_path(tmp.string());  // the files are synced by their writers; this syncs their names
    if (overwrite == Overwrite::kRefuse) {
      check_save_target(dir, step);
      // No-replace rename: a step directory that appears between the check and the rename is kept
      // and this save fails, rather than the directory being swapped out.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) != 0) {
        const int err = errno;
        MT_CHECK(err == EINVAL || err == ENOSYS,  // a file system without RENAME_NOREPLACE: checked above
                 "cannot rename {} into place: {}{}", final_path.string(), std::strerror(err),
                 err == EEXIST || err == ENOTEMPTY
                     ? " (another process created it meanwhile; pass --overwrite to replace it)"
                     : "");
        fs::rename(tmp, final_path, ec);
        MT_CHECK(!ec, "cannot rename {} into place: {}", final_path.string(), ec.message());
      }
    } else if (fs::exists(final_path, ec)) {
      replace_directory(tmp, final_path);
    } else {
      fs::rename(tmp, final_path, ec);
      MT_CHECK(!ec, "cannot rename {} into place: {}", final_path.string(), ec.message());
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(g_written_mu);
    g_written[dir].insert(step);
  }
  fsync_path(dir);  // the step directory's name is durable before `latest` names it
  write_text_atomic(fs::path(dir) / kLatest, name + "\n");
  fsync_path(dir);
  return final_path.string();
}

int64_t apply_retention(const std::string& dir, int64_t keep, int64_t resumed_from) {
  if (keep <= 0) return 0;
  std::set<int64_t> written;
  {
    std::lock_guard<std::mutex> lock(g_written_mu);
    written = g_written[dir];
  }
  std::error_code ec;
  const std::string named = latest_name(dir);
  std::map<int64_t, fs::path> steps = step_dirs(dir);
  std::erase_if(steps, [&](const auto& e) { return !written.count(e.first) && e.first > resumed_from; });
  int64_t excess = static_cast<int64_t>(steps.size()) - keep, removed = 0;
  for (const auto& [step, path] : steps) {  // oldest first
    if (excess <= 0) break;
    if (path.filename().string() == named) continue;
    fs::remove_all(path, ec);
    MT_CHECK(!ec, "--keep: cannot remove the old checkpoint {}: {}", path.string(), ec.message());
    --excess;
    ++removed;
  }
  if (removed > 0) fsync_path(dir);
  return removed;
}

CheckpointDirLock::CheckpointDirLock(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  created_ = !fs::exists(dir, ec);
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, "checkpoint directory {} cannot be created: {}", dir, ec.message());
  const std::string path = (fs::path(dir) / ".meshtrain.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  MT_CHECK(fd_ >= 0, "cannot open the lock file {} of --checkpoint-dir: {}", path, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
    holder = trimmed(holder.substr(0, n > 0 ? static_cast<size_t>(n) : 0));
    ::close(fd_);
    fd_ = -1;
    MT_CHECK(err != EWOULDBLOCK,
             "--checkpoint-dir {} is in use by another training run ({} holds {}): two runs in one directory "
             "would overwrite each other's checkpoints; wait for it to end or use another directory",
             dir, holder.empty() ? "a process" : holder, path);
    MT_FAIL("cannot lock {}: {}", path, std::strerror(err));
  }
  char host[256] = {};
  (void)::gethostname(host, sizeof(host) - 1);
  const std::string me = fmt::format("process {} on {}\n", ::getpid(), host);
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    MT_LOG_WARN("cannot record this process in {}: {}", path, std::strerror(errno));
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ < 0) return;
  // A directory this run created and never saved into (it failed at start-up) goes again, so that
  // a failed run leaves nothing behind. Otherwise the file stays: removing it would race with the
  // next run's open.
  std::error_code ec;
  const fs::path lock = fs::path(dir_) / ".meshtrain.lock";
  bool only_lock = created_;
  for (fs::directory_iterator it(dir_, ec), end; only_lock && !ec && it != end; it.increment(ec))
    only_lock = it->path().filename() == lock.filename();
  if (only_lock && !ec) {
    fs::remove(lock, ec);
    fs::remove(dir_, ec);
  }
  ::close(fd_);  // drops the lock
}

namespace {

// Removes (recursively) the entries of `dir` that `owner(name)` gives a PID (> 0) of a process no
// longer running on this host; entries of live processes and of this one are kept.
void remove_dead_owners(const fs::path& dir, const std::function<long(const std::string&)>& owner) {
  std::vector<fs::path> stale;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const long pid = owner(it->path().filename().string());
    if (pid > 0 && pid != ::getpid() && !process_alive(pid)) stale.push_back(it->path());
  }
  for (const fs::path& p : stale) fs::remove_all(p, ec);
}

}  // namespace

void remove_stale_temporaries(const std::string& dir) { remove_dead_owners(dir, temporary_owner); }

void remove_stale_temporaries_of(const std::string& path) {
  const fs::path p(path);
  if (!p.has_filename()) return;  // "OUT/": the caller names OUT
  const std::string prefix = p.filename().string() + ".tmp.";
  remove_dead_owners(p.has_parent_path() ? p.parent_path() : fs::path("."), [&](const std::string& name) -> long {
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() - prefix.size() > 9 ||
        name.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
      return 0;
    return std::stol(name.substr(prefix.size()));
  });
}

std::string save_checkpoint(const std::string& dir, const ModelConfig& config, const NamedTensors& model_f32,
                            const NamedTensors& optimizer_state, const TrainState& s, Overwrite overwrite) {
  prepare_checkpoint_save(dir, s.step, overwrite);
  const fs::path tmp = fs::path(dir) / (step_name(s.step) + ".tmp." + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  try {
    write_hf_checkpoint(tmp.string(), config, model_f32, DType::kF32);
    write_safetensors((tmp / "optimizer.safetensors").string(), optimizer_state);
    write_train_state(tmp.string(), s);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return commit_step_directory(dir, tmp.string(), s.step, overwrite);
}

void check_checkpoint_history(const CheckpointRun& run) {
  check_output_dir(run.dir, "--checkpoint-dir");
  const fs::path dir(run.dir);
  std::error_code ec;
  const std::map<int64_t, fs::path> steps = step_dirs(dir);
  if (run.kind == RunKind::kFresh) {
    const bool has_latest = fs::exists(dir / kLatest, ec);
    if (run.overwrite == Overwrite::kAllow || (steps.empty() && !has_latest)) return;
    MT_FAIL("--checkpoint-dir {} already holds checkpoints ({} step directories{}): a fresh run would overwrite "
            "them; pass --resume to continue from them, --overwrite to replace them, or use another directory",
            run.dir, steps.size(), has_latest ? fmt::format(", {}", (dir / kLatest).string()) : "");
  }
  const Latest latest = read_latest(dir);
  const int64_t from = latest.state.step;
  MT_CHECK(run.stop_at > from,
           "--resume: {} is at step {} and this run would stop at step {} (--steps / --stop-at): there is nothing "
           "to train; pass --steps (and --stop-at) above {}",
           latest.path.string(), from, run.stop_at, from);
  if (run.overwrite == Overwrite::kAllow) return;
  for (const auto& [step, path] : steps) {
    const bool written = step == run.stop_at || (run.checkpoint_every > 0 && step % run.checkpoint_every == 0);
    MT_CHECK(!(step > from && step <= run.stop_at && written),
             "--resume: {} already exists and this run (from step {}, which {} names) would write it again; pass "
             "--overwrite to replace it, or move it away",
             path.string(), from, (dir / kLatest).string());
  }
}

HfCheckpoint read_model_checkpoint(const std::string& dir) {
  std::error_code ec;
  // A `train --checkpoint-dir` (its `latest`, no config.json of its own): the step directory to
  // give is named (the message was config.json's "file does not exist" until 2026-12-07).
  if (!fs::exists(fs::path(dir) / kHfConfigFile, ec) && fs::exists(fs::path(dir) / kLatest, ec)) {
    std::string step;
    try {
      step = read_latest(dir).path.string();
    } catch (const Error&) {
    }
    MT_FAIL("checkpoint '{}' is a train --checkpoint-dir, not one checkpoint: give one of its step directories{}",
            dir, step.empty() ? std::string() : fmt::format(" (its latest: {})", step));
  }
  if (!fs::exists(fs::path(dir) / kShardedIndexFile, ec)) return read_hf_checkpoint(dir);
  HfCheckpoint out;
  out.source = dir;
  out.config = load_hf_config((fs::path(dir) / kHfConfigFile).string());
  ShardedCheckpointReader reader(dir);
  for (const IndexedTensor& t : reader.index().tensors)
    if (t.group == "model") out.tensors.emplace_back(t.name, reader.read_full(t));
  return out;
}

LoadedCheckpoint load_latest_checkpoint(const std::string& dir, bool full) {
  const Latest latest = read_latest(dir);
  LoadedCheckpoint out;
  out.path = latest.path.string();
  out.state = latest.state;
  std::error_code ec;
  if (fs::exists(latest.path / kShardedIndexFile, ec)) {
    out.sharded = true;
    out.config = load_hf_config((latest.path / kHfConfigFile).string());
    if (!full) return out;
    ShardedCheckpointReader reader(out.path);  // one full tensor at a time
    for (const IndexedTensor& t : reader.index().tensors)
      (t.group == "model" ? out.model : out.optimizer).emplace_back(t.name, reader.read_full(t));
    return out;
  }
  // Neither layout's index: say what is missing for each, rather than only the single-process one.
  MT_CHECK(fs::exists(latest.path / "model.safetensors", ec) || fs::exists(latest.path / "model.safetensors.index.json", ec),
           "--resume: {} holds neither {} (a sharded checkpoint's index) nor model.safetensors or "
           "model.safetensors.index.json (a single-process or --gather-save checkpoint): the step directory is "
           "incomplete; point {} at an earlier step directory that is whole",
           latest.path.string(), kShardedIndexFile, (fs::path(dir) / kLatest).string());
  HfCheckpoint ck = read_hf_checkpoint(out.path);
  out.config = ck.config;
  out.model = std::move(ck.tensors);
  out.optimizer = read_safetensors((latest.path / "optimizer.safetensors").string()).tensors;
  return out;
}

}  // namespace mt::cli
