// Indexing and joining front ends: validate shapes, dtypes and (via min/max of the index tensor)
// index ranges, make operands contiguous, allocate outputs, call the index kernels and record
// backward formulas built from the same ops (so double backward works). cat/stack/split/chunk
// are views and copies only. embedding (declared in ops_nn.h) is index_select on rows.
#include "tensor/ops_index.h"

#include <algorithm>

#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/grad_destination.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_pointwise.h"
#include "tensor/ops_reduce.h"
#include "tensor/pointwise_util.h"

namespace mt {
namespace {

void check_index_dtype(const Tensor& index, const char* op) {
  MT_CHECK(index.defined(), "{}: undefined index tensor", op);
  MT_CHECK(index.dtype() == DType::kI64 || index.dtype() == DType::kI32,
           "{}: index must be i64 or i32, got {}", op, index.desc());
}

// Throws unless every value of `index` lies in [0, n); `what` describes the indexed dim.
void check_index_range(const Tensor& index, int64_t n, const char* op, const std::string& what) {
  if (index.numel() == 0) return;
  int64_t lo, hi;
  {
    NoGradGuard no_grad;
    lo = min(index).item_int();
    hi = max(index).item_int();
  }
  const int64_t bad = lo < 0 ? lo : hi;
  MT_CHECK(lo >= 0 && hi < n, "{}: index {} is out of range [0, {}) for {}", op, bad, n, what);
}

bool any_needs_grad(const std::vector<Tensor>& ts) {
  if (!GradMode::enabled()) return false;
  return std::any_of(ts.begin(), ts.end(), [](const Tensor& t) { return t.requires_grad(); });
}

std::string dim_of(int dim, const Tensor& x) { return fmt::format("dim {} of {}", dim, x.desc()); }

void check_at_least_1d(const Tensor& x, const char* op) {
  MT_CHECK(x.defined(), "{}: undefined tensor argument", op);
  MT_CHECK(x.dim() >= 1, "{}: expects a tensor of at least 1 dim, got {}", op, x.desc());
}

// index.size(k) <= t.size(k) for every k (except `skip`, when >= 0).
void check_index_fits(const Tensor& index, const Tensor& t, int skip, const char* op, const char* tname) {
  MT_CHECK(index.dim() == t.dim(), "{}: index {} must have as many dims as {} {}", op, index.desc(), tname,
           t.desc());
  for (int k = 0; k < t.dim(); ++k)
    MT_CHECK(k == skip || index.shape()[k] <= t.shape()[k],
             "{}: index {} is larger than {} {} in dim {}", op, index.shape(), tname, t.shape(), k);
}

// t padded with trailing zeros up to `shape` (each dim of t <= shape), differentiably.
Tensor pad_to(Tensor t, const Shape& shape) {
  for (int d = 0; d < t.dim(); ++d) {
    if (t.shape()[d] == shape[d]) continue;
    Shape zs = t.shape();
    zs[d] = shape[d] - t.shape()[d];
    t = cat({t, zeros(zs, t.options())}, d);
  }
  return t;
}

}  // namespace

namespace {
// Gather-like ops on DTensors: inputs of the output's rank share its placements, the others are
// Replicate, and dim `dim` is not split.
Tensor dist_gather_like(const char* op, int dim, const std::vector<Tensor>& in, DistLocalFn local,
                        bool linear = false, Shape key = {}) {
  DistOp d{op, DistRule::kGatherLike};
  d.args[0] = dim;
  d.args[1] = linear;  // index_add / scatter_add: Partial sources allowed
  d.key = std::move(key);
  return dist_dispatch1(d, in, local);
}
}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "index_select";
  check_at_least_1d(x, op);
  if (any_dist(x, index)) [[unlikely]]
    return dist_gather_like(op, wrap_dim(dim, x.dim(), op), {x, index}, MT_DIST_LOCAL(index_select(l[0], dim, l[1])));
  check_index_dtype(index, op);
  check_same_device(x, index, op);
  MT_CHECK(index.dim() <= 1, "{}: index must be 1-D, got {}", op, index.desc());
  const int d = wrap_dim(dim, x.dim(), op);
  check_index_range(index, x.shape()[d], op, dim_of(d, x));
  Tensor xc = x.contiguous(), ic = index.reshape({-1}).contiguous();
  Shape os = x.shape();
  os[d] = ic.numel();
  Tensor out = empty(os, x.options());
  if (out.numel() > 0) {
    IndexSelectParams p;
    p.in = xc.view_info();
    p.index = ic.view_info();
    p.out = out.view_info();
    p.dim = d;
    MT_KERNEL(x.device().type, index_select, p);
  }
  if (needs_grad(x)) {
    Shape xs = x.shape();
    Tensor xw = x;  // for its grad_destination only (a view: no memory held)
    record("IndexSelectBackward", {x}, out, [xs, d, ic, xw](const auto& g) {
      // Zeros and the rows added in place: in the unit's gradient buffer for zero-copy FSDP
      // gradients (an embedding's weight), else in a fresh tensor (not index_add, whose
      // out-of-place copy of the zeros would cost a second pass over the whole table).
      Tensor dst = grad_destination(xw);
      if (dst.defined())
        dst.zero_();
      else
        dst = zeros(xs, g[0].options());
      Tensor sc = g[0].to(dst.dtype()).contiguous();
      IndexAddParams p;
      p.out = dst.view_info();
      p.index = ic.view_info();
      p.src = sc.view_info();
      p.dim = d;
      p.alpha = 1;
      if (sc.numel() > 0) MT_KERNEL(dst.device().type, index_add, p);
      return std::vector<Tensor>{dst};
    });
  }
  return out;
}

