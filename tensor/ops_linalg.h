// Matrix products through the backend GEMM (Eigen on CPU): matmul with numpy semantics
// (1-D operands, batch broadcasting, any transposes without copies), bmm, and linear.
// 16-bit float inputs compute in f32 and round once at the end.
#pragma once

#include "tensor/tensor.h"

namespace mt {

Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // [B, M, K] @ [B, K, N], no broadcasting
// x [..., in] @ weight[out, in]^T + bias[out] (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace mt
