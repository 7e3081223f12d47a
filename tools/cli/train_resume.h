// Resuming a training run: what `meshtrain train --resume` checks against the checkpoint's
// trainer_state.json, and the metrics file's tidy-up (docs/cli.md, "Checkpoints and exact resume").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"
#include "tools/cli/args.h"
#include "tools/cli/train_state.h"

namespace mt::cli {

// The settings a run records in its checkpoints (TrainState::settings): the flags that shape
// training after a resume (learning rates, warmup, weight decay, beta2, clipping, dropout,
// optimizer, MoE loss coefficients), --steps, --seed as given, and a fingerprint of --data.
std::vector<std::pair<std::string, std::string>> resume_settings(const Args& args);

// --batch, --seq, --accum and --precision must equal the checkpoint's (throws naming the flag).
void check_resume_matches(const TrainState& saved, const Args& args);

// The other recorded settings against this run's (`now`: resume_settings(args)): a difference is
// refused, listing each with the checkpoint's value (`where` names the checkpoint), unless
// --allow-changes, which prints them. --seed counts only when given; a changed --steps is
// announced, not refused. The MoE flags are compared with `saved_config` (the checkpoint's
// config.json, which carries the values its run trained with), and only when given.
void check_resume_settings(const TrainState& saved, const std::vector<std::pair<std::string, std::string>>& now,
                           const Args& args, const std::string& where, const ModelConfig& saved_config);

// --resume takes the checkpoint's recorded final rate (its bits, so the schedule goes on exactly)
// when --min-lr is not given, or is given as a decimal within 1e-12 relative of it: the default
// --lr / 10 is recorded as its double, 3e-3 / 10 as 0.00030000000000000003, and `--min-lr 3e-4`
// names that rate. Until 2026-12-07 that was refused as a change of --min-lr.
bool min_lr_as_recorded(const TrainState& saved, const Args& args);

// The model is the checkpoint's on --resume: --hf (the weights a fresh run started from) is then
// ignored with a notice, so that a run started with --hf resumes with --resume added; a --config
// given for another model (type, sizes, layers, experts, vocabulary) is refused, naming both.
void check_resume_model(const ModelConfig& saved, const Args& args, const std::string& where);

// Drops the lines of a JSONL metrics file whose "step" is above `start` (a run killed after its
// last checkpoint wrote them; the resumed run trains those steps again). Rewrites the file
// atomically, and only when there is something to drop; a missing file is left missing.
void drop_metrics_after(const std::string& path, int64_t start);

}  // namespace mt::cli