Tensor index_add(const Tensor& x0, int64_t dim, const Tensor& index, const Tensor& src0, double alpha) {
  const char* op = "index_add";
  check_at_least_1d(x0, op);
  if (any_dist(x0, index, src0)) [[unlikely]]
    return dist_gather_like(op, wrap_dim(dim, x0.dim(), op), {x0, index, src0},
                            MT_DIST_LOCAL(index_add(l[0], dim, l[1], l[2], alpha)), true);
  check_index_dtype(index, op);
  check_same_device(x0, index, op);
  check_same_device(x0, src0, op);
  MT_CHECK(index.dim() <= 1, "{}: index must be 1-D, got {}", op, index.desc());
  const int d = wrap_dim(dim, x0.dim(), op);
  bool ok = src0.dim() == x0.dim() && src0.shape()[d] == index.numel();
  for (int k = 0; ok && k < x0.dim(); ++k) ok = k == d || src0.shape()[k] == x0.shape()[k];
  MT_CHECK(ok, "{}: source {} must match {} except in dim {}, where it needs the index length {}", op,
           src0.shape(), x0.shape(), d, index.numel());
  check_index_range(index, x0.shape()[d], op, dim_of(d, x0));
  const DType t = promote(x0.dtype(), src0.dtype());
  Tensor x = x0.to(t), src = src0.to(t);
  Tensor ic = index.reshape({-1}).contiguous();
  Tensor out;
  {
    NoGradGuard no_grad;
    out = x.clone();
    Tensor sc = src.contiguous();
    IndexAddParams p;
    p.out = out.view_info();
    p.index = ic.view_info();
    p.src = sc.view_info();
    p.dim = d;
    p.alpha = alpha;
    if (sc.numel() > 0) MT_KERNEL(x.device().type, index_add, p);
  }
  if (needs_grad(x, src)) {
    const bool src_grad = src.requires_grad();
    record("IndexAddBackward", {x, src}, out, [d, ic, alpha, src_grad](const auto& g) {
      Tensor gs;
      if (src_grad) {
        gs = index_select(g[0], d, ic);
        if (alpha != 1) gs = mul(gs, alpha);
      }
      return std::vector<Tensor>{g[0], gs};
    });
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "gather";
  check_at_least_1d(x, op);
  if (any_dist(x, index)) [[unlikely]]
    return dist_gather_like(op, wrap_dim(dim, x.dim(), op), {x, index}, MT_DIST_LOCAL(gather(l[0], dim, l[1])));
  check_index_dtype(index, op);
  check_same_device(x, index, op);
  const int d = wrap_dim(dim, x.dim(), op);
  check_index_fits(index, x, d, op, "input");
  check_index_range(index, x.shape()[d], op, dim_of(d, x));
  Tensor xc = x.contiguous(), ic = index.contiguous();
  Tensor out = empty(index.shape(), x.options());
  if (out.numel() > 0) {
    GatherParams p;
    p.in = xc.view_info();
    p.index = ic.view_info();
    p.out = out.view_info();
    p.dim = d;
    MT_KERNEL(x.device().type, gather, p);
  }
  if (needs_grad(x)) {
    Shape xs = x.shape();
    record("GatherBackward", {x}, out, [xs, d, ic](const auto& g) {
      return std::vector<Tensor>{scatter_add(zeros(xs, g[0].options()), d, ic, g[0])};
    });
  }
  return out;
}

Tensor scatter_add(const Tensor& x0, int64_t dim, const Tensor& index, const Tensor& src0) {
  const char* op = "scatter_add";
  check_at_least_1d(x0, op);
  if (any_dist(x0, index, src0)) [[unlikely]]
    return dist_gather_like(op, wrap_dim(dim, x0.dim(), op), {x0, index, src0},
                            MT_DIST_LOCAL(scatter_add(l[0], dim, l[1], l[2])), true);
  check_index_dtype(index, op);
  check_same_device(x0, index, op);
  check_same_device(x0, src0, op);
  const int d = wrap_dim(dim, x0.dim(), op);
  check_index_fits(index, x0, d, op, "input");
  check_index_fits(index, src0, -1, op, "source");
  check_index_range(index, x0.shape()[d], op, dim_of(d, x0));
  const DType t = promote(x0.dtype(), src0.dtype());
  Tensor x = x0.to(t), src = src0.to(t);
  Tensor ic = index.contiguous();
  Tensor out;
  {
    NoGradGuard no_grad;
    out = x.clone();
    Tensor sc = src.contiguous();
    ScatterAddParams p;
    p.out = out.view_info();
    p.index = ic.view_info();
    p.src = sc.view_info();
    p.dim = d;
    if (ic.numel() > 0) MT_KERNEL(x.device().type, scatter_add, p);
  }
  if (needs_grad(x, src)) {
    const bool src_grad = src.requires_grad();
    const Shape ss = src.shape();
    record("ScatterAddBackward", {x, src}, out, [d, ic, src_grad, ss](const auto& g) {
      Tensor gs;
      if (src_grad) gs = pad_to(gather(g[0], d, ic), ss);
      return std::vector<Tensor>{g[0], gs};
    });
  }
  return out;
}

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, TopkOrder order) {
  const char* op = "topk";
  check_at_least_1d(x, op);
  const int d = wrap_dim(dim, x.dim(), op);
  if (x.is_distributed()) [[unlikely]] {
    DistOp dop{op, DistRule::kSlice};
    dop.args[0] = d;
    dop.key = Shape{k, static_cast<int64_t>(order)};
    auto r = dist_dispatch(dop, {x}, [&](const std::vector<Tensor>& l, const DistCtx&) {
      auto [v, i] = topk(l[0], k, dim, order);
      return std::vector<Tensor>{v, i};
    });
    return {r[0], r[1]};
  }
  const int last = x.dim() - 1;
  const int64_t n = x.shape()[d];
  MT_CHECK(k >= 0 && k <= n, "{}: k = {} is out of range [0, {}] for dim {} of {}", op, k, n, d, x.desc());
  Tensor xt = (d == last ? x : x.transpose(d, last)).contiguous();
  Shape vs = xt.shape();
  vs[last] = k;
  Tensor values = empty(vs, x.options()), indices = empty(vs, x.options().with_dtype(DType::kI64));
  if (values.numel() > 0) {
    TopkParams p;
    p.in = xt.view_info();
    p.values = values.view_info();
    p.indices = indices.view_info();
    p.k = k;
    p.largest = order == TopkOrder::kLargest;
    MT_KERNEL(x.device().type, topk, p);
  }
  if (d != last) {
    NoGradGuard no_grad;  // plain relayout of fresh outputs; the backward is recorded below
    values = values.transpose(d, last).contiguous().detach();
    indices = indices.transpose(d, last).contiguous().detach();
  }
  if (needs_grad(x)) {
    Shape xs = x.shape();
    Tensor idx = indices;
    record("TopkBackward", {x}, values, [xs, d, idx](const auto& g) {
      return std::vector<Tensor>{scatter_add(zeros(xs, g[0].options()), d, idx, g[0])};
    });
  }
  return {values, indices};
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  const char* op = "one_hot";
  check_index_dtype(index, op);
  if (index.is_distributed()) [[unlikely]] {
    MT_CHECK(num_classes >= 0, "{}: num_classes must be given for a DTensor index {}", op, index.desc());
    return dist_gather_like(op, index.dim(), {index}, MT_DIST_LOCAL(one_hot(l[0], num_classes)), false,
                            Shape{num_classes});
  }
  if (num_classes < 0) {  // -1: infer from the largest index, like PyTorch
    MT_CHECK(num_classes == -1, "{}: num_classes must be >= 0 or -1, got {}", op, num_classes);
    num_classes = index.numel() == 0 ? 0 : max(index).item_int() + 1;
  }
  check_index_range(index, num_classes, op, fmt::format("num_classes {}", num_classes));
  Shape os = index.shape();
  os.push_back(num_classes);
  Tensor out = zeros(os, index.options().with_dtype(DType::kI64));
  if (out.numel() == 0) return out;
  Tensor ic = index.contiguous().unsqueeze(-1);
  ScatterAddParams p;
  Tensor src = ones(ic.shape(), index.options().with_dtype(DType::kI64));
  p.out = out.view_info();
  p.index = ic.view_info();
  p.src = src.view_info();
  p.dim = out.dim() - 1;
  MT_KERNEL(index.device().type, scatter_add, p);
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  const char* op = "cat";
  MT_CHECK(!tensors.empty(), "{}: expects a non-empty list of tensors", op);
  const Tensor& t0 = tensors[0];
  MT_CHECK(t0.defined(), "{}: tensor 0 is undefined", op);
  MT_CHECK(t0.dim() >= 1, "{}: zero-dim tensor 0 ({}) cannot be concatenated", op, t0.desc());
  const int d = wrap_dim(dim, t0.dim(), op);
  if (any_dist(tensors)) [[unlikely]]
    return dist_gather_like(op, d, tensors, MT_DIST_LOCAL(cat(l, dim)));
  DType t = t0.dtype();
  Shape os = t0.shape();
  os[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& ti = tensors[i];
    MT_CHECK(ti.defined(), "{}: tensor {} is undefined", op, i);
    MT_CHECK(ti.device() == t0.device(), "{}: tensor {} is on {} but tensor 0 is on {}", op, i, ti.device(),
             t0.device());
    bool ok = ti.dim() == t0.dim();
    for (int k = 0; ok && k < t0.dim(); ++k) ok = k == d || ti.shape()[k] == t0.shape()[k];
    MT_CHECK(ok, "{}: shape {} of tensor {} does not match shape {} of tensor 0 outside dim {}", op,
             ti.shape(), i, t0.shape(), d);
    t = promote(t, ti.dtype());
    os[d] += ti.shape()[d];
  }
  Tensor out = empty(os, t0.options().with_dtype(t));
  {
    NoGradGuard no_grad;
    int64_t off = 0;
    for (const Tensor& ti : tensors) {
      const int64_t n = ti.shape()[d];
      if (n > 0 && out.numel() > 0) out.narrow(d, off, n).copy_(ti);
      off += n;
    }
  }
  if (any_needs_grad(tensors)) {
    std::vector<int64_t> sizes;
    std::vector<DType> dtypes;
    std::vector<bool> wants;
    for (const Tensor& ti : tensors) {
      sizes.push_back(ti.shape()[d]);
      dtypes.push_back(ti.dtype());
      wants.push_back(ti.requires_grad());
    }
    record("CatBackward", tensors, out, [d, sizes, dtypes, wants](const auto& g) {
      std::vector<Tensor> gs(sizes.size());
      int64_t off = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (wants[i]) gs[i] = g[0].narrow(d, off, sizes[i]).to(dtypes[i]);
        off += sizes[i];
      }
      return gs;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  const char* op = "stack";
  MT_CHECK(!tensors.empty(), "{}: expects a non-empty list of tensors", op);
  MT_CHECK(tensors[0].defined(), "{}: tensor 0 is undefined", op);
  const int d = wrap_dim(dim, tensors[0].dim() + 1, op);
  std::vector<Tensor> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    MT_CHECK(tensors[i].defined(), "{}: tensor {} is undefined", op, i);
    MT_CHECK(tensors[i].shape() == tensors[0].shape(), "{}: shape {} of tensor {} differs from shape {} of tensor 0",
             op, tensors[i].shape(), i, tensors[0].shape());
    parts.push_back(tensors[i].unsqueeze(d));
  }
  return cat(parts, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  const char* op = "split";
  check_at_least_1d(x, op);
  const int d = wrap_dim(dim, x.dim(), op);
  const int64_t n = x.shape()[d];
  MT_CHECK(split_size > 0 || (split_size == 0 && n == 0), "{}: split size must be positive, got {} for {}", op,
           split_size, x.desc());
  if (n == 0) return {x.narrow(d, 0, 0)};
  std::vector<Tensor> out;
  for (int64_t off = 0; off < n; off += split_size) out.push_back(x.narrow(d, off, std::min(split_size, n - off)));
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const char* op = "split";
  check_at_least_1d(x, op);
  const int d = wrap_dim(dim, x.dim(), op);
  const int64_t n = x.shape()[d];
  int64_t total = 0;
  for (int64_t s : sizes) {
    MT_CHECK(s >= 0, "{}: negative size {} in sizes [{}]", op, s, fmt::join(sizes, ", "));
    total += s;
  }
  MT_CHECK(total == n, "{}: sizes [{}] sum to {} but dim {} of {} has size {}", op, fmt::join(sizes, ", "), total,
           d, x.desc(), n);
  std::vector<Tensor> out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(d, off, s));
    off += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  const char* op = "chunk";
  check_at_least_1d(x, op);
  MT_CHECK(chunks > 0, "{}: number of chunks must be positive, got {}", op, chunks);
  const int d = wrap_dim(dim, x.dim(), op);
  const int64_t n = x.shape()[d];
  if (n == 0) return std::vector<Tensor>(static_cast<size_t>(chunks), x.narrow(d, 0, 0));
  return split(x, (n + chunks - 1) / chunks, d);
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  const char* op = "embedding";
  if (any_dist(weight, ids)) [[unlikely]]
    return dist_dispatch1({op, DistRule::kEmbedding}, {weight, ids}, MT_DIST_LOCAL(embedding(l[0], l[1])));
  MT_CHECK(weight.defined() && weight.dim() == 2, "{}: weight must be 2-D [V, C], got {}", op, weight.defined() ? weight.desc() : "undefined");
  check_index_dtype(ids, op);
  check_same_device(weight, ids, op);
  check_index_range(ids, weight.shape()[0], op, fmt::format("the {} rows of weight {}", weight.shape()[0],
                                                             weight.desc()));
  Shape os = ids.shape();
  os.push_back(weight.shape()[1]);
  return index_select(weight, 0, ids.reshape({-1})).view(os);
}

}  // namespace mt
