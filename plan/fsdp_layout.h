// The FSDP layout planner (docs/fsdp.md): where each tensor of one FSDP unit lies in the unit's
// flat buffer, sharded evenly over `group` ranks. Every tensor is contiguous; every block of a
// tensor (its granularity: `block_rows` whole rows) lies on one rank; padding goes only between
// tensors; every rank's shard has the same, aligned size. The planner minimizes that size, i.e.
// the padding. Pure arithmetic on shapes: no tensors, no communication, the same answer on every
// rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

// One tensor as the planner sees it: `rows` rows of `cols` elements (rows: the product of every
// dim but the last of an N-D tensor; a 1-D tensor is `numel` rows of one element). A block is
// `block_rows` consecutive rows, which must divide `rows`.
struct LayoutTensor {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 1;
  int64_t block_rows = 1;
  int64_t numel() const { return rows * cols; }
  int64_t block_numel() const { return block_rows * cols; }
};

enum class TensorOrder {
  kAny,    // the planner may reorder the tensors (it tries a few orders, keeps the best)
  kGiven,  // the buffer holds them in the given order
};

struct LayoutOptions {
  int64_t group = 1;         // ranks the unit is sharded over
  int64_t shard_align = 64;  // elements: the shard size is a multiple (aligned collectives)
  int64_t tensor_align = 16; // elements: every tensor starts at a multiple (aligned views)
  TensorOrder order = TensorOrder::kAny;
};

struct PlacedTensor {
  int64_t index = 0;   // into the planner's input
  int64_t offset = 0;  // element offset in the unit's buffer (of group * shard_size elements)
  // Blocks on the ranks the tensor spans: blocks[i] on rank first_rank + i (a tensor spans a few
  // ranks of a large group, so only those are stored).
  int64_t first_rank = 0;
  std::vector<int64_t> blocks;
  int64_t blocks_on(int64_t rank) const;
  // Blocks on every rank of the group: the units of its RaggedShard over the rows (block
  // `block_rows`).
  std::vector<int64_t> ragged_units(int64_t group) const;
};

struct FsdpLayout {
  int64_t group = 1;
  int64_t shard_size = 0;  // elements per rank
  int64_t payload = 0;     // sum of the tensors' elements
  int64_t lower_bound = 0; // no layout has a smaller shard size (see plan_fsdp_layout)
  TensorOrder order = TensorOrder::kGiven;  // the order kept (kAny: reordered)
  std::vector<PlacedTensor> tensors;        // in buffer order
  int64_t buffer_size() const { return group * shard_size; }
  int64_t padding() const { return buffer_size() - payload; }
  // Padding over payload (0.03: the buffer is 3% larger than the tensors).
  double padding_ratio() const;
};

// The layout with the smallest shard size the planner finds. Throws naming the tensor when a
// block size does not divide its rows (or is not positive), or an option is not positive.
// `lower_bound`: no layout has a smaller shard size. It is at least the even split and the largest
// block, rounded up to the alignment, and a multiple of the block of every tensor longer than two
// shards (such a tensor crosses two shard boundaries, and both are on its block edges only if the
// shard size is a multiple of its block).
FsdpLayout plan_fsdp_layout(const std::vector<LayoutTensor>& tensors, const LayoutOptions& options);

// Plans every unit (an FSDP unit per decoder layer, say); units with the same shapes and blocks,
// names aside, are planned once and share the result (layers of one model usually are).
std::vector<FsdpLayout> plan_fsdp_layouts(const std::vector<std::vector<LayoutTensor>>& units,
                                          const LayoutOptions& options);

// Checks every invariant of `layout` against its tensors (contiguous, inside the buffer, no
// overlaps, every block on one rank, aligned, blocks per rank consistent); throws naming the
// tensor. The planner's own output always passes; tests and loaders call it.
void check_fsdp_layout(const std::vector<LayoutTensor>& tensors, const LayoutOptions& options,
                       const FsdpLayout& layout);

// One line per tensor: name, [rows, cols], block rows, offset, its RaggedShard, as
// `meshtrain plan --fsdp-layout` prints it; a header line with the shard size and padding.
std::string describe_fsdp_layout(const std::vector<LayoutTensor>& tensors, const FsdpLayout& layout);

}  // namespace mt
