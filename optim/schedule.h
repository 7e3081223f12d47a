// Learning-rate schedule: linear warmup to max_lr, cosine decay to min_lr, then constant min_lr
// (the nanoGPT / llm.c schedule). Steps count from 0; exact values at the boundaries are in
// docs/optim.md.
#pragma once

#include <cstdint>

namespace mt {

struct LrSchedule {
  double max_lr = 0;
  double min_lr = 0;
  int64_t warmup_steps = 0;  // 0: no warmup
  int64_t total_steps = 0;   // the cosine ends here (>= warmup_steps)

  //   step <  warmup:          max_lr * (step + 1) / warmup
  //   warmup <= step < total:  min_lr + (max_lr - min_lr) * (1 + cos(pi * (step - warmup) /
  //                            (total - warmup))) / 2
  //   step >= total:           min_lr
  double lr(int64_t step) const;
};

}  // namespace mt
