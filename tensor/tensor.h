// Tensor: a cheap handle to a TensorImpl (storage, dtype, device, sizes, strides, offset, and
// autograd state). Views share storage. Everything a model computes with is a Tensor; the ops are
// free functions in tensor/ops.h, view and convenience methods live here.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/view.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/shape.h"
#include "tensor/dist_spec.h"
#include "tensor/hooks.h"
#include "tensor/rc.h"

namespace mt {

class Node;
class Tensor;

// A block of memory on a device. Meta tensors have no Storage.
class Storage : public RefCounted {
 public:
  Storage(size_t nbytes, Device device);
  ~Storage();
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // Bumped by every in-place write; autograd uses it to catch modified saved tensors.
  uint32_t version = 0;
  // Frees the memory while every tensor viewing it stays alive (FSDP's reshard after forward,
  // plan/fsdp_buffer.h); reading it before allocate_data() is a bug. allocate_data() gets
  // nbytes() again, contents undefined. Meta storages only count.
  void free_data();
  void allocate_data();
  bool has_data() const { return !freed_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool freed_ = false;
};

using GradHook = std::function<Tensor(const Tensor& grad)>;        // may return a replacement
using PostAccumulateHook = std::function<void(const Tensor& leaf)>;  // after .grad is updated

struct AutogradMeta {
  std::unique_ptr<Tensor> grad;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;  // leaves only
  HookList<GradHook> hooks;
  HookList<PostAccumulateHook> post_accumulate_hooks;
  bool retains_grad = false;
  // The dtype .grad is accumulated in when it is first created (Tensor::set_grad_dtype); unset:
  // the tensor's own dtype.
  std::optional<DType> grad_dtype;
};

class TensorImpl : public RefCounted {
 public:
  Rc<Storage> storage;
  Shape sizes, strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::kF32;
  Device device;
  bool requires_grad = false;
  std::unique_ptr<AutogradMeta> autograd;
  // Distributed spec (mesh/dtensor.h); null for a plain local tensor. Never copied by make_view,
  // detach or copies: only mesh/dtensor.cpp attaches one (a view of a DTensor's storage is local).
  std::shared_ptr<const DistSpec> dist;

  AutogradMeta& meta();  // creates on first use
};

struct TensorOptions {
  DType dtype = DType::kF32;
  Device device = Device::cpu();
  bool requires_grad = false;

  TensorOptions() = default;
  TensorOptions(DType t) : dtype(t) {}  // NOLINT: `zeros({2}, DType::kF64)` reads well
  TensorOptions with_dtype(DType t) const { auto o = *this; o.dtype = t; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_grad(bool g = true) const { auto o = *this; o.requires_grad = g; return o; }
};

enum class MemoryFormat { kPreserve, kContiguous };

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Rc<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata ----
  bool defined() const { return static_cast<bool>(impl_); }
  TensorImpl* impl() const { return impl_.get(); }
  int dim() const { return impl_->sizes.size(); }
  // The logical shape: for a DTensor the global shape (its spec's), else the storage geometry.
  const Shape& shape() const { return impl_->dist ? dist_global_shape() : impl_->sizes; }
  // The shape of the elements this rank holds (== shape() for a plain tensor).
  const Shape& local_shape() const { return impl_->sizes; }
  const Shape& strides() const { return impl_->strides; }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape().numel(); }
  int64_t offset() const { return impl_->offset; }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  bool is_contiguous() const;
  bool is_meta() const { return impl_->device.is_meta(); }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }
  int64_t use_count() const { return impl_ ? impl_->use_count() : 0; }
  TensorOptions options() const;
  // DTensor (mesh/dtensor.h): a spec is attached and the storage is the local shard.
  bool is_distributed() const { return impl_ && impl_->dist; }
  const DistSpec* dist_spec() const { return impl_ ? impl_->dist.get() : nullptr; }

  // Raw data of the first element (CPU or CUDA pointer); nullptr for meta or empty tensors. A
  // DTensor's memory is only this rank's shard: throws unless it is replicated (raw_memory_view).
  void* data_ptr() const;
  template <class T> T* data() const { return static_cast<T*>(data_ptr()); }
  KView view_info() const;  // what kernels see: a DTensor's local shard (local sizes and pointer)
  // The single element as double (or i64 when integral); the tensor must have one element. These
  // and to_vector / str read memory: a DTensor must be replicated (raw_memory_view).
  double item() const;
  int64_t item_int() const;
  // Copy out to a vector of T (converting); any device, any strides.
  template <class T> std::vector<T> to_vector() const;

