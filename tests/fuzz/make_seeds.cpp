// Writes the valid seed inputs of tests/fuzz/corpus/ with meshtrain's own writers, so that the
// fuzzers start from files the project really produces (the hand-written edge cases beside them
// are checked in as they are). Usage: fuzz_make_seeds <tests/fuzz/corpus>. The plan seeds are
// copies of plans/*.plan plus hand-written edge cases.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "checkpoint/chunk_index.h"
#include "models/config.h"
#include "models/data.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "models/safetensors.h"
#include "tensor/tensor.h"
#include "tests/fuzz/seed_checkpoints.h"

namespace fs = std::filesystem;
using namespace mt;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds <corpus dir>\n";
    return 2;
  }
  const fs::path root = argv[1];
  for (const char* d : {"safetensors", "hf_config", "hf_index", "token_bin", "token_lines", "sharded_index"})
    fs::create_directories(root / d);

  write_safetensors((root / "safetensors/valid_mixed.safetensors").string(),
                    {{"a.weight", from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
                     {"b.bias", from_vector<float>({1, 2}, {2}, DType::kBF16)},
                     {"c.ids", from_vector<int64_t>({7, 8, 9})},
                     {"d.mask", from_vector<float>({0, 1, 1}, {3}, DType::kBool)},
                     {"e.empty", empty({0, 4})}},
                    {{"format", "pt"}});
  write_safetensors((root / "safetensors/valid_no_tensors.safetensors").string(), {});
  write_safetensors((root / "safetensors/valid_f16_f64.safetensors").string(),
                    {{"h", from_vector<float>({0.5, -2}, {1, 2}, DType::kF16)},
                     {"x", from_vector<double>({3.25})}});

  for (const char* name : {"llama-tiny", "mixtral-tiny", "llama-3-8b"})
    save_hf_config(builtin_config(name), (root / "hf_config" / ("valid_" + std::string(name) + ".json")).string());

  // The fixed directories of fuzz_hf_index and fuzz_sharded_index (seed_checkpoints.h): their indexes.
  const fs::path ck = root / "hf_index/.ckpt";
  fuzz::write_hf_index_checkpoint(ck.string());
  fs::copy_file(ck / kHfIndexFile, root / "hf_index/valid_three_shards.json", fs::copy_options::overwrite_existing);
  fs::remove_all(ck);

  {
    const fs::path step = root / "sharded_index/.step";
    const std::vector<ShardedIndex> parts = fuzz::write_sharded_index_checkpoint(step.string());
    std::ofstream((root / "sharded_index/valid_two_shards.json").string())
        << index_to_json(merge_indexes(parts, step.string()));
    fs::remove_all(step);
  }

  write_token_file((root / "token_bin/valid_u16.bin").string(), {50256, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  write_token_file((root / "token_bin/valid_u32.bin").string(), {128000, 1, 2, 3, 70000, 5, 6, 7, 8, 9});
  write_token_file((root / "token_bin/valid_empty.bin").string(), {});

  std::ofstream((root / "token_lines/valid_2x3.txt").string()) << "1,2,3\n4, 5 ,6\n\n";
  std::ofstream((root / "token_lines/valid_1x1.txt").string()) << "0\n";
  std::cout << "seeds written under " << root.string() << "\n";
  return 0;
}
