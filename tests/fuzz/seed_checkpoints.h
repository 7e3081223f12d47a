// The fixed checkpoints that the index fuzzers read, and whose indexes fuzz_make_seeds writes as
// seeds: one definition, so that a seed always fits the directory its fuzzer replaces the index in.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/chunk_index.h"
#include "checkpoint/shard_writer.h"
#include "models/config.h"
#include "models/hf_checkpoint.h"
#include "tensor/tensor.h"

namespace mt::fuzz {

// A Hugging Face checkpoint of llama-tiny's config with three one-tensor shards
// (model.safetensors.index.json names them): fuzz_hf_index.
inline void write_hf_index_checkpoint(const std::string& dir) {
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"model.embed_tokens.weight", from_vector<float>({1, 2})},
      {"model.norm.weight", from_vector<float>({3, 4})},
      {"lm_head.weight", from_vector<float>({5, 6})},
  };
  write_hf_checkpoint(dir, builtin_config("llama-tiny"), tensors, DType::kF32, /*max_shard_bytes=*/8);
}

// The two shard files of a world of two (plain tensors: each written whole by one rank, the hash
// of its name), stripes of one row: fuzz_sharded_index. Returns the ranks' chunk lists (no
// index.json is written).
inline std::vector<ShardedIndex> write_sharded_index_checkpoint(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::vector<TensorGroup> groups = {
      {"model",
       {{"a", arange(0.0, 12.0, 1.0, DType::kF32).reshape({4, 3})},
        {"b", from_vector<float>({1, 2, 3, 4, 5}, {5}, DType::kBF16)},
        {"c", arange(0.0, 24.0, 1.0, DType::kF32).reshape({2, 3, 4})}}},
      {"optimizer", {{"step", scalar_tensor(7, DType::kI64)}}},
  };
  std::vector<ShardedIndex> parts;
  for (int64_t r = 0; r < 2; ++r) {
    ShardSnapshot s = snapshot_shard(groups, r, 2, "");
    write_shard(s, dir, 1);
    parts.push_back(read_sharded_index((std::filesystem::path(dir) / chunk_list_name(s.file)).string(), false));
  }
  return parts;
}

}  // namespace mt::fuzz
