// Warmup + cosine learning-rate schedule (see schedule.h).
#include "optim/schedule.h"

#include <cmath>
#include <numbers>

#include "runtime/error.h"

namespace mt {

double LrSchedule::lr(int64_t step) const {
  MT_CHECK(step >= 0, "LrSchedule::lr: step {} is negative", step);
  MT_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps,
           "LrSchedule: need 0 <= warmup_steps <= total_steps (got warmup_steps {}, total_steps {})",
           warmup_steps, total_steps);
  MT_CHECK(std::isfinite(max_lr) && std::isfinite(min_lr) && max_lr >= 0 && min_lr >= 0,
           "LrSchedule: max_lr {} and min_lr {} must be finite and >= 0", max_lr, min_lr);
  if (step < warmup_steps)
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= total_steps) return min_lr;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + (max_lr - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace mt
