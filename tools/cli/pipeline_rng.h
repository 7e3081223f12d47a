// Dropout under pipeline parallelism stays single-device-exact (docs/pipeline.md, docs/rng.md):
// every random op advances the generator by an amount fixed by its global element count, so the
// offset at which each pipeline unit starts its forward in micro-batch m is
//   step base + m * (blocks of one whole forward) + (blocks of the units before it),
// the same on every rank. PipelineRng measures those blocks once per input shape by running the
// whole model on meta tensors (no kernel runs, nothing is allocated), so a stage can set the
// generator before its forward without hearing from the other stages.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "models/llama.h"
#include "runtime/shape.h"

namespace mt::cli {

class PipelineRng {
 public:
  explicit PipelineRng(const ModelConfig& config);
  struct Offsets {
    std::vector<uint64_t> unit_start;  // per pipeline unit, from the forward's start
    uint64_t forward = 0;              // one whole forward
  };
  // For input ids of `shape` (global, [B, T]); the default generator is left as it was.
  const Offsets& at(const Shape& shape);

 private:
  std::shared_ptr<CausalLM> meta_;
  std::map<std::vector<int64_t>, Offsets> cache_;
};

}  // namespace mt::cli
