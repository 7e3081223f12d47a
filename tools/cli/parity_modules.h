// `meshtrain parity --per-module` (docs/cli.md, "parity"): bisection help. The parallel model is
// given the reference's weights (each rank its shards), then both sides run one forward/backward
// on the same batch with the same random numbers, with hooks on every module recording its first
// output and its input gradient. Outputs are compared in forward order, input gradients in
// backward order, and the first module beyond the tolerance is named. A parallel output that is
// a DTensor is gathered (collective); a plain one is compared where it has the reference's shape
// and the same values on every rank (replicated); a local shard or partial sum with no DTensor to
// say so is reported as not compared.
#pragma once

#include <functional>

#include <nlohmann/json.hpp>

#include "models/llama.h"
#include "tools/cli/parallel.h"
#include "tools/cli/trainer.h"

namespace mt::cli {

// {"modules": [{"module", "output_rel", "input_grad_rel"}...], "first_difference": null or
// {"module", "what"}}; a rel is null where it was not compared. Collective. Leaves gradients on
// both models (the caller is done with them).
nlohmann::json per_module_check(CausalLM& model, Trainer& trainer, CausalLM& ref_model, Trainer& ref_trainer,
                                const std::function<TokenBatch()>& next, const std::function<TokenBatch()>& ref_next,
                                int64_t step, const PlanContext& ctx, double tol);

}  // namespace mt::cli
