// The load side of sharded checkpoints (docs/checkpoints.md, "Sharded checkpoints"): index.json
// is read and checked once; each tensor is then read box by box: the whole rows of the chunk
// stripes a box touches are read (SafetensorsReader::read_block) and checked against their CRC-32,
// so that every byte loaded is checked, whatever the plan that loads it. A rank of any plan
// asks for the pieces of its local shards; one process without a plan (or `meshtrain export`)
// assembles one full tensor at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/chunk_index.h"
#include "models/safetensors.h"
#include "tensor/tensor.h"

namespace mt {

class ShardedCheckpointReader {
 public:
  // Reads and checks <step_dir>/index.json (errors name it and the tensor).
  explicit ShardedCheckpointReader(const std::string& step_dir);
  const ShardedIndex& index() const { return index_; }
  const std::string& index_path() const { return index_path_; }

  // Fills `dst` (of the box's sizes; any floating dtype) with the box at `offsets` of tensor `t`,
  // reading the overlapping part of each chunk (the whole rows of its stripes). Errors name the
  // shard file and the tensor when a file is missing, lacks the chunk, or holds it with another
  // shape or dtype, and when a stripe (or, in a checkpoint without stripes, a chunk read whole)
  // does not match its CRC-32.
  void read_box(const IndexedTensor& t, const Shape& offsets, Tensor dst);
  // One full tensor, assembled from its chunks.
  Tensor read_full(const IndexedTensor& t);
  // Tensors shaped like `live` (same names, same order): for a DTensor, this rank's local shard
  // (only its boxes are read) wrapped with the live spec; for a plain tensor, the full tensor.
  // The live dtype is kept. Errors list the names `group` lacks or has beyond `whole` (the names
  // of the whole model in `group`; null: those of `live`; a pipeline stage passes every stage's,
  // since its own are a part), and name a tensor whose global shape differs from the live one.
  std::vector<std::pair<std::string, Tensor>> load_like(const std::string& group,
                                                        const std::vector<std::pair<std::string, Tensor>>& live,
                                                        const std::set<std::string>* whole = nullptr);
  uint64_t bytes_read() const;

 private:
  SafetensorsReader& file(const std::string& name, const std::string& tensor);
  // The file of chunk `c`, which holds it under its key with the index's shape and dtype.
  SafetensorsReader& checked_chunk(const IndexedTensor& t, const ChunkBox& c);
  // The box (in_chunk, sizes) of chunk `c`, read as the whole rows of the stripes it touches, each
  // stripe checked against its CRC-32.
  Tensor read_striped(SafetensorsReader& f, const IndexedTensor& t, const ChunkBox& c, const Shape& in_chunk,
                      const Shape& sizes);
  std::string dir_, index_path_;
  ShardedIndex index_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;
};

}  // namespace mt
