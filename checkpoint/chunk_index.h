// The index of a sharded checkpoint (docs/checkpoints.md, "Sharded checkpoints"): for every tensor
// of every group ("model", "optimizer") its global shape, dtype, the placements and mesh it was
// saved with, and its chunks: boxes of the global tensor (per-dim start and size), each stored
// under a key in one shard file. index.json is what rank 0 merges from the per-rank chunk lists;
// reading it checks that the chunks of each tensor tile it exactly (no hole, no overlap).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/shape.h"
#include "tensor/tensor.h"

namespace mt {

inline constexpr const char* kShardedIndexFile = "index.json";
inline constexpr const char* kShardedIndexFormat = "meshtrain-sharded-1";

struct ChunkBox {
  Shape offsets;  // global start per dim
  Shape sizes;
  std::string file;  // shard file name, relative to the step directory
  std::string key;   // tensor name inside that file
  std::string crc32;  // CRC-32 of the chunk's bytes (8 hex digits), checked when read whole
  // Stripes: the CRC-32 of each run of stripe_rows rows (slices of dim 0; the last may be shorter),
  // so that a read of part of the chunk checks the stripes it touches. 0 / empty in checkpoints
  // written before stripes (their partial reads are not checked).
  int64_t stripe_rows = 0;
  std::vector<std::string> stripe_crc32;
};

struct IndexedTensor {
  std::string group;  // "model" or "optimizer"
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  std::string placements;  // as saved, e.g. "[S(0), R]" ("" for a plain tensor)
  std::vector<ChunkBox> chunks;
};

struct ShardedIndex {
  int64_t world_size = 1;
  std::string mesh;  // the saving mesh, printed ("" without a plan)
  std::vector<IndexedTensor> tensors;  // in the order saved (model, then optimizer state)
  const IndexedTensor* find(const std::string& group, const std::string& name) const;
};

// Shard file of `rank` among `world`: "shard-00001-of-00004.safetensors".
std::string shard_file_name(int64_t rank, int64_t world);
// The key of a chunk in its shard file: "<group>/<name>@<o0>,<o1>,..".
std::string chunk_key(const std::string& group, const std::string& name, const Shape& offsets);

// JSON forms (the per-rank lists and index.json share them).
std::string index_to_json(const ShardedIndex& index);
// Parses and validates (fields, dtypes, chunks inside the shape and, when `check`, tiling it: a
// per-rank list holds only that rank's chunks); errors name `path` and the tensor.
ShardedIndex index_from_json(const std::string& text, const std::string& path, bool check = true);
ShardedIndex read_sharded_index(const std::string& path, bool check = true);

// Merges per-rank lists (same tensors, kept in the first list's order; chunks gathered and sorted
// by offsets) and checks the tiling.
ShardedIndex merge_indexes(const std::vector<ShardedIndex>& parts, const std::string& what);

// Throws naming `path` and the tensor when the chunks of `t` leave it, overlap, or leave a hole.
void check_tiling(const IndexedTensor& t, const std::string& path);

}  // namespace mt
