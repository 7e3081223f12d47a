// Helpers the multi-rank benchmarks share: a barrier over every rank (so that each rank starts a
// timed step together), and a model built from seed 1, on the meta device for parallelize() to
// materialize shard by shard or fully materialized for the one-process baseline.
#pragma once

#include <memory>

#include "mesh/device_mesh.h"
#include "mesh/world.h"
#include "models/config.h"
#include "models/llama.h"
#include "tensor/random.h"

namespace mt::bench {

inline void world_barrier() {
  static DeviceMesh all({world().size()}, {"all"});
  all.comm().barrier();
}

enum class Materialize { kNow, kOnMeta };

inline std::shared_ptr<CausalLM> build_model(const ModelConfig& c, Materialize m) {
  manual_seed(1);
  if (m == Materialize::kNow) return build_causal_lm(c);
  InitDeviceGuard g(Device::meta());
  return build_causal_lm(c);
}

}  // namespace mt::bench
