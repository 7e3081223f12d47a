// Sharded, asynchronous checkpoint saves of `meshtrain train --plan` (docs/checkpoints.md,
// "Sharded checkpoints"). Each save:
//   1. (collective) commits the previous save if one is pending; rank 0 checks the history rules
//      (prepare_checkpoint_save) and creates the temporary step directory step-N.tmp.<rank 0 pid>,
//      whose pid every rank receives by broadcast (with rank 0's verdict);
//   2. copies this rank's chunks to host memory (snapshot_shard) and
//   3. writes them, with this rank's chunk list, on a background thread (or at once: sync);
//   4. commit (at the next save or finish(), collective): every rank joins its writer, the ranks
//      agree that every shard was written (all-reduce), rank 0 merges the chunk lists into
//      index.json, writes trainer_state.json and config.json, syncs, renames the directory into
//      place and updates `latest` last, then removes checkpoints beyond --keep; its verdict is
//      broadcast so that every rank fails or succeeds together.
// MPI is only called from the main thread; the writer thread does file work only. A failure
// (a full disk) leaves the previous checkpoint and `latest` untouched and names the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "checkpoint/shard_writer.h"
#include "models/config.h"
#include "tools/cli/parallel.h"
#include "tools/cli/train_state.h"

namespace mt::cli {

struct ShardedSaveOptions {
  std::string dir;
  Overwrite overwrite = Overwrite::kRefuse;
  bool async = true;
  int64_t keep = 0;  // 0: keep all
  int64_t resumed_from = 0;  // the step a resumed run started from (apply_retention's lineage)
};

class ShardedSaver {
 public:
  ShardedSaver(ShardedSaveOptions options, const PlanContext& plan, const ModelConfig& config);
  ~ShardedSaver();  // joins a running writer; an uncommitted save stays a temporary
  ShardedSaver(const ShardedSaver&) = delete;
  ShardedSaver& operator=(const ShardedSaver&) = delete;

  // Collective: commits the pending save, then starts this one (committed here when not async).
  void save(const TrainState& state, const NamedTensors& model, const NamedTensors& optimizer);
  // Collective: commits the pending save, if any.
  void finish();
  // Seconds the training loop spent inside save() and finish() (snapshot, waits, commits).
  double blocked_seconds() const { return blocked_s_; }

 private:
  void commit();
  struct Pending;
  ShardedSaveOptions opt_;
  const PlanContext& plan_;
  ModelConfig config_;
  std::unique_ptr<Pending> pending_;
  double blocked_s_ = 0;
};

}  // namespace mt::cli
