// Training checkpoints: <dir>/step-NNNNNNNN/ holds config.json + model.safetensors (a valid Hugging
// Face checkpoint of the f32 master weights), optimizer.safetensors and trainer_state.json; the
// file <dir>/latest names the newest complete one. Each step directory is written under a temporary
// name, fsync'ed, and renamed into place (an existing one is swapped atomically), and `latest` is
// replaced atomically, so an interrupted save leaves the previous checkpoint intact. safetensors
// files carry CRC-32 checksums. The history rules (what a run may replace, docs/checkpoints.md,
// "Checkpoint history") are checked at start-up by check_checkpoint_history and again by each save.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"
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
};

// Writes the checkpoint for state.step and points `latest` at it; returns its directory. Removes
// stale temporaries first (remove_stale_temporaries). With Overwrite::kRefuse, an existing step
// directory of that step, or a `latest` that names a later step, is an error and nothing is written.
std::string save_checkpoint(const std::string& dir, const ModelConfig& config, const NamedTensors& model_f32,
                            const NamedTensors& optimizer_state, const TrainState& state,
                            Overwrite overwrite = Overwrite::kRefuse);

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

// Removes what killed saves left in `dir`: `step-*.tmp.PID`, `step-*.old.PID` and `latest.tmp.PID`
// whose process PID no longer runs on this host. Temporaries of live processes are kept.
void remove_stale_temporaries(const std::string& dir);

struct LoadedCheckpoint {
  std::string path;
  ModelConfig config;
  NamedTensors model;
  NamedTensors optimizer;
  TrainState state;
};
// Loads the checkpoint `latest` names; throws naming the directory when there is none, `latest`
// when it is empty or names no step directory, and trainer_state.json when a field is invalid.
LoadedCheckpoint load_latest_checkpoint(const std::string& dir);

}  // namespace mt::cli
