// Fuzzes the index of a sharded checkpoint, index.json, through ShardedCheckpointReader
// (checkpoint/shard_reader.h). The directory holds two shard files written once at start-up by
// write_sharded_index_checkpoint (seed_checkpoints.h: stripes of one row, so partial reads check stripes); the input replaces index.json.
// Why: the index comes with a checkpoint a user may have copied or downloaded, it names files to
// open and boxes to read, and its shapes size the tensors a load allocates. Every tensor it lists
// is read whole and by halves; each read must give the bytes or refuse with an error naming the
// index or the shard file.
#include <optional>

#include "checkpoint/shard_reader.h"
#include "tensor/tensor.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/seed_checkpoints.h"

namespace {

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const std::string d = (mt::fuzz::scratch_dir() / "step").string();
    mt::fuzz::write_sharded_index_checkpoint(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string& dir = checkpoint_dir();
  fuzz::write_input("step/index.json", data, size);
  std::optional<ShardedCheckpointReader> reader;
  if (!fuzz::expect_ok_or_user_error([&] { reader.emplace(dir); })) return 0;
  for (const IndexedTensor& t : reader->index().tensors) {
    fuzz::expect_ok_or_user_error([&] { (void)reader->read_full(t); });
    if (t.shape.size() == 0 || t.shape[0] < 2) continue;
    // The second half of dim 0: a box that cuts chunks.
    Shape at(std::vector<int64_t>(static_cast<size_t>(t.shape.size()), 0)), half = t.shape;
    at[0] = t.shape[0] / 2;
    half[0] = t.shape[0] - at[0];
    if (half.numel() > (int64_t{1} << 20)) continue;  // read_box fills a tensor the caller sized
    fuzz::expect_ok_or_user_error([&] { reader->read_box(t, at, empty(half, DType::kF32)); });
  }
  return 0;
}
