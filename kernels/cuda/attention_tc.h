// bf16 / f16 attention on tensor cores (kernels/cuda/attention_tc.cu), reached through the
// attention / attention_bwd kernels of attention.cu when attention_tensor_core_ok() holds. lse is
// f32; q, k, v, out, gout and the gradients are contiguous and 16-byte aligned.
#pragma once

#include "kernels/params.h"

namespace mt {

void attention_tc(const AttentionParams& p);
void attention_tc_bwd(const AttentionBwdParams& p);

}  // namespace mt
