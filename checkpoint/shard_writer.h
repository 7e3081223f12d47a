// The save side of sharded checkpoints (docs/checkpoints.md, "Sharded checkpoints"). A save is
// two steps so that the second may run on a background thread while training goes on:
//   ShardSnapshot s = snapshot_shard(groups, rank, world, mesh);  // main thread: host copies
//   write_shard(s, tmp_dir);                                       // any thread: files only
// snapshot_shard decides, from each DTensor's spec alone (no communication), which boxes of the
// global tensor this rank writes: every piece of its local shard (mesh/shard_layout.h; a Shard
// placement gives one box, InterleavedShard / RaggedShard several), written by one replica only:
// among the ranks that differ only along mesh dims that do not split the tensor, the one whose
// index there is hash(group/name) mod replicas, which spreads replicated tensors over the ranks.
// A plain (not distributed) tensor is written whole by rank hash mod world.
// Under a pipeline plan (SnapshotScope) a rank holds only its stage's tensors: DTensors live on the
// stage's mesh, plain tensors are replicated over the stage's ranks only, and a tensor that several
// stages hold (the optimizer's step, a tied embedding) is written by one of them alone.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/chunk_index.h"
#include "tensor/tensor.h"

namespace mt {

struct TensorGroup {
  std::string group;  // "model", "optimizer"
  std::vector<std::pair<std::string, Tensor>> tensors;
};

struct ShardSnapshot {
  std::string file;                                     // shard file name
  std::vector<std::pair<std::string, Tensor>> chunks;   // key -> contiguous host copy
  ShardedIndex part;                                    // every tensor, this rank's chunks only
  int64_t bytes = 0;
};

// Which ranks share this rank's tensors. The default (plain_size 0): every rank holds every
// tensor, plain ones replicated over the whole world, DTensors on the whole world's mesh.
struct SnapshotScope {
  // This rank is plain_index of the plain_size ranks that hold its plain tensors (a pipeline stage).
  int64_t plain_index = 0, plain_size = 0;
  // "group/name" of the tensors this rank holds but another stage writes.
  std::set<std::string> written_elsewhere;
};

// Host copies of this rank's chunks (copies, never views: training may go on changing the live
// tensors). A Partial placement is refused naming the tensor, as is (default scope) a DTensor
// whose mesh is not the whole world of `world` ranks.
ShardSnapshot snapshot_shard(const std::vector<TensorGroup>& groups, int64_t rank, int64_t world,
                             const std::string& mesh, const SnapshotScope& scope = {});

// Writes <dir>/<s.file> (fsync'ed) and this rank's chunk list <dir>/<s.file>.chunks.json (with each
// chunk's CRC-32, and the CRC-32 of each stripe of whole rows of about `stripe_bytes`, at least one
// row, which a partial read checks). File work only (no collectives): safe on a background
// thread. Errors (a full disk) name the file.
inline constexpr int64_t kStripeBytes = int64_t{1} << 20;
void write_shard(ShardSnapshot& s, const std::string& dir, int64_t stripe_bytes = kStripeBytes);

// The per-rank chunk list file of a shard file.
std::string chunk_list_name(const std::string& shard_file);

}  // namespace mt
