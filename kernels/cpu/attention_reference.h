// The double-precision scalar attention (forward and backward) that the blocked CPU kernels are
// tested against: one query row at a time, sums in double, single-threaded, contiguous f32 or f64
// operands. Not in the kernel table; tests call it directly.
#pragma once

#include "kernels/params.h"

namespace mt::cpu {

void attention_reference(const AttentionParams& p);
void attention_bwd_reference(const AttentionBwdParams& p);

}  // namespace mt::cpu
