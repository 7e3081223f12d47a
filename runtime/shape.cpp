// Shape helpers: construction, strides, broadcasting and dim wrapping.
#include "runtime/shape.h"

#include "runtime/error.h"

namespace mt {

Shape::Shape(std::initializer_list<int64_t> dims) {
  MT_CHECK(dims.size() <= kMaxDims, "shape has {} dims; at most {} are supported", dims.size(), kMaxDims);
  for (int64_t v : dims) d_[n_++] = v;
}

Shape::Shape(const std::vector<int64_t>& dims) {
  MT_CHECK(dims.size() <= kMaxDims, "shape has {} dims; at most {} are supported", dims.size(), kMaxDims);
  for (int64_t v : dims) d_[n_++] = v;
}

Shape Shape::filled(int n, int64_t value) {
  Shape s;
  s.resize(n, value);
  return s;
}

void Shape::push_back(int64_t v) {
  MT_CHECK(n_ < kMaxDims, "shape {} cannot grow past {} dims", *this, kMaxDims);
  d_[n_++] = v;
}

void Shape::insert(int pos, int64_t v) {
  MT_CHECK(n_ < kMaxDims, "shape {} cannot grow past {} dims", *this, kMaxDims);
  for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
  d_[pos] = v;
  ++n_;
}

void Shape::erase(int pos) {
  for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
  --n_;
}

void Shape::resize(int n, int64_t fill) {
  MT_CHECK(n >= 0 && n <= kMaxDims, "shape cannot have {} dims (at most {})", n, kMaxDims);
  for (int i = n_; i < n; ++i) d_[i] = fill;
  n_ = n;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  bool overflow = false;
  for (int i = 0; i < n_; ++i) overflow |= !checked_mul(n, d_[i], &n);
  // A zero size makes the product 0 whatever the others are; only a non-empty shape can overflow.
  if (overflow && std::find(d_, d_ + n_, int64_t{0}) == d_ + n_) [[unlikely]]
    MT_FAIL("shape {} has more elements than an int64 can count (the product of its sizes overflows)", *this);
  return overflow ? 0 : n;
}

Shape Shape::contiguous_strides() const {
  Shape s;
  s.n_ = n_;
  int64_t acc = 1;
  for (int i = n_ - 1; i >= 0; --i) {
    s.d_[i] = acc;
    // The product past the outermost dim is never a stride: not computing it keeps [2^62, 4] valid.
    if (i > 0 && !checked_mul(acc, std::max<int64_t>(d_[i], 1), &acc)) [[unlikely]]
      MT_FAIL("shape {} has more elements than an int64 can count (its strides overflow)", *this);
  }
  return s;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  int n = std::max(a.size(), b.size());
  Shape out = Shape::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    int ia = a.size() - n + i, ib = b.size() - n + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    MT_CHECK(da == db || da == 1 || db == 1,
             "{}: shapes {} and {} cannot be broadcast (dim {} from the right: {} vs {})", op, a, b,
             n - i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int wrap_dim(int64_t dim, int ndim, const char* op) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  MT_CHECK(dim >= lo && dim <= hi, "{}: dim {} out of range for a {}-D tensor (expected [{}, {}])", op,
           dim, ndim, lo, hi);
  return static_cast<int>(dim < 0 ? dim + std::max(ndim, 1) : dim);
}

}  // namespace mt
