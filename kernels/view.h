// KView: what a kernel sees of a tensor: a typed pointer, sizes and element strides. Kernels
// compute on views and never allocate; zero strides express broadcasting.
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/shape.h"

namespace mt {

struct KView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape sizes;
  Shape strides;  // in elements

  int ndim() const { return sizes.size(); }
  int64_t numel() const { return sizes.numel(); }
  bool is_contiguous() const {
    if (numel() == 0) return true;
    int64_t expect = 1;
    for (int i = sizes.size() - 1; i >= 0; --i) {
      if (sizes[i] != 1 && strides[i] != expect) return false;
      expect *= sizes[i];
    }
    return true;
  }
  template <class T> T* ptr() const { return static_cast<T*>(data); }
  explicit operator bool() const { return data != nullptr; }
};

}  // namespace mt
