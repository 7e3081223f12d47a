// `meshtrain plan --estimate`, `--sweep` and `--calibrate` (docs/estimate.md): the flags and the
// three front ends run_plan (plan.cpp) hands over to.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/cli/args.h"

namespace mt::cli {

// The largest --world (and sweep world) `meshtrain plan` takes: every mesh coordinate is listed.
inline constexpr int64_t kMaxPlanWorld = 65536;

// The estimate flags, appended to `meshtrain plan`'s own.
std::vector<FlagSpec> estimate_flags();
bool wants_estimate(const Args& args);  // --estimate, --sweep or --calibrate given
int run_plan_estimate(const Args& args);

}  // namespace mt::cli
