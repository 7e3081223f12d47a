// View ops: new geometry over the same storage, each differentiable. Slicing views backpropagate
// by writing the gradient into a zero tensor of the input's shape (embed_region), which is itself
// differentiable so that double backward works.
#include <functional>
#include <optional>

#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"

namespace mt {
namespace {

using Region = std::function<Tensor(const Tensor&)>;

// Zeros of `base` with g written where `region` looks.
Tensor embed_region(const Tensor& g, const Shape& base, const Region& region) {
  Tensor z = zeros(base, g.options());
  {
    NoGradGuard no_grad;
    region(z).copy_(g);
  }
  if (needs_grad(g))
    record("EmbedRegionBackward", {g}, z, [region](const auto& gg) { return std::vector<Tensor>{region(gg[0])}; });
  return z;
}

// Records `out` as a view of `in` whose gradient is reshaped back / sliced back by `back`.
void record_view(const char* name, const Tensor& in, Tensor& out, std::function<Tensor(const Tensor&)> back) {
  if (needs_grad(in))
    record(name, {in}, out, [back = std::move(back)](const auto& g) { return std::vector<Tensor>{back(g[0])}; });
}

std::optional<Shape> view_strides(const Shape& old_sizes, const Shape& old_strides, const Shape& sizes) {
  if (old_sizes.size() == 0 || sizes.numel() == 0) return sizes.contiguous_strides();
  Shape strides = Shape::filled(sizes.size(), 0);
  int view_d = sizes.size() - 1;
  int64_t chunk_base = old_strides.back(), tensor_numel = 1, view_numel = 1;
  for (int d = old_sizes.size() - 1; d >= 0; --d) {
    tensor_numel *= old_sizes[d];
    if (d == 0 || (old_sizes[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || sizes[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base;
        view_numel *= sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

Shape infer_size(const Shape& shape, int64_t numel, const char* op, const Tensor& t) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      MT_CHECK(infer < 0, "{}: only one dim may be -1 in {}", op, shape);
      infer = i;
    } else {
      MT_CHECK(out[i] >= 0, "{}: invalid size {} in {}", op, out[i], shape);
      known *= out[i];
    }
  }
  if (infer >= 0) {
    MT_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for {} ({} elements){}", op, shape,
             t.desc(), numel, known == 0 ? ": -1 is ambiguous beside a dim of size 0; give every size" : "");
    out[infer] = numel / known;
  }
  MT_CHECK(out.numel() == numel, "{}: shape {} is invalid for {} ({} elements)", op, shape, t.desc(), numel);
  return out;
}

}  // namespace

Tensor Tensor::as_strided(const Shape& sizes, const Shape& strides, int64_t off) const {
  MT_CHECK(!needs_grad(*this), "as_strided: not differentiable; {} requires grad (detach it first)", desc());
  MT_CHECK(!is_distributed(), "as_strided: not defined for DTensor {} (use to_local())", desc());
  return make_view(*this, sizes, strides, off);
}

Tensor Tensor::view(const Shape& shape) const {
  Shape sizes = infer_size(shape, numel(), "view", *this);
  if (is_distributed()) [[unlikely]] {
    DistOp d{"view", DistRule::kView};
    d.shape = sizes;
    return dist_dispatch1(d, {*this}, MT_DIST_LOCAL(l[0].view(ctx.meta_run ? sizes : ctx.out_local_shape)));
  }
  auto st = view_strides(this->shape(), strides(), sizes);
  MT_CHECK(st.has_value(),
           "view: cannot view {} with strides {} as {}: the memory is not laid out for it; use "
           "reshape() (which copies)",
           desc(), strides(), sizes);
  Tensor out = make_view(*this, sizes, *st, offset());
  Shape in_shape = this->shape();
  record_view("ViewBackward", *this, out, [in_shape](const Tensor& g) { return g.reshape(in_shape); });
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape sizes = infer_size(shape, numel(), "reshape", *this);
  if (is_distributed()) [[unlikely]] {
    DistOp d{"reshape", DistRule::kView};
    d.shape = sizes;
    return dist_dispatch1(d, {*this}, MT_DIST_LOCAL(l[0].reshape(ctx.meta_run ? sizes : ctx.out_local_shape)));
  }
  if (view_strides(this->shape(), strides(), sizes)) return view(sizes);
  return contiguous().view(sizes);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  MT_CHECK(static_cast<int>(dims.size()) == dim(), "permute: {} dims given for {}", dims.size(), desc());
  if (is_distributed()) [[unlikely]] {
    DistOp d{"permute", DistRule::kView};
    d.args[0] = 1;
    for (int64_t v : dims) d.shape.push_back(wrap_dim(v, dim(), "permute"));
    return dist_dispatch1(d, {*this}, MT_DIST_LOCAL(l[0].permute(dims)));
  }
  Shape sizes, st;
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int d = wrap_dim(dims[i], dim(), "permute");
    MT_CHECK(inverse[d] < 0, "permute: dim {} repeated for {}", d, desc());
    inverse[d] = static_cast<int64_t>(i);
    sizes.push_back(shape()[d]);
    st.push_back(strides()[d]);
  }
  Tensor out = make_view(*this, sizes, st, offset());
  record_view("PermuteBackward", *this, out, [inverse](const Tensor& g) { return g.permute(inverse); });
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int a = wrap_dim(d0, dim(), "transpose"), b = wrap_dim(d1, dim(), "transpose");
  if (dim() == 0) return *this;
  std::vector<int64_t> perm(dim());
  for (int i = 0; i < dim(); ++i) perm[i] = i;
  std::swap(perm[a], perm[b]);
  return permute(perm);
}

Tensor Tensor::t() const {
  MT_CHECK(dim() <= 2, "t: expects at most 2-D, got {}", desc());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  int dd = wrap_dim(d, dim(), "slice");
  MT_CHECK(step > 0, "slice: step must be positive, got {}", step);
  if (is_distributed()) [[unlikely]] {
    DistOp op{"slice", DistRule::kSlice};
    op.args[0] = dd;
    op.args[2] = 1;  // linear: Partial passes
    op.key = Shape{start, end, step};
    return dist_dispatch1(op, {*this}, MT_DIST_LOCAL(l[0].slice(dd, start, end, step)));
  }
  int64_t n = shape()[dd];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sizes = shape(), st = strides();
  sizes[dd] = (end - start + step - 1) / step;
  st[dd] *= step;
  Tensor out = make_view(*this, sizes, st, offset() + start * strides()[dd]);
  Shape in_shape = shape();
  record_view("SliceBackward", *this, out, [=](const Tensor& g) {
    return embed_region(g, in_shape, [=](const Tensor& z) { return z.slice(dd, start, end, step); });
  });
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  int dd = wrap_dim(d, dim(), "narrow");
  int64_t n = shape()[dd];
  if (start < 0) start += n;
  MT_CHECK(start >= 0 && length >= 0 && start + length <= n,
           "narrow: [{}, {}) is out of range for dim {} of size {} in {}", start, start + length, dd, n,
           desc());
  return slice(dd, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  int dd = wrap_dim(d, dim(), "select");
  if (is_distributed()) [[unlikely]] {
    DistOp op{"select", DistRule::kSlice};
    op.args[0] = dd;
    op.args[1] = 1;  // the dim is removed
    op.args[2] = 1;  // linear: Partial passes
    return dist_dispatch1(op, {*this}, MT_DIST_LOCAL(l[0].select(dd, index)));
  }
  int64_t n = shape()[dd];
  MT_CHECK(index >= -n && index < n, "select: index {} out of range for dim {} of size {} in {}", index, dd,
           n, desc());
  if (index < 0) index += n;
  Shape sizes = shape(), st = strides();
  sizes.erase(dd);
  st.erase(dd);
  Tensor out = make_view(*this, sizes, st, offset() + index * strides()[dd]);
  Shape in_shape = shape();
  record_view("SelectBackward", *this, out, [=](const Tensor& g) {
    return embed_region(g, in_shape, [=](const Tensor& z) { return z.select(dd, index); });
  });
  return out;
}

Tensor Tensor::expand(const Shape& shape) const {
  MT_CHECK(shape.size() >= dim(), "expand: cannot expand {} to fewer dims {}", desc(), shape);
  if (is_distributed()) [[unlikely]] {
    DistOp d{"expand", DistRule::kView};
    d.args[0] = 2;
    d.shape = shape;
    return dist_dispatch1(d, {*this}, MT_DIST_LOCAL(l[0].expand(ctx.meta_run ? shape : ctx.out_local_shape)));
  }
  int lead = shape.size() - dim();
  Shape sizes = shape, st = Shape::filled(shape.size(), 0);
  for (int i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      MT_CHECK(shape[i] >= 0, "expand: new leading dim {} must be sized, got {}", i, shape[i]);
      continue;
    }
    int64_t have = this->shape()[i - lead];
    if (shape[i] == -1 || shape[i] == have) {
      sizes[i] = have;
      st[i] = strides()[i - lead];
    } else {
      MT_CHECK(have == 1, "expand: dim {} of {} has size {} and cannot expand to {} (target {})", i - lead,
               desc(), have, shape[i], shape);
      MT_CHECK(shape[i] >= 0, "expand: invalid size {} for dim {} (target {}) of {}", shape[i], i, shape, desc());
    }
  }
  if (sizes == this->shape()) return *this;
  Tensor out = make_view(*this, sizes, st, offset());
  Shape in_shape = this->shape();
  record_view("ExpandBackward", *this, out, [in_shape](const Tensor& g) { return sum_to(g, in_shape); });
  return out;
}

Tensor Tensor::squeeze(int64_t d) const {
  int dd = wrap_dim(d, dim(), "squeeze");
  if (dim() == 0 || shape()[dd] != 1) return *this;
  Shape sizes = shape();
  sizes.erase(dd);
  return view(sizes);
}

Tensor Tensor::squeeze() const {
  Shape sizes;
  for (int64_t s : shape())
    if (s != 1) sizes.push_back(s);
  return sizes == shape() ? *this : view(sizes);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  int dd = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape sizes = shape();
  sizes.insert(dd, 1);
  return view(sizes);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape(Shape{1});
  int s = wrap_dim(start, dim(), "flatten"), e = wrap_dim(end, dim(), "flatten");
  MT_CHECK(s <= e, "flatten: start dim {} after end dim {} for {}", s, e, desc());
  Shape sizes;
  for (int i = 0; i < s; ++i) sizes.push_back(shape()[i]);
  int64_t n = 1;
  for (int i = s; i <= e; ++i) n *= shape()[i];
  sizes.push_back(n);
  for (int i = e + 1; i < dim(); ++i) sizes.push_back(shape()[i]);
  return reshape(sizes);
}

}  // namespace mt
