// Shape: a small fixed-capacity vector of int64 sizes (or strides). Tensors carry two of them;
// keeping them inline (no heap) is what keeps a tiny op well under a microsecond.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace mt {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);
  static Shape filled(int n, int64_t value);

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  const int64_t* data() const { return d_; }
  int64_t* data() { return d_; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  int64_t back() const { return d_[n_ - 1]; }

  void push_back(int64_t v);
  void insert(int pos, int64_t v);
  void erase(int pos);
  void resize(int n, int64_t fill = 0);
  std::vector<int64_t> vec() const { return std::vector<int64_t>(d_, d_ + n_); }

  // Product of the sizes; throws naming the shape when it does not fit int64 (a corrupt or
  // hostile size must not wrap around to a small element count).
  int64_t numel() const;
  // Row-major strides for these sizes.
  Shape contiguous_strides() const;

  bool operator==(const Shape& o) const {
    return n_ == o.n_ && std::equal(d_, d_ + n_, o.d_);
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

// a * b into *out; false (and *out unspecified) when the product overflows int64. Size arithmetic
// on values from files and flags goes through this (or checked_product) before any allocation.
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
inline bool checked_add(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

// Broadcast two shapes (numpy rules); throws naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Normalize a possibly negative dim against rank `ndim`; throws naming `op`.
int wrap_dim(int64_t dim, int ndim, const char* op);

}  // namespace mt

template <>
struct fmt::formatter<mt::Shape> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  auto format(const mt::Shape& s, fmt::format_context& ctx) const {
    auto out = fmt::format_to(ctx.out(), "[");
    for (int i = 0; i < s.size(); ++i) {
      if (i) out = fmt::format_to(out, ", ");
      out = fmt::format_to(out, "{}", s[i]);
    }
    return fmt::format_to(out, "]");
  }
};
