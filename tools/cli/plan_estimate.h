// `meshtrain plan --estimate`, `--sweep` and `--calibrate` (docs/estimate.md): the flags and the
// three front ends run_plan (plan.cpp) hands over to.
#pragma once

#include <vector>

#include "tools/cli/args.h"

namespace mt::cli {

// The estimate flags, appended to `meshtrain plan`'s own.
std::vector<FlagSpec> estimate_flags();
bool wants_estimate(const Args& args);  // --estimate, --sweep or --calibrate given
int run_plan_estimate(const Args& args);

}  // namespace mt::cli
