// Tensor and Storage basics: metadata, factories, copies, casts, in-place updates.
#include "tensor/tensor.h"

#include <algorithm>
#include <cstring>

#include "kernels/registry.h"
#include "runtime/allocator.h"
#include "runtime/cuda/device.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/dist_spec.h"
#include "tensor/meta_memory.h"

namespace mt {

// ---- Storage ----------------------------------------------------------------------------------

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_meta()) {  // a counted storage without memory (tensor/meta_memory.h)
    meta_memory_alloc(nbytes);
    return;
  }
  data_ = device_alloc(device, nbytes);  // CUDA: the caching allocator, on the current stream
}

Storage::~Storage() { free_data(); }

void Storage::free_data() {
  if (freed_) return;
  if (device_.is_meta()) {
    meta_memory_free(nbytes_);
  } else {
    device_free(device_, data_, nbytes_);
    data_ = nullptr;
  }
  freed_ = true;
}

void Storage::allocate_data() {
  if (!freed_) return;
  if (device_.is_meta())
    meta_memory_alloc(nbytes_);
  else
    data_ = device_alloc(device_, nbytes_);
  freed_ = false;
}

AutogradMeta& TensorImpl::meta() {
  if (!autograd) autograd = std::make_unique<AutogradMeta>();
  return *autograd;
}

// ---- metadata ---------------------------------------------------------------------------------

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }

const Shape& Tensor::dist_global_shape() const { return impl_->dist->global_shape(); }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (impl_->sizes.numel() == 0) return true;  // no element to be out of place (local storage)
  int64_t expect = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (impl_->sizes[i] != 1 && impl_->strides[i] != expect) return false;
    expect *= impl_->sizes[i];
  }
  return true;
}

TensorOptions Tensor::options() const {
  TensorOptions o;
  o.dtype = dtype();
  o.device = device();
  return o;
}

namespace {
void* storage_ptr(const TensorImpl& impl) {
  if (!impl.storage) return nullptr;
  char* base = static_cast<char*>(impl.storage->data());
  if (base == nullptr) return nullptr;  // empty storage: an offset on null is UB
  return base + impl.offset * dtype_size(impl.dtype);
}
}  // namespace

void* Tensor::data_ptr() const {
  if (impl_->dist && impl_->storage) [[unlikely]]
    return raw_memory_view(*this, "data_ptr").data_ptr();
  return storage_ptr(*impl_);
}

KView Tensor::view_info() const {
  KView v;
  v.data = storage_ptr(*impl_);
  v.dtype = dtype();
  v.sizes = impl_->sizes;  // a DTensor's kernels see its local shard
  v.strides = strides();
  return v;
}

Tensor raw_memory_view(const Tensor& t, std::string_view api, std::string_view name) {
  const DistSpec* d = t.dist_spec();
  if (!d) return t;
  MT_CHECK(d->is_replicated(),
           "{}: {}{} is a DTensor with placements {}: its memory holds only this rank's {} (local shape {}), not "
           "the tensor. Gather it first with mt::full_tensor(t) (collective: every rank calls it; "
           "mt::full_tensors for named tensors), or take this rank's shard with mt::to_local(t)",
           api, name.empty() ? "" : fmt::format("tensor '{}' ", name),
           fmt::format("{}{} {}", dtype_name(t.dtype()), t.shape(), t.device()), d->placements_str(),
           d->has_partial() ? "partial term" : "shard", t.local_shape());
  return local_view(t);
}

namespace {
// Values are read from memory: only a replicated DTensor holds all of them here.
Tensor readable(const Tensor& t, const char* api) {
  if (t.is_meta() && MetaKernelsGuard::active()) return zeros(t.local_shape(), t.dtype());  // shape inference
  return raw_memory_view(t, api);
}
}  // namespace

Tensor local_view(const Tensor& t) {
  if (!t.is_distributed()) return t;
  Tensor out = make_view(t, t.local_shape(), t.strides(), t.offset());
  if (!t.impl()->storage) out.impl()->device = t.device();
  return out;
}

double Tensor::item() const {
  MT_CHECK(numel() == 1, "item: tensor {} has {} elements, expected exactly 1", desc(), numel());
  Tensor host = readable(*this, "item").to(Device::cpu()).to(DType::kF64).contiguous();
  return *host.data<double>();
}

int64_t Tensor::item_int() const {
  MT_CHECK(numel() == 1, "item_int: tensor {} has {} elements, expected exactly 1", desc(), numel());
  Tensor host = readable(*this, "item_int").to(Device::cpu()).to(DType::kI64).contiguous();
  return *host.data<int64_t>();
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = readable(*this, "to_vector").to(Device::cpu()).to(dtype_of<T>::value).contiguous();
  std::vector<T> out(static_cast<size_t>(numel()));
  if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size() * sizeof(T));
  return out;
}
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

