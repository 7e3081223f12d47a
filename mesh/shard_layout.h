// The local geometry of a DTensor, without any communication: for a global shape, one placement
// per mesh dim (applied left to right), a mesh shape and a mesh coordinate, which elements of the
// global tensor the local shard holds and where. Every placement selects contiguous index ranges
// along one tensor dim, so the local tensor is a product of per-dim maps and splits into
// rectangular "pieces", each a plain view of the local tensor and of the global one.
// Used by sharded RNG (bit-identical to one device), checkpoint resharding, redistribute tests.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/params.h"
#include "mesh/placement.h"
#include "runtime/shape.h"
#include "tensor/tensor.h"

namespace mt {

// Rank i of k along a dim of n under torch.chunk semantics: chunks of ceil(n/k), the last
// non-empty one possibly smaller, trailing ranks empty (7 over 4: 2,2,2,1; 2 over 4: 1,1,0,0).
struct IndexRange {
  int64_t start = 0;
  int64_t length = 0;
  bool operator==(const IndexRange& o) const { return start == o.start && length == o.length; }
};
IndexRange chunk_range(int64_t n, int64_t k, int64_t i);

// Along one tensor dim: local indices [local_start, local_start + length) hold global indices
// [global_start, global_start + length).
struct DimSegment {
  int64_t local_start = 0;
  int64_t global_start = 0;
  int64_t length = 0;
  bool operator==(const DimSegment& o) const {
    return local_start == o.local_start && global_start == o.global_start && length == o.length;
  }
};

// A rectangular block of the local tensor that is also a rectangular block of the global tensor.
// The local element at local_offset + i is the global element at global_offset + i, whose index
// in the global row-major order is global_base + sum_d i_d * LocalLayout::global_strides[d].
struct ShardPiece {
  Shape local_offset;
  Shape sizes;
  Shape global_offset;
  int64_t global_base = 0;
};

struct LocalLayout {
  Shape global_shape;
  Shape local_shape;
  Shape global_strides;                          // row-major strides of global_shape
  std::vector<std::vector<DimSegment>> segments;  // per tensor dim, in local order, non-empty
  // Pieces tile the local tensor exactly once (none when it is empty). Partial and Replicate mesh
  // dims do not split: every rank of such a dim has the same geometry (the values of a Partial
  // term are the caller's business).
  std::vector<ShardPiece> pieces;
};

LocalLayout local_layout(const Shape& global_shape, const Placements& placements,
                         const Shape& mesh_shape, const Shape& coord);

// The sub-view of `t` (local or global) at `offset` with `sizes`.
Tensor block_view(const Tensor& t, const Shape& offset, const Shape& sizes);

// Reference implementation: the local shard of `global` at `coord`, a fresh contiguous tensor built
// by narrow/cat placement by placement (independently of local_layout's segment arithmetic).
// Partial(sum): coordinate 0 of that mesh dim holds the value and the others zeros;
// Partial(avg|max|min): every rank holds the value.
Tensor local_shard(const Tensor& global, const Placements& placements, const Shape& mesh_shape,
                   const Shape& coord);

// The inverse, for tests and checkpoints: rebuilds the global tensor from every rank's local
// shard (ranks in row-major order over mesh_shape). Partial mesh dims are reduced by their op;
// Replicate mesh dims take the replica at coordinate 0.
Tensor assemble(const std::vector<Tensor>& locals_by_rank, const Shape& global_shape,
                const Placements& placements, const Shape& mesh_shape);

// Fills the local shard at `coord` with exactly the bits of the corresponding elements of the
// tensor of `global_shape` that fill_random would generate on one device with the same seed and
// offset (docs/rng.md), one fill_random call per piece. `local` may be any non-overlapping view
// of the local shape. Partial(sum) placements are rejected (a sum of random terms is not the
// single-device tensor); the caller advances its generator by random_blocks(global numel).
void fill_random_sharded(Tensor& local, RandomDist dist, double a, double b, uint64_t seed,
                         uint64_t offset, const Shape& global_shape, const Placements& placements,
                         const Shape& mesh_shape, const Shape& coord);

}  // namespace mt
