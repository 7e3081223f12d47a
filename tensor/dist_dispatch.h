// DTensor dispatch (DESIGN.md "One Tensor type"): every op front end first checks whether an input
// carries a distributed spec and, if so, hands the op to the handler that mesh/ installs (sharding
// rule from the propagation cache, checks, local op on the shards, wrap). tensor/ only describes
// the op: a name, which sharding rule applies, the rule-relevant arguments, and the local
// computation. A plain local op pays one branch per input for all of this.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/params.h"
#include "runtime/function_ref.h"
#include "runtime/shape.h"
#include "tensor/tensor.h"

namespace mt {

// The sharding rule families (mesh/sharding_rules.cpp documents each).
enum class DistRule : uint8_t {
  kElementwise,   // n-ary pointwise with broadcasting, not linear: no Partial input
  kLinear,        // add/sub/neg and casts: Partial(sum) inputs stay Partial; P + R adds R once
  kMulLike,       // mul/div: at most one Partial(sum) factor (div: the numerator), others R
  kAffineScalar,  // x + s, s - x: Partial keeps the constant on one rank only
  kReduce,        // args: dims bitmask, keepdim, ReduceOp (sum, max, min, others)
  kMatmul,        // matmul/bmm: einsum rule
  kView,          // view/reshape/flatten/expand/unsqueeze/squeeze/permute/transpose (shape = target)
  kSlice,         // slice/select/softmax/topk: args[0] = dim (unsplit), [1] removed, [2] linear
  kNorm,          // rms_norm/layer_norm: last dim unsplit, weight/bias Replicate
  kRope,          // rotary embedding: x [..., T, H, D] with cos/sin [T, D/2]
  kAttention,     // q/k/v [B, H, T, D]: B or H split alike
  kEmbedding,     // weight [V, C] and ids
  kCrossEntropy,  // logits [N, V] and target [N]
  kGatherLike,    // gather/scatter_add/index_add/cat/stack/one_hot: args[0] = dim, unsplit
  kRandomFill,    // uniform_/normal_ in place: args[0] = RandomDist, scalar/scalar2 its parameters
};

// The payload of a kRandomFill op (DistOp::extra): fill the DTensor with the values the global
// tensor would get on one device from this generator position.
struct DistRandomFill {
  RandomDist dist;
  double a, b;
  uint64_t seed, offset;
};

// Local facts a computation may need beyond its local inputs (filled by the handler).
struct DistCtx {
  bool meta_run = false;     // shape inference on global-shaped meta tensors: use global arguments
  Shape out_local_shape;     // local shape of output 0 (a view's local target)
  bool partial_root = true;  // this rank adds constants to Partial results (coordinate 0)
};

struct DistOp {
  DistOp(const char* n, DistRule r) : name(n), rule(r) {}  // NOLINT: braces read well at call sites
  const char* name;  // a string literal: the cache keys on the pointer
  DistRule rule;
  int64_t args[4] = {0, 0, 0, 0};  // rule-relevant integers (dims, keepdim, reduce op, ...)
  Shape shape;                      // rule-relevant shape (a view's global target)
  Shape key;                        // other integers the outputs' shapes depend on (slice bounds, topk's
                                    // k): part of the cache key, never read by a rule
  double scalar = 0, scalar2 = 0;   // non-key scalars (dropout probability, random bounds)
  void* extra = nullptr;            // non-key payload (a random op's Generator)
};

using DistLocalFn = FunctionRef<std::vector<Tensor>(const std::vector<Tensor>& locals, const DistCtx& ctx)>;
using DistHandler = std::vector<Tensor> (*)(const DistOp& op, const std::vector<Tensor>& inputs,
                                            DistLocalFn local);

// The local computation of a front end: `l` are the local inputs, `ctx` the DistCtx.
#define MT_DIST_LOCAL(...)                                                                        \
  [&](const std::vector<::mt::Tensor>& l, const ::mt::DistCtx& ctx) -> std::vector<::mt::Tensor> { \
    (void)l;                                                                                      \
    (void)ctx;                                                                                    \
    return {__VA_ARGS__};                                                                         \
  }

// Installed by mesh/ when the first DTensor spec is created.
void set_dist_handler(DistHandler h);

// Runs `op` on DTensor inputs (plain inputs are taken as Replicate). Throws when no handler is
// installed (a DistSpec without mesh/).
std::vector<Tensor> dist_dispatch(const DistOp& op, const std::vector<Tensor>& inputs, DistLocalFn local);
inline Tensor dist_dispatch1(const DistOp& op, const std::vector<Tensor>& inputs, DistLocalFn local) {
  return dist_dispatch(op, inputs, local)[0];
}

inline bool any_dist(const Tensor& a) { return a.is_distributed(); }
inline bool any_dist(const Tensor& a, const Tensor& b) { return a.is_distributed() || b.is_distributed(); }
inline bool any_dist(const Tensor& a, const Tensor& b, const Tensor& c) {
  return a.is_distributed() || b.is_distributed() || c.is_distributed();
}
bool any_dist(const std::vector<Tensor>& ts);

// Checks for in-place updates of DTensors (not dispatched: they run on the local shard). Both
// tensors must have the same spec, or `other` be plain with one element.
void check_inplace_dist(const Tensor& self, const Tensor& other, const char* op);

}  // namespace mt