std::string Tensor::desc() const {
  if (impl_->dist)
    return fmt::format("{}{} {} {}", dtype_name(dtype()), shape(), device(), impl_->dist->placements_str());
  return fmt::format("{}{} {}", dtype_name(dtype()), shape(), device());
}

// ---- factories --------------------------------------------------------------------------------

Tensor empty_strided(const Shape& shape, const Shape& strides, TensorOptions opts) {
  for (int i = 0; i < shape.size(); ++i)
    MT_CHECK(shape[i] >= 0, "empty: negative size {} in shape {}", shape[i], shape);
  auto impl = make_rc<TensorImpl>();
  // Elements spanned and their bytes, refusing int64 overflow: a huge shape must fail here with
  // its shape named, not wrap around to a small allocation that later code overruns.
  const bool has_zero = std::find(shape.begin(), shape.end(), int64_t{0}) != shape.end();
  int64_t extent = has_zero ? 0 : 1, nbytes = 0;
  bool overflow = false;
  for (int i = 0; i < shape.size() && extent > 0; ++i) {
    int64_t span = 0;
    overflow |= !checked_mul(shape[i] - 1, strides[i], &span) || !checked_add(extent, span, &extent);
  }
  overflow |= !checked_mul(extent, dtype_size(opts.dtype), &nbytes);
  MT_CHECK(!overflow, "empty: a {} tensor of shape {} would need more than 2^63 bytes", opts.dtype, shape);
  if (!opts.device.is_meta() || MetaMemoryScope::active()) impl->storage = make_rc<Storage>(static_cast<size_t>(nbytes), opts.device);
  impl->sizes = shape;
  impl->strides = strides;
  impl->dtype = opts.dtype;
  impl->device = opts.device;
  impl->requires_grad = opts.requires_grad;
  if (opts.requires_grad)
    MT_CHECK(is_floating(opts.dtype), "only floating tensors can require grad, not {}", opts.dtype);
  return Tensor(std::move(impl));
}

Tensor empty(const Shape& shape, TensorOptions opts) {
  return empty_strided(shape, shape.contiguous_strides(), opts);
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  bool grad = opts.requires_grad;
  Tensor t = empty(shape, opts.with_grad(false));
  if (!t.is_meta()) t.fill_(value);
  if (grad) t.requires_grad_();
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full(Shape{}, value, opts); }
namespace {
// A DTensor like `t` (same spec) filled by `make` on the local shape.
template <class F>
Tensor like(const Tensor& t, F make) {
  Tensor out = make(t.local_shape(), t.options());
  out.impl()->dist = t.impl()->dist;
  return out;
}
}  // namespace

Tensor empty_like(const Tensor& t) { return like(t, [](const Shape& s, TensorOptions o) { return empty(s, o); }); }
Tensor zeros_like(const Tensor& t) { return like(t, [](const Shape& s, TensorOptions o) { return zeros(s, o); }); }
Tensor ones_like(const Tensor& t) {
  MT_CHECK(!t.is_distributed() || !t.impl()->dist->has_partial(),
           "ones_like: {} is Partial: every rank would hold a term of ones", t.desc());
  return like(t, [](const Shape& s, TensorOptions o) { return ones(s, o); });
}

Tensor arange(double start, double end, double step, TensorOptions opts) {
  MT_CHECK(step != 0, "arange: step must be non-zero");
  auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor t = empty(Shape{std::max<int64_t>(n, 0)}, opts);
  ArangeParams p;
  p.out = t.view_info();
  p.start = start;
  p.step = step;
  if (n > 0) MT_KERNEL(t.device().type, arange, p);
  return t;
}

Tensor arange(int64_t end, TensorOptions opts) { return arange(0.0, static_cast<double>(end), 1.0, opts); }

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts) {
  MT_CHECK(static_cast<int64_t>(values.size()) == shape.numel(),
           "from_vector: {} values do not fill shape {} ({} elements)", values.size(), shape,
           shape.numel());
  bool grad = opts.requires_grad;
  Tensor host = empty(shape, TensorOptions(dtype_of<T>::value));
  if (!values.empty()) std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(T));
  Tensor out = host.to(opts.dtype).to(opts.device);
  if (out.same(host) && grad) out = host;
  if (grad) out.requires_grad_();
  return out;
}
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);

Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset) {
  auto impl = make_rc<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->device = base.device();
  return Tensor(std::move(impl));
}

// ---- copies -----------------------------------------------------------------------------------

