// Training checkpoints: <dir>/step-NNNNNNNN/ holds config.json + model.safetensors (a valid Hugging
// Face checkpoint of the f32 master weights), optimizer.safetensors and trainer_state.json; the
// file <dir>/latest names the newest complete one. Each step directory is written under a temporary
// name, fsync'ed, and renamed into place (an existing one is swapped atomically), and `latest` is
// replaced atomically, so an interrupted save leaves the previous checkpoint intact. safetensors
// files carry CRC-32 checksums. The history rules (what a run may replace, docs/checkpoints.md,
// "Checkpoint history") are checked at start-up by check_checkpoint_history and again by each save.
// Under --plan the step directory is sharded instead (index.json + shard-R-of-W.safetensors;
// tools/cli/sharded_save.h, checkpoint/), with the same commit, `latest` and history rules.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"
#include "models/hf_checkpoint.h"
#include "tensor/tensor.h"
#include "tools/cli/outputs.h"

namespace mt::cli {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct TrainState {
  int64_t step = 0;  // steps completed
  uint64_t seed = 0;
  uint64_t rng_offset = 0;  // default generator offset after `step` steps
  int64_t data_position = 0;
  std::string precision = "f32";
  int64_t batch = 0, seq = 0, accum = 1;
  int64_t world_size = 1;  // ranks that saved it (informational: any world resumes it)
  std::string plan;        // the plan file it was saved under ("" without --plan)
  // The run's settings that shape training from here on (flag -> value as given, and "data" -> a
  // fingerprint of the token file), compared on --resume (tools/cli/train.cpp). Empty in a
  // checkpoint written before 2026-11-28: nothing to compare.
  std::vector<std::pair<std::string, std::string>> settings;
  // The warmup the run's schedule used (Trainer::warmup_steps); -1 in a checkpoint written before
  // 2026-11-28: the resumed run computes it from its flags.
  int64_t warmup_steps = -1;

  // The value `key` had in the checkpoint's run (`settings`), or null when it is not recorded.
  const std::string* setting(const std::string& key) const {
    for (const auto& [k, v] : settings)
      if (k == key) return &v;
    return nullptr;
  }
};

// Writes the checkpoint for state.step and points `latest` at it; returns its directory. Removes
// stale temporaries first (remove_stale_temporaries). With Overwrite::kRefuse, an existing step
// directory of that step, or a `latest` that names a later step, is an error and nothing is written.
std::string save_checkpoint(const std::string& dir, const ModelConfig& config, const NamedTensors& model_f32,
                            const NamedTensors& optimizer_state, const TrainState& state,
                            Overwrite overwrite = Overwrite::kRefuse);

// The pieces of a save, shared by save_checkpoint and the sharded saver (sharded_save.h):
// prepare_checkpoint_save creates `dir`, removes stale temporaries and applies the Overwrite rules
// above for `step` (throws naming what stands in the way; nothing written); write_train_state and
// write_checkpoint_config write trainer_state.json / config.json into a (temporary) step directory;
// commit_step_directory syncs `tmp`, checks the Overwrite rules again (an asynchronous save commits
// long after it started), renames it to the step directory (with Overwrite::kAllow an existing one
// is swapped atomically), syncs `dir` and points `latest` at it, returning the step directory.
std::string step_dir_name(int64_t step);
void prepare_checkpoint_save(const std::string& dir, int64_t step, Overwrite overwrite);
void write_train_state(const std::string& step_dir, const TrainState& state);
void write_checkpoint_config(const std::string& step_dir, const ModelConfig& config);
std::string commit_step_directory(const std::string& dir, const std::string& tmp, int64_t step, Overwrite overwrite);
// --keep N: removes the oldest step directories of `dir` beyond the newest N, never the one
// `latest` names (N <= 0: keeps all). It counts only this run's lineage: the step directories this
// process committed and, for a resumed run, those up to the step it resumed from (`resumed_from`;
// 0 for a fresh run). Another run's directories in `dir` (a fresh run with --overwrite) are left
// alone. Returns how many it removed.
int64_t apply_retention(const std::string& dir, int64_t keep, int64_t resumed_from);

// What a training run will write into its checkpoint directory.
enum class RunKind { kFresh, kResume };
struct CheckpointRun {
  std::string dir;
  RunKind kind = RunKind::kFresh;
  Overwrite overwrite = Overwrite::kRefuse;
  int64_t stop_at = 0;           // the last step this run trains (saved at the end)
  int64_t checkpoint_every = 0;  // also saved at multiples of this (0: only at the end)
};
// Start-up check of --checkpoint-dir, on every rank before anything is built (cheap: reads only
// `latest` and its trainer_state.json). The directory must be writable (check_output_dir); a fresh
// run needs a directory without checkpoints; a resumed run must have steps left to train (stop_at
// above the checkpoint's step) and may not write a step directory that already exists; either
// rule gives way to Overwrite::kAllow. Throws naming the directory and what stands in the way.
void check_checkpoint_history(const CheckpointRun& run);

// Holds an exclusive lock (flock) on `dir`/.meshtrain.lock from construction to destruction, so that
// a second run using the same --checkpoint-dir is refused at start-up instead of the two runs
// overwriting each other's checkpoints and `latest`. The lock file records the holder's host and
// PID for the message; the kernel drops the lock when the process dies, however it dies. Creates
// `dir`, and removes it again at destruction when it was created here and holds nothing but the
// lock (a run that failed before its first save). Under --plan only the root rank, which commits
// every step directory, takes it.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  std::string dir_;
  bool created_ = false;  // the directory did not exist before: removed again if left empty
  int fd_ = -1;
};

// Removes what killed saves left in `dir`: `step-*.tmp.PID`, `step-*.old.PID` and `latest.tmp.PID`
// whose process PID no longer runs on this host. Temporaries of live processes are kept.
void remove_stale_temporaries(const std::string& dir);
// The same for the temporaries `<path>.tmp.PID` beside an output `path` (an interrupted `export`;
// `path` without a trailing '/').
void remove_stale_temporaries_of(const std::string& path);

struct LoadedCheckpoint {
  std::string path;
  bool sharded = false;  // index.json + shard files (docs/checkpoints.md, "Sharded checkpoints")
  ModelConfig config;
  NamedTensors model;
  NamedTensors optimizer;
  TrainState state;
};
// Loads the checkpoint `latest` names; throws naming the directory when there is none, `latest`
// when it is empty or names no step directory, and trainer_state.json when a field is invalid.
// A sharded checkpoint's tensors are assembled into `model` and `optimizer` (one full tensor at a
// time) only when `full` is true; under a plan each rank reads its own boxes instead
// (ShardedCheckpointReader::load_like).
LoadedCheckpoint load_latest_checkpoint(const std::string& dir, bool full = true);

// The weights a command's --hf names: a Hugging Face checkpoint directory, or a sharded training step
// directory (index.json + shard files, `train --plan`), whose model tensors are assembled one full
// tensor at a time, with its config.json. Errors name the directory.
HfCheckpoint read_model_checkpoint(const std::string& dir);

}  // namespace mt::cli
