// Placement: how one mesh dimension holds a tensor (docs/placements.md). A small hashable value
// type with a short printed form that parses back: R, S(0), P(sum), IS(0,3), RS(0,[2,1,3],b4).
// A DTensor carries one placement per mesh dim, applied left to right (each mesh dim splits what
// the previous ones left), as in PyTorch DTensor. The geometry lives in mesh/shard_layout.h.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

enum class PlacementKind : uint8_t {
  kReplicate,         // R: every rank holds the whole tensor
  kShard,             // S(dim): dim chunked across ranks (torch.chunk sizes)
  kPartial,           // P(op): every rank holds a term; the tensor is their reduction by op
  kInterleavedShard,  // IS(dim,groups): dim viewed as [groups, n/groups], each group chunked;
                      // ZS(dim) (zigzag, mirrored()): IS(dim,2) whose second group's chunks go to
                      // the ranks in reverse order: rank r holds chunks r and 2k-1-r of 2k
  kRaggedShard,       // RS(dim,[u0,u1,..],bB): rank r holds u_r units of B rows, in rank order
};

enum class PartialOp : uint8_t { kSum, kAvg, kMax, kMin };

const char* partial_op_name(PartialOp op);  // "sum", "avg", "max", "min"

class Placement {
 public:
  Placement() = default;  // Replicate
  static Placement replicate();
  static Placement shard(int dim);
  static Placement partial(PartialOp op = PartialOp::kSum);
  static Placement interleaved_shard(int dim, int64_t groups);
  // ZS(dim): the load-balanced layout of a causal sequence for context parallelism (docs/context_parallel.md).
  static Placement zigzag_shard(int dim);
  static Placement ragged_shard(int dim, std::vector<int64_t> units, int64_t block = 1);
  // Parses the printed form; spaces are ignored, "P" alone is P(sum). Throws naming the text.
  static Placement parse(std::string_view text);

  PlacementKind kind() const { return kind_; }
  bool is_replicate() const { return kind_ == PlacementKind::kReplicate; }
  bool is_partial() const { return kind_ == PlacementKind::kPartial; }
  bool is_shard() const { return kind_ == PlacementKind::kShard; }
  // Any of S, IS, RS: the placement splits tensor dim `dim()` across the mesh dim.
  bool splits() const {
    return kind_ == PlacementKind::kShard || kind_ == PlacementKind::kInterleavedShard ||
           kind_ == PlacementKind::kRaggedShard;
  }
  int dim() const { return dim_; }                 // S, IS, RS; -1 otherwise
  PartialOp reduce_op() const { return op_; }       // P
  int64_t groups() const { return groups_; }       // IS
  bool mirrored() const { return mirrored_; }       // ZS: an IS whose odd groups go in reverse rank order
  // The chunk of group g that rank c of k holds (IS: c; ZS: c, then k-1-c).
  int64_t group_chunk(int64_t g, int64_t k, int64_t c) const { return mirrored_ && (g % 2) ? k - 1 - c : c; }
  const std::vector<int64_t>& units() const { return units_; }  // RS: units per rank
  int64_t block() const { return block_; }         // RS: rows per unit

  std::string str() const;
  size_t hash() const;
  bool operator==(const Placement& o) const {
    return kind_ == o.kind_ && dim_ == o.dim_ && op_ == o.op_ && groups_ == o.groups_ &&
           mirrored_ == o.mirrored_ && block_ == o.block_ && units_ == o.units_;
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }

 private:
  PlacementKind kind_ = PlacementKind::kReplicate;
  PartialOp op_ = PartialOp::kSum;
  int dim_ = -1;
  int64_t groups_ = 0;
  bool mirrored_ = false;
  int64_t block_ = 0;
  std::vector<int64_t> units_;
};

using Placements = std::vector<Placement>;

// "[S(0), R]".
std::string placements_str(const Placements& ps);
// Parses a comma-separated list, brackets optional: "[S(0), IS(1,3)]" or "S(0),R". Throws naming
// the text.
Placements parse_placements(std::string_view text);

}  // namespace mt

template <>
struct std::hash<mt::Placement> {
  size_t operator()(const mt::Placement& p) const noexcept { return p.hash(); }
};

template <>
struct fmt::formatter<mt::Placement> : fmt::formatter<std::string_view> {
  auto format(const mt::Placement& p, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(p.str(), ctx);
  }
};
