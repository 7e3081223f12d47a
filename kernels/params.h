// Typed parameter structs, one per kernel family. The front ends in tensor/ validate inputs,
// promote dtypes, allocate outputs and fill these; kernels assume they are valid.
// Conventions: "contiguous" below means the front end guarantees a row-major dense view.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/view.h"

namespace mt {

// ---- creation ---------------------------------------------------------------------------------
struct FillParams {
  KView out;
  double value = 0;       // used for floating dtypes
  int64_t int_value = 0;  // used for integral dtypes (exact for all of i64)
};

struct ArangeParams {  // out[i] = start + i * step, out 1-D
  KView out;
  double start = 0, step = 1;
};

// out = src converted to out's dtype; same sizes, any strides (src strides may be 0).
struct CopyParams {
  KView src, out;
};

// ---- pointwise --------------------------------------------------------------------------------
enum class UnaryOp : uint8_t {
  kNeg, kExp, kLog, kSqrt, kRsqrt, kAbs, kRelu, kGelu, kGeluTanh, kSilu, kSigmoid, kTanh,
  kPowScalar,  // x ** alpha
  kClamp,      // clamp(x, alpha, beta); a missing bound is +-inf
  kAffine,     // alpha * x + beta (scalar add/mul/sub on any dtype)
  kSign, kSin, kCos, kReciprocal,
  kGeluGrad, kGeluTanhGrad, kSiluGrad,  // derivatives, used by backward formulas
  kLogicalNot,
};
// in and out have the same sizes and dtype (kLogicalNot: out is bool).
struct UnaryParams {
  UnaryOp op;
  KView in, out;
  double alpha = 0, beta = 0;
};

// kSiluMul: silu(a), rounded to the dtype, times b (SwiGLU's product in one pass, the bits of
// mul(silu(a), b)); kSiluGradMul: silu'(a), rounded, times b (its backward). Floating only.
enum class BinaryOp : uint8_t {
  kAdd, kSub, kMul, kDiv, kMaximum, kMinimum, kPow, kSiluMul, kSiluGradMul,
  kEq, kNe, kLt, kLe, kGt, kGe,  // out is bool
  kLogicalAnd, kLogicalOr,       // out is bool
};
// a, b, out have the same sizes (broadcast by zero strides); a and b share a dtype.
struct BinaryParams {
  BinaryOp op;
  KView a, b, out;
};

// The backward of silu_mul(a, b) for the incoming gradient g, in one pass over five tensors:
// da = silu'(a) * (g * b), db = silu(a) * g, with each factor rounded to the dtype where the
// unfused kernels (binary kMul, kSiluGradMul, kSiluMul) store it, so the bits are theirs. All five
// have one floating dtype and the same sizes.
struct SiluMulBwdParams {
  KView a, b, g, da, db;
};

// out = cond ? a : b; all same sizes (broadcast strides), cond bool, a/b/out one dtype.
struct WhereParams {
  KView cond, a, b, out;
};

// ---- reductions -------------------------------------------------------------------------------
enum class ReduceOp : uint8_t { kSum, kMean, kMax, kMin, kArgmax, kArgmin, kVar, kProd };
// Reduces the last `n_reduce` dims of `in`; out has in's leading dims (any strides).
// kArgmax/kArgmin: n_reduce == 1, out is i64. kVar: divides by (count - correction).
// Floating sums accumulate in double.
struct ReduceParams {
  ReduceOp op;
  KView in, out;
  int n_reduce = 1;
  int64_t correction = 1;
};

// ---- linear algebra ---------------------------------------------------------------------------
// out[..., M, N] = alpha * a[..., M, K] @ b[..., K, N] + beta * out. Batch dims equal in all three
// (broadcast via zero strides in a and b). Each matrix of a and b has unit stride in one of its
// last two dims; out is contiguous. dtypes f32 or f64 (the front end casts 16-bit floats), or on
// the CPU an f32 a and out with a bf16/f16 b, all 2-D (linear's weight, widened inside the kernel).
struct MatmulParams {
  KView a, b, out;
  double alpha = 1, beta = 0;
};

// ---- normalization, softmax -------------------------------------------------------------------
// Row-wise over the last dim; x contiguous [rows, H]. weight/bias [H] may be empty views.
// rstd (and mean) are f32/f64 [rows] (same dtype as x if x is f64, else f32), saved for backward.
struct RmsNormParams {
  KView x, weight, out, rstd;
  double eps = 1e-6;
};
struct RmsNormBwdParams {
  KView gy, x, weight, rstd, gx, gw;  // gw [H] is written (not accumulated) when non-empty
  // gx += the input gradient instead of gx = it: each element rounded to gx's dtype first, then
  // added as add() adds (compute type, one rounding), so gx ends with the bits of add(gx, gradient).
  // The autograd engine's gradient sum, fused (tensor/autograd.h, grad_accumulation_target).
  bool accumulate = false;
};
struct LayerNormParams {
  KView x, weight, bias, out, mean, rstd;
  double eps = 1e-5;
};
struct LayerNormBwdParams {
  KView gy, x, weight, mean, rstd, gx, gw, gb;  // gw/gb written when non-empty
};

// Row-wise softmax or log-softmax over the last dim; in/out contiguous.
struct SoftmaxParams {
  KView in, out;
  bool log = false;
};

// ---- positional -------------------------------------------------------------------------------
// Rotary embedding over the last dim D of x (contiguous). cos/sin are views with x's leading dims
// (broadcast strides allowed) and last dim D/2. Rotate-half pairs (i, i + D/2); interleaved pairs
// (2i, 2i+1). inverse rotates by -angle (the backward).
enum class RopeStyle : uint8_t { kHalf, kInterleaved };
struct RopeParams {
  KView x, cos, sin, out;
  RopeStyle style = RopeStyle::kHalf;
  bool inverse = false;
};

// ---- indexing ---------------------------------------------------------------------------------
// All index views are i64 or i32 and contiguous; in/src/out contiguous.
struct IndexSelectParams {  // out = in.index_select(dim, index)
  KView in, index, out;
  int dim = 0;
};
struct IndexAddParams {  // out.index_add_(dim, index, src * alpha), in place
  KView out, index, src;
  int dim = 0;
  double alpha = 1;
};
struct GatherParams {  // out[..i..] = in[..index[..i..] at dim..]
  KView in, index, out;
  int dim = 0;
};
struct ScatterAddParams {  // out[..index[..i..] at dim..] += src[..i..], in place
  KView out, index, src;
  int dim = 0;
};
struct TopkParams {  // over the last dim of contiguous in; values/indices [..., k]
  KView in, values, indices;
  int64_t k = 1;
  bool largest = true;
};

// ---- losses -----------------------------------------------------------------------------------
// logits [N, V] contiguous, target [N] (i64/i32). loss and lse [N] f32 (f64 for f64 logits);
// ignored rows get loss 0.
struct CrossEntropyParams {
  KView logits, target, loss, lse;
  int64_t ignore_index = -100;
};
// grad_logits[n, :] = grad_loss[n] * (softmax(logits[n]) - onehot(target[n])), 0 for ignored rows.
struct CrossEntropyBwdParams {
  KView logits, target, lse, grad_loss, grad_logits;
  int64_t ignore_index = -100;
};

// ---- attention --------------------------------------------------------------------------------
// q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv], out [B, Hq, T, Dv], one dtype;
// Hq % Hkv == 0 (query head h reads kv head h / (Hq / Hkv)). lse [B, Hq, T] f32 (f64 for f64).
// Layouts: the CPU kernels take any strides and f64, f32, bf16 or f16; CUDA's SIMT kernel
// contiguous f32/f64, its tensor-core kernel 16-bit with attention_tc_layout_ok operands.
// causal: query t attends to keys s <= t + (S - T).
struct AttentionParams {
  KView q, k, v, out, lse;
  double scale = 1;
  bool causal = true;
};
struct AttentionBwdParams {
  KView q, k, v, out, lse, gout, gq, gk, gv;  // gq/gk/gv written (not accumulated)
  double scale = 1;
  bool causal = true;
};

// Does the CUDA backend run this attention in the 16-bit input dtype on tensor cores? bf16/f16
// with head dims multiples of 8 up to 128 (lse then f32); otherwise the front end computes in f32.
inline bool attention_tensor_core_ok(DType dt, int64_t D, int64_t Dv) {
  return (dt == DType::kBF16 || dt == DType::kF16) && D > 0 && Dv > 0 && D % 8 == 0 && Dv % 8 == 0 && D <= 128 &&
         Dv <= 128;
}
// Can that kernel read (or write) this [B, H, T, D] operand in place? Unit stride in D, the other
// strides multiples of 8 elements and the data 16-byte aligned: every row starts on 16 bytes.
// Contiguous [B, H, T, D] and [B, T, H, D] storage seen through transpose(1, 2) both qualify.
inline bool attention_tc_layout_ok(const KView& x) {
  if (x.sizes.size() != 4 || reinterpret_cast<uintptr_t>(x.data) % 16 != 0) return false;
  if (x.sizes[3] > 1 && x.strides[3] != 1) return false;
  for (int d = 0; d < 3; ++d)
    if (x.sizes[d] > 1 && (x.strides[d] % 8 != 0 || x.strides[d] < 0)) return false;
  return true;
}

// ---- random -----------------------------------------------------------------------------------
// Counter-based Philox4x32-10 (docs/rng.md). Element at local index i has global row-major index
// j = global_base + sum_d i_d * global_strides[d]; its value depends only on (seed, offset, j,
// dist, a, b), so any shard of a tensor is generated exactly as on one device.
enum class RandomDist : uint8_t {
  kUniform,    // [a, b)
  kNormal,     // mean a, std b
  kRandint,    // integers in [a, b)
  kBernoulli,  // 1 with probability a
};
struct RandomParams {
  RandomDist dist;
  KView out;
  uint64_t seed = 0;
  uint64_t offset = 0;  // Philox block counter at op start
  double a = 0, b = 1;
  int64_t global_base = 0;
  Shape global_strides;
};

// One AdamW step in place over dense tensors of one floating dtype (f32 or f64) and shape:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p = p decay - step_size m / (sqrt(v) / bc2_sqrt + eps)
// with decay = 1 - lr wd, step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t) (optim/adamw.h).
// Mixed precision: an f32 param may take a bf16/f16 grad (read exactly as f32), scaled by
// grad_scale (in the param's type) before the update, and, when param_copy has data, the new value
// is also stored into param_copy (bf16/f16, the model's compute copy, rounded like copy_).
struct AdamWParams {
  KView param, grad, exp_avg, exp_avg_sq;
  KView param_copy;  // optional
  double decay = 1, beta1 = 0.9, beta2 = 0.999, step_size = 0, bc2_sqrt = 1, eps = 1e-8;
  double grad_scale = 1;
};
// Several AdamW steps in one call, each item exactly one `adamw` (the CUDA backend runs up to 40
// f32 tensors per launch: one launch per group of parameters, not one per tensor).
struct AdamWMultiParams {
  std::vector<AdamWParams> items;
};

// One 8-bit AdamW step (optim/adamw8bit.h) over a dense f32 param seen as rows of `row_numel`
// elements, cut into blocks of `block_rows` rows (the last block may be shorter). The moments are
// stored as 8-bit codes (u8, the param's numel) with one f32 absmax per block per moment, held
// per row in `absmax` ([rows, 2]: m's then v's absmax, the same value on every row of a block):
//   m code: bit 7 the sign, bits 0-6 k, m = absmax_m * (k / 127)^2
//   v code: k in 0..255,                v = absmax_v * (k / 255)^4
// Per block: dequantize, the AdamW step of AdamWParams in f32 with the new m, v, new absmax over
// the block, quantize (k = round(127 sqrt(|m| / absmax_m)), round(255 sqrt(sqrt(v / absmax_v)))).
// Blocks are independent: the result does not depend on the thread count or on which blocks a
// call covers. grad: f32, or bf16/f16 read exactly, times grad_scale; param_copy as in AdamWParams.
// Blocks shared with other ranks (a shard of a distributed parameter that cuts blocks: by columns,
// or rows off the block edges; optim/adamw8bit.h) run in two phases around an all-reduce (max) of
// the blocks' absmax: kMax writes this shard's part of each block's new absmax (`block_absmax`,
// f32 [local blocks, 2]) and changes nothing else; kApply computes the same new moments again,
// updates the param (and param_copy), and codes the moments against the absmax then in
// `block_absmax`, written to `absmax` too. Local row 0 is row `row_offset` of the tensor: blocks
// start where row_offset + r is a multiple of block_rows, so the first local block may be short.
// The bits are those of kFused on the whole tensor.
enum class Q8Phase : uint8_t { kFused, kMax, kApply };
struct AdamW8bitParams {
  KView param, grad, exp_avg, exp_avg_sq, absmax;
  KView param_copy;  // optional
  int64_t row_numel = 1, block_rows = 32;
  double decay = 1, beta1 = 0.9, beta2 = 0.999, step_size = 0, bc2_sqrt = 1, eps = 1e-8;
  double grad_scale = 1;
  Q8Phase phase = Q8Phase::kFused;
  int64_t row_offset = 0;
  KView block_absmax;  // kMax and kApply only
};

// out[0] += sum_i x_i^2 over the dense floating tensor x, squared and summed in f64 (out: one f64
// element on x's device). Fixed-size blocks added in a fixed order: the result does not depend on
// the thread count (gradient clipping's global norm).
struct SumSqParams {
  KView x, out;
};

}  // namespace mt

