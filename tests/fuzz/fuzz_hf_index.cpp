// Fuzzes the sharded checkpoint index, model.safetensors.index.json, through read_hf_checkpoint
// (models/hf_checkpoint.h). The directory holds a valid config.json and three one-tensor shards
// (written once at start-up: write_hf_index_checkpoint, seed_checkpoints.h); the input replaces the index. Why: the index
// names files to open, so it must never reach outside the directory, and every disagreement with
// the shards (missing, extra, duplicated or misplaced tensors) must be an error naming both.
#include <set>

#include "models/hf_checkpoint.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/seed_checkpoints.h"

namespace {

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const std::string d = (mt::fuzz::scratch_dir() / "ckpt").string();
    mt::fuzz::write_hf_index_checkpoint(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string& dir = checkpoint_dir();
  fuzz::write_input("ckpt/model.safetensors.index.json", data, size);
  HfCheckpoint ck;
  if (!fuzz::expect_ok_or_user_error([&] { ck = read_hf_checkpoint(dir); })) return 0;
  // Shards the index does not name are not read (as in transformers), so fewer tensors are fine;
  // more, or a name twice, is not.
  std::set<std::string> names;
  for (const auto& [name, t] : ck.tensors)
    if (!names.insert(name).second || names.size() > 3) fuzz::finding("index", "tensor '" + name + "' read twice");
  return 0;
}
