// Reductions over dims: sum, mean, max, min, argmax, argmin, var. A reduction with an empty dim
// list reduces every dim. max/min gradients split evenly among tied maxima.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace mt {

enum class KeepDim { kNo, kYes };

Tensor sum(const Tensor& x);  // all dims -> 0-D
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, KeepDim keep = KeepDim::kNo);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, KeepDim keep = KeepDim::kNo);
Tensor max(const Tensor& x);
Tensor max(const Tensor& x, int64_t dim, KeepDim keep = KeepDim::kNo);
Tensor min(const Tensor& x);
Tensor min(const Tensor& x, int64_t dim, KeepDim keep = KeepDim::kNo);
Tensor argmax(const Tensor& x, int64_t dim, KeepDim keep = KeepDim::kNo);  // i64
Tensor argmin(const Tensor& x, int64_t dim, KeepDim keep = KeepDim::kNo);  // i64
// Variance with Bessel-style correction (1 = unbiased, 0 = population).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction = 1,
           KeepDim keep = KeepDim::kNo);

}  // namespace mt
