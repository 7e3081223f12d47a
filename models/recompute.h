// Activation recomputation presets for the built-in models: which modules keep only their inputs
// in forward and run their forward again in backward (Module::set_recompute, tensor/checkpoint.h).
// docs/models.md, "Recomputing activations".
#pragma once

#include <cstdint>
#include <string>

#include "tensor/module.h"

namespace mt {

enum class RecomputeMode {
  kNone,       // every activation is kept
  kFull,       // every decoder layer recomputes (keeps its input only)
  kSelective,  // each decoder layer's feed-forward block (mlp / block_sparse_moe) recomputes
};

// "none", "full" or "selective"; anything else is an error naming `flag` (e.g. "meshtrain train
// --recompute").
RecomputeMode parse_recompute(const std::string& value, const std::string& flag);
const char* recompute_name(RecomputeMode mode);

// Marks the modules of `mode` in a built-in model (CausalLM or LlamaModel) and returns how many;
// modules not named by the mode are set back to no recomputation. A model without decoder
// layers is an error for full and selective, unless `may_hold_none`: a pipeline stage may hold
// the embedding or the head alone, and then marks nothing.
int64_t apply_recompute(Module& model, RecomputeMode mode, bool may_hold_none = false);

}  // namespace mt
