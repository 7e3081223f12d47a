// Printing tensors, PyTorch-like: nested brackets, long dims summarized with "...". A sharded or
// Partial DTensor prints its local part under a label that says so.
#include <sstream>

#include "tensor/tensor.h"

namespace mt {
namespace {

void print_rec(std::ostringstream& os, const std::vector<double>& v, const Shape& shape, int d,
               int64_t base, const Shape& strides, bool floating, int indent) {
  constexpr int64_t kEdge = 3, kMax = 6;
  if (d == shape.size()) {
    double x = v[static_cast<size_t>(base)];
    os << (floating ? fmt::format("{:.4f}", x) : fmt::format("{}", static_cast<int64_t>(x)));
    return;
  }
  os << "[";
  int64_t n = shape[d];
  for (int64_t i = 0; i < n; ++i) {
    if (n > kMax && i == kEdge) {
      os << "...";
      i = n - kEdge - 1;
      os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
      continue;
    }
    print_rec(os, v, shape, d + 1, base + i * strides[d], strides, floating, indent + 1);
    if (i + 1 < n) os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << "]";
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  const DistSpec* d = dist_spec();
  if (is_meta()) {
    os << "..., meta";
  } else if (d && !d->is_replicated()) {
    // Never the shard's values as the tensor's: label them as this rank's part.
    Tensor local = local_view(*this);
    os << fmt::format("{} {}: ", d->has_partial() ? "local term" : "local shard", local.shape());
    print_rec(os, local.to_vector<double>(), local.shape(), 0, 0, local.shape().contiguous_strides(),
              is_floating(dtype()), 7);
  } else {
    std::vector<double> v = to_vector<double>();
    print_rec(os, v, shape(), 0, 0, shape().contiguous_strides(), is_floating(dtype()), 7);
  }
  os << ", " << desc() << (requires_grad() ? ", requires_grad" : "") << ")";
  return os.str();
}

}  // namespace mt