namespace {
// Copies src into a fresh tensor of `dtype` with contiguous layout.
Tensor copy_to_new(const Tensor& src, DType dtype) {
  Tensor out = empty(src.shape(), src.options().with_dtype(dtype));
  if (src.is_meta()) return out;
  CopyParams p{src.view_info(), out.view_info()};
  MT_KERNEL(src.device().type, copy, p);
  return out;
}
}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  if (is_distributed()) [[unlikely]]
    return dist_dispatch1({"clone", DistRule::kLinear}, {*this}, MT_DIST_LOCAL(l[0].clone()));
  Tensor out = copy_to_new(*this, dtype());
  if (needs_grad(*this)) record("CloneBackward", {*this}, out, [](const auto& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  if (is_distributed()) [[unlikely]]  // a cast of Partial terms is a cast of the sum up to rounding
    return dist_dispatch1({"to", is_floating(t) ? DistRule::kLinear : DistRule::kElementwise}, {*this},
                          MT_DIST_LOCAL(l[0].to(t)));
  Tensor out = copy_to_new(*this, t);
  if (needs_grad(*this) && is_floating(t)) {
    DType back = dtype();
    record("ToDTypeBackward", {*this}, out, [back](const auto& g) { return std::vector<Tensor>{g[0].to(back)}; });
  }
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  if (is_distributed()) [[unlikely]]  // each rank moves its shard; the spec stays
    return dist_dispatch1({"to_device", DistRule::kLinear}, {*this},
                          MT_DIST_LOCAL(ctx.meta_run ? l[0] : l[0].to(d)));
  if (d.is_meta()) return empty(shape(), options().with_device(d));
  MT_CHECK(!is_meta(), "to({}): tensor {} is a meta tensor: materialize it, it cannot be moved", d, desc());
  if (d.is_cuda()) cuda::check_device(d, fmt::format("to({}) of {}", d, desc()));
  Tensor out;
  {
    NoGradGuard no_grad;
    Tensor src = contiguous();  // strided sources are packed on their own device first
    out = empty(shape(), options().with_device(d).with_grad(false));
    copy_bytes(out.data_ptr(), d, src.data_ptr(), src.device(),
               static_cast<size_t>(numel() * dtype_size(dtype())));
  }
  if (needs_grad(*this)) {
    Device back = device();
    record("ToDeviceBackward", {*this}, out, [back](const auto& g) { return std::vector<Tensor>{g[0].to(back)}; });
  }
  return out;
}

// ---- in place ---------------------------------------------------------------------------------

void check_inplace(const Tensor& t, const char* op) {
  MT_CHECK(!(GradMode::enabled() && t.requires_grad()),
           "{}: in-place update of {} which requires grad while grad mode is on; wrap it in "
           "NoGradGuard (as optimizers do) or use the out-of-place op",
           op, t.desc());
  MT_CHECK(!t.is_meta() || MetaKernelsGuard::active(), "{}: {} is a meta tensor without storage; materialize it first", op, t.desc());
}

void bump_version(const Tensor& t) {
  if (t.impl()->storage) ++t.impl()->storage->version;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  if (is_distributed() || src.is_distributed()) {
    check_inplace_dist(*this, src, "copy_");
    local_view(*this).copy_(local_view(src));
    return *this;
  }
  Shape b = broadcast_shapes(src.shape(), shape(), "copy_");
  MT_CHECK(b == shape(), "copy_: source {} does not broadcast to destination {}", src.shape(), shape());
  MT_CHECK(!src.is_meta() || MetaKernelsGuard::active(), "copy_: source {} is a meta tensor without storage (destination {})", src.desc(),
           desc());
  Tensor moved = src.device() == device() ? src : src.detach().to(device());  // across devices
  Tensor s = moved.dim() == dim() && moved.shape() == shape() ? moved : moved.expand(shape());
  CopyParams p{s.view_info(), view_info()};
  MT_KERNEL(device().type, copy, p);
  bump_version(*this);
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  MT_CHECK(!is_distributed() || !impl_->dist->has_partial() || value == 0,
           "fill_({}): {} is Partial: every rank would hold a term equal to the value", value, desc());
  FillParams p;
  p.out = view_info();
  p.value = value;
  // Integral fills use int_value; converting an out-of-range double (-inf for a float mask) is UB.
  if (!is_floating(dtype())) {
    MT_CHECK(value >= -0x1p63 && value < 0x1p63, "fill_({}): not representable in {} ({})", value, dtype(), desc());
    p.int_value = static_cast<int64_t>(value);
  }
  MT_KERNEL(device().type, fill, p);
  bump_version(*this);
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::requires_grad_(bool on) {
  MT_CHECK(!on || is_floating(dtype()), "requires_grad_: only floating tensors can require grad, not {}",
           desc());
  MT_CHECK(on || is_leaf(), "requires_grad_(false) on a non-leaf tensor {}: use detach()", desc());
  impl_->requires_grad = on;
  return *this;
}

}  // namespace mt
