// Start-up and run-time checks of the meshtrain commands beyond flag parsing (issue 10: bounded
// inputs, no silent nonsense): every `train` flag against the range where it means something and
// against the model config, the model's size against the machine's memory before anything is
// allocated, and finiteness of losses and weights (docs/cli.md, "Bad input and non-finite values").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "models/config.h"
#include "tools/cli/args.h"
#include "tools/cli/parallel.h"

namespace mt::cli {

// Largest --batch, --accum and --seq the CLI takes, and the largest step count.
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;
inline constexpr int64_t kMaxAccum = int64_t{1} << 20;
inline constexpr int64_t kMaxSteps = int64_t{1} << 40;

// `train` flags on their own (before any file is read): each in its range (--batch 2^62, --lr 0,
// --grad-clip -1, --beta2 1, --min-lr above --lr ... are errors naming the flag). The flags of
// the step itself are checked by validate_step_flags (trainer.h), which `parity` shares.
void validate_train_flags(const Args& args);
// `train` (or `parity`: `command`) flags against the model: --seq at most max_position_embeddings
// (named with `source`).
void validate_train_flags(const Args& args, const ModelConfig& cfg, const std::string& source,
                          const std::string& command = "train");

// What a command keeps per parameter at least, in f32 bytes: the weights (init, eval), plus the
// gradients (grad), plus the AdamW moments (train).
enum class ModelUse { kWeights = 1, kWeightsAndGrads = 2, kTraining = 4 };
// Throws naming the command and the config (`source`) when that lower bound exceeds the host's
// physical memory, so that a model too large for the machine fails at start-up rather than in the
// allocator or the OOM killer.
void check_model_fits_memory(const ModelConfig& cfg, ModelUse use, const std::string& command,
                             const std::string& source);

// The first non-finite element of the first floating tensor that has one, in order.
struct NonFinite {
  std::string name;
  int64_t index = 0;
  double value = 0;
};
std::optional<NonFinite> first_non_finite(const NamedTensors& tensors);
// A value as messages print it: "nan" for any NaN (fmt prints a negative one "-nan").
std::string value_text(double v);
// "tensor 'x' holds nan at element 7", or that every weight is finite (the forward pass overflowed).
std::string describe_non_finite(const NamedTensors& tensors);

// Flushes stdout and throws naming the command when the result could not be written (a full disk,
// a closed pipe): the result line is the contract of eval/grad/init, so losing it is an error.
void flush_stdout(const std::string& command);

}  // namespace mt::cli