  // ---- autograd ----
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const;
  Tensor grad() const;                 // undefined if none
  void set_grad(const Tensor& g) const;  // undefined clears
  // Accumulate this leaf's .grad in `dtype` (e.g. f32 for a bf16 parameter whose gradients of
  // several backward passes are summed: one rounding at the end instead of one per pass); nullopt
  // restores the default (the tensor's dtype). Applies when backward creates .grad; an existing
  // .grad keeps its dtype and gradients are converted to it.
  void set_grad_dtype(std::optional<DType> dtype) const;
  std::optional<DType> grad_dtype() const;
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;
  void retain_grad();
  // Reverse-mode from this tensor. grad defaults to 1 for a one-element tensor.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false,
                bool create_graph = false) const;
  HookHandle register_hook(GradHook hook);
  HookHandle register_post_accumulate_grad_hook(PostAccumulateHook hook);
  Tensor detach() const;  // shares storage, no history (a DTensor stays one)

  // ---- views (share storage; differentiable) ----
  Tensor view(const Shape& shape) const;      // one dim may be -1
  Tensor reshape(const Shape& shape) const;   // view if possible, else copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a dim
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor as_strided(const Shape& sizes, const Shape& strides, int64_t offset) const;

  // ---- copies (a DTensor's copy is a DTensor with the same spec: each rank copies its shard) ----
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType t) const;
  Tensor to(Device d) const;

  // ---- in place (not recorded by autograd; error on tensors that need grad in grad mode) ----
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double value);
  Tensor& zero_();
  Tensor& add_(const Tensor& other, double alpha = 1);
  Tensor& mul_(double value);
  Tensor& mul_(const Tensor& other);

  // Printing, PyTorch-like. A DTensor that is not replicated prints this rank's local part, labelled
  // as such (its values are not the tensor's).
  std::string str() const;
  // Debug summary: "f32[2, 3] cpu".
  std::string desc() const;

 private:
  const Shape& dist_global_shape() const;
  Rc<TensorImpl> impl_;
};

// ---- factories ----
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor arange(double start, double end, double step = 1, TensorOptions opts = DType::kI64);
Tensor arange(int64_t end, TensorOptions opts = DType::kI64);
Tensor scalar_tensor(double value, TensorOptions opts = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
// From host values (converted to opts.dtype), e.g. from_vector<float>({1, 2, 3, 4}, {2, 2}).
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts = dtype_of<T>::value);
template <class T>
Tensor from_vector(const std::vector<T>& values) {
  return from_vector<T>(values, Shape{static_cast<int64_t>(values.size())});
}

// Internal: a tensor sharing `base`'s storage with new geometry (no autograd).
Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset);
// Internal: the local shard of a DTensor as a plain tensor sharing storage (no autograd); a plain
// tensor is returned as is.
Tensor local_view(const Tensor& t);
// The one check every API that reads or writes a tensor's raw memory makes (data_ptr, item,
// to_vector, printing, the safetensors writers, ...): a DTensor's storage holds only this rank's
// shard, so its memory read as the whole tensor is wrong. Returns a tensor whose memory holds all
// of t's values: t itself when plain, the local view of a DTensor replicated on every mesh dim.
// Throws for any other DTensor, naming `api`, the tensor (`name` when given), its placements and
// the fix: mt::full_tensor (mesh/dtensor.h) gathers it, mt::to_local gives this rank's shard.
Tensor raw_memory_view(const Tensor& t, std::string_view api, std::string_view name = {});
// Throws unless t may be written in place (not a tensor needing grad while grad mode is on).
void check_inplace(const Tensor& t, const char* op);
void bump_version(const Tensor& t);

}  // namespace mt

template <>
struct fmt::formatter<mt::Tensor> : fmt::formatter<std::string_view> {
  auto format(const mt::Tensor& t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(t.defined() ? t.desc() : "undefined", ctx);
  }
};
