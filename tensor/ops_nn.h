// Neural-network ops with fused kernels: softmax, log_softmax, rms_norm, layer_norm, rotary
// embedding, embedding lookup, cross-entropy, causal attention with grouped KV heads, dropout.
#pragma once

#include <utility>

#include "kernels/params.h"
#include "tensor/tensor.h"

namespace mt {

class Generator;

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// Normalize over the last dim. weight (and bias) [H] may be undefined.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// cos/sin tables [T, D/2] for positions 0..T-1: angle(t, i) = t * theta^(-2i/D).
std::pair<Tensor, Tensor> rope_tables(int64_t T, int64_t D, double theta = 10000.0,
                                      DType dtype = DType::kF32);
// Rotates pairs of the last dim of x by cos/sin, which broadcast against x's leading dims with
// last dim D/2 (e.g. x [B, T, H, D] with cos [T, 1, D/2], or x [B, H, T, D] with cos [T, D/2]).
// kHalf is Hugging Face's rotate_half convention, kInterleaved the original (2i, 2i+1) pairing.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin,
                        RopeStyle style = RopeStyle::kHalf);

// weight [V, C], ids of any shape (i64/i32) -> [*ids.shape, C]. Out-of-range ids are errors.
Tensor embedding(const Tensor& weight, const Tensor& ids);

enum class Reduction { kNone, kMean, kSum };
// logits [..., V], target [...] (i64/i32). kMean averages over non-ignored targets.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::kMean);

// q [B, Hq, T, D], k/v [B, Hkv, S, D]; Hq a multiple of Hkv. scale defaults to 1/sqrt(D).
enum class Causal { kNo, kYes };
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    Causal causal = Causal::kYes, double scale = 0);

// Causal attention with dropout on the probabilities, HF's eager path (the fused kernel has no
// dropout): softmax(q k^T * scale + causal mask) in f32 (f64 for f64), cast to q's dtype, dropout p,
// times v; k/v heads repeated for GQA. q [B, Hq, T, D], k/v [B, Hkv, T, D]. On DTensors with the
// sequence split (context parallelism) it is ring attention with the single-device masks
// (docs/context_parallel.md); on other DTensors the same composition of ops.
Tensor attention_dropout(const Tensor& q, const Tensor& k, const Tensor& v, double scale, double p,
                         Generator* gen = nullptr);
// The composition itself (what attention_dropout runs on one device).
Tensor eager_attention_dropout(const Tensor& q, Tensor k, Tensor v, double scale, double p, Generator* gen = nullptr);
// DistOp::extra of attention ops: the scale, and the dropout of attention_dropout.
struct AttentionArgs {
  double scale = 0;
  double dropout = 0;
  Generator* gen = nullptr;
};

// Zeroes elements with probability p and scales the rest by 1/(1-p); identity when p == 0.
// The mask comes from the Philox generator (default one when gen is null).
Tensor dropout(const Tensor& x, double p, Generator* gen = nullptr);

}  // namespace mt
