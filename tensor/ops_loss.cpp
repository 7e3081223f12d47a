// Cross-entropy front end: flattens logits to [N, V], checks every target against V on the host
// (a kernel must never index out of bounds), runs the fused kernel for per-row losses and applies
// the reduction with ordinary (differentiable) ops. The backward of the per-row loss is the fused
// cross_entropy_bwd kernel; it is not itself differentiable (no double backward).
#include <vector>

#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/dist_dispatch.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_pointwise.h"
#include "tensor/ops_reduce.h"
#include "tensor/pointwise_util.h"

namespace mt {

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, Reduction reduction) {
  if (any_dist(logits, target)) [[unlikely]] {
    DistOp d{"cross_entropy", DistRule::kCrossEntropy};
    d.args[0] = ignore_index;
    d.args[1] = static_cast<int64_t>(reduction);
    return dist_dispatch1(d, {logits, target}, MT_DIST_LOCAL(cross_entropy(l[0], l[1], ignore_index, reduction)));
  }
  check_same_device(logits, target, "cross_entropy");
  MT_CHECK(is_floating(logits.dtype()), "cross_entropy: logits must be floating, got {}", logits.desc());
  MT_CHECK(target.dtype() == DType::kI64 || target.dtype() == DType::kI32,
           "cross_entropy: target must be i64 or i32, got {}", target.desc());
  MT_CHECK(logits.dim() >= 1, "cross_entropy: logits must have a class dim, got logits {} and target {}",
           logits.shape(), target.shape());
  Shape lead = logits.shape();
  const int64_t V = lead.back();
  lead.resize(lead.size() - 1);
  MT_CHECK(target.shape() == lead,
           "cross_entropy: target {} must have logits' shape without the class dim: logits {} -> expected {}",
           target.shape(), logits.shape(), lead);
  const int64_t N = lead.numel();
  MT_CHECK(V > 0 || N == 0, "cross_entropy: logits {} have no classes", logits.shape());

  Tensor tgt = target.reshape(Shape{N}).contiguous();
  int64_t count = 0;  // non-ignored targets
  if (tgt.is_meta()) {
    count = N;  // shape inference and estimates: no values to check (reading them would allocate)
  } else {
    std::vector<int64_t> tv = tgt.to_vector<int64_t>();
    for (size_t i = 0; i < tv.size(); ++i) {
      if (tv[i] == ignore_index) continue;
      MT_CHECK(tv[i] >= 0 && tv[i] < V,
               "cross_entropy: target value {} (at flat index {}) is out of range for {} classes "
               "(logits {}, ignore_index {})",
               tv[i], i, V, logits.shape(), ignore_index);
      ++count;
    }
  }

  Tensor x = logits.reshape(Shape{N, V}).contiguous();
  DType ldt = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  TensorOptions lopts = x.options().with_dtype(ldt).with_grad(false);
  Tensor loss = empty(Shape{N}, lopts), lse = empty(Shape{N}, lopts);
  CrossEntropyParams p;
  p.logits = x.view_info();
  p.target = tgt.view_info();
  p.loss = loss.view_info();
  p.lse = lse.view_info();
  p.ignore_index = ignore_index;
  if (N > 0) MT_KERNEL(x.device().type, cross_entropy, p);

  if (needs_grad(x)) {
    Tensor xs = x.detach();
    record("CrossEntropyBackward", {x}, loss, [xs, tgt, lse, ignore_index](const auto& g) {
      Tensor gl = g[0].to(lse.dtype());
      Tensor gx = empty(xs.shape(), xs.options());
      CrossEntropyBwdParams b;
      b.logits = xs.view_info();
      b.target = tgt.view_info();
      b.lse = lse.view_info();
      b.grad_loss = gl.view_info();  // any stride (sum's backward hands over a stride-0 view)
      b.grad_logits = gx.view_info();
      b.ignore_index = ignore_index;
      if (gx.numel() > 0) MT_KERNEL(xs.device().type, cross_entropy_bwd, b);
      return std::vector<Tensor>{gx};
    });
  }

  switch (reduction) {
    case Reduction::kNone:
      return loss.view(lead);
    case Reduction::kSum:
      return sum(loss);
    case Reduction::kMean:
      // Like PyTorch, a batch whose targets are all ignored gives 0 / 0 = NaN.
      return div(sum(loss), static_cast<double>(count));
  }
  MT_FAIL("cross_entropy: unknown reduction {}", static_cast<int>(reduction));
}

}  // namespace mt
