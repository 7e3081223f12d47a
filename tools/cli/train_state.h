// Training checkpoints: <dir>/step-NNNNNNNN/ holds config.json + model.safetensors (a valid Hugging
// Face checkpoint of the f32 master weights), optimizer.safetensors and trainer_state.json; the
// file <dir>/latest names the newest complete one. Each step directory is written under a temporary
// name and renamed into place, and `latest` is replaced atomically, so an interrupted save leaves
// the previous checkpoint intact. safetensors files carry CRC-32 checksums.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"
#include "tensor/tensor.h"

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

// Writes the checkpoint for state.step and points `latest` at it; returns its directory.
std::string save_checkpoint(const std::string& dir, const ModelConfig& config, const NamedTensors& model_f32,
                            const NamedTensors& optimizer_state, const TrainState& state);

struct LoadedCheckpoint {
  std::string path;
  ModelConfig config;
  NamedTensors model;
  NamedTensors optimizer;
  TrainState state;
};
// Loads the checkpoint `latest` names; throws naming the directory when there is none.
LoadedCheckpoint load_latest_checkpoint(const std::string& dir);

}  // namespace mt::cli