// Every kernel family and its params struct (kernels/registry.h, kernels/cost.h).
#define MT_KERNEL_LIST(X)                                                               \
  X(fill, FillParams) X(arange, ArangeParams) X(copy, CopyParams)                      \
  X(unary, UnaryParams) X(binary, BinaryParams) X(silu_mul_bwd, SiluMulBwdParams)     \
  X(where, WhereParams)                                                                \
  X(reduce, ReduceParams) X(matmul, MatmulParams)                                      \
  X(rms_norm, RmsNormParams) X(rms_norm_bwd, RmsNormBwdParams)                         \
  X(layer_norm, LayerNormParams) X(layer_norm_bwd, LayerNormBwdParams)                 \
  X(softmax, SoftmaxParams) X(rope, RopeParams)                                        \
  X(index_select, IndexSelectParams) X(index_add, IndexAddParams)                      \
  X(gather, GatherParams) X(scatter_add, ScatterAddParams) X(topk, TopkParams)         \
  X(cross_entropy, CrossEntropyParams) X(cross_entropy_bwd, CrossEntropyBwdParams)     \
  X(attention, AttentionParams) X(attention_bwd, AttentionBwdParams)                   \
  X(random, RandomParams) X(adamw, AdamWParams) X(adamw_multi, AdamWMultiParams)        \
  X(sum_sq, SumSqParams) X(adamw8bit, AdamW8bitParams)
