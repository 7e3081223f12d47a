// Activation recomputation presets (recompute.h).
#include "models/recompute.h"

#include "models/llama.h"
#include "runtime/error.h"

namespace mt {

RecomputeMode parse_recompute(const std::string& value, const std::string& flag) {
  if (value == "none") return RecomputeMode::kNone;
  if (value == "full") return RecomputeMode::kFull;
  if (value == "selective") return RecomputeMode::kSelective;
  MT_FAIL("{}: expected none, full (every decoder layer) or selective (each layer's feed-forward block), got '{}'",
          flag, value);
}

const char* recompute_name(RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::kNone: return "none";
    case RecomputeMode::kFull: return "full";
    case RecomputeMode::kSelective: return "selective";
  }
  return "?";
}

int64_t apply_recompute(Module& model, RecomputeMode mode, bool may_hold_none) {
  int64_t layers = 0, marked = 0;
  for (auto& [path, m] : model.named_modules()) {
    m->set_recompute(Recompute::kNo);
    if (!dynamic_cast<LlamaDecoderLayer*>(m.get())) continue;
    ++layers;
    if (mode == RecomputeMode::kFull) {
      m->set_recompute(Recompute::kYes);
      ++marked;
    }
  }
  if (mode == RecomputeMode::kSelective)
    for (auto& [path, m] : model.named_modules()) {
      if (!dynamic_cast<LlamaDecoderLayer*>(m.get())) continue;
      for (auto& [name, child] : m->named_children())
        if (name == "mlp" || name == "block_sparse_moe") {
          child->set_recompute(Recompute::kYes);
          ++marked;
        }
    }
  MT_CHECK(mode == RecomputeMode::kNone || layers > 0 || may_hold_none,
           "recompute {}: the model has no decoder layers (LlamaDecoderLayer) to recompute", recompute_name(mode));
  return marked;
}

}  // namespace mt
