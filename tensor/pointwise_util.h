// Helpers shared by op front ends (internal to tensor/).
#pragma once

#include "kernels/view.h"
#include "tensor/tensor.h"

namespace mt {

// t's kernel view broadcast to `shape` (zero strides on broadcast dims, no Tensor created).
KView broadcast_view(const Tensor& t, const Shape& shape);
// Throws naming `op` unless both are defined and on one device.
void check_same_device(const Tensor& a, const Tensor& b, const char* op);

}  // namespace mt
