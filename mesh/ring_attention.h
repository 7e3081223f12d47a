// Context-parallel attention (docs/context_parallel.md): scaled_dot_product_attention on q, k, v
// [B, H, T, D] DTensors whose sequence dim (2) is split over one mesh dim (the cp dim), S(2) or
// the load-balanced ZS(2). Each rank keeps its q rows; the k/v blocks travel around the cp ring
// (one block per step to the next rank, overlapping the current block's compute) and the partial
// results of every visible block are merged
// with the online softmax (log-sum-exp). The backward is the same ring in reverse: the gradients of
// the received k/v blocks go back to the rank they came from, accumulating dk/dv on the way.
// The causal mask uses the global positions of each rank's chunks (local_layout), so any split of
// the sequence is exact; blocks entirely above the diagonal are skipped.
#pragma once

#include <cstdint>

#include "mesh/communicator.h"
#include "mesh/shard_layout.h"
#include "tensor/tensor.h"

namespace mt {

// How the k/v of the other cp ranks reach a rank: the ring (default), or an all-gather of the
// whole sequence (backward: reduce-scatter of dk/dv), the baseline of tools/bench/bench_cp.cpp.
enum class CpAttentionMode : uint8_t { kRing, kGather };
void set_cp_attention_mode(CpAttentionMode m);
CpAttentionMode cp_attention_mode();

// Bytes this rank sent for context-parallel attention since the last reset (forward k/v blocks
// plus backward dk/dv blocks; for kGather the all-gather and reduce-scatter payloads as a ring
// algorithm moves them: (k-1)/k of the gathered tensor per rank).
struct CpAttentionStats {
  int64_t bytes_sent = 0;
  int64_t blocks_computed = 0;  // (q chunk, k chunk) products this rank computed
  int64_t scores_computed = 0;  // causally visible score entries of those products (the work)
  int64_t blocks_skipped = 0;   // blocks above the causal diagonal
};
CpAttentionStats& cp_attention_stats();

// Dropout on the attention probabilities with the single-device masks: the mask of element
// (b, h, i, j) of the global probabilities [B, Hq, T, T] is the Philox draw at its global index
// (docs/rng.md); `base` is the global index of this rank's first (b, h) (batch or heads may be split
// on other mesh dims), `strides` the global strides. The caller reserved the generator's blocks.
struct CpDropout {
  double p = 0;
  uint64_t seed = 0, offset = 0;
  int64_t base = 0;
  Shape strides;
};

// The local part of context-parallel attention. q [B, Hq, nq, D], k/v [B, Hkv, nk, D] are this
// rank's rows; segs[r] are the global positions of cp rank r's rows (in local order; the same
// partition for q and k/v); comm is the cp dim's communicator (rank = its coordinate).
// Differentiable (through the ring). Returns [B, Hq, nq, Dv] in q's dtype.
Tensor context_parallel_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const std::vector<std::vector<DimSegment>>& segs, Communicator comm, bool causal,
                                  double scale, const CpDropout* dropout = nullptr);

}  // namespace mt
