// Indexing and joining: index_select, gather, scatter_add, index_add, topk, one_hot, cat, stack,
// split, chunk. Index tensors are i64 or i32; out-of-range indices are errors naming the op.
#pragma once

#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace mt {

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// Out of place: returns x with src added at index along dim.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                 double alpha = 1);
enum class TopkOrder { kLargest, kSmallest };
// Values and i64 indices of the k largest (or smallest) along dim, sorted.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1,
                               TopkOrder order = TopkOrder::kLargest);
Tensor one_hot(const Tensor& index, int64_t num_classes);  // i64 [..., num_classes]

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Views into x; the last piece may be smaller.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace mt
