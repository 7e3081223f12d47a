// The sharded, asynchronous save protocol of `meshtrain train --plan` (sharded_save.h).
#include "tools/cli/sharded_save.h"

#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>

#include "checkpoint/chunk_index.h"
#include "mesh/communicator.h"
#include "models/safetensors.h"
#include "runtime/error.h"

namespace mt::cli {

namespace fs = std::filesystem;

struct ShardedSaver::Pending {
  TrainState state;
  std::string tmp;  // the temporary step directory
  ShardSnapshot snapshot;
  std::thread writer;
  std::string error;  // the writer's failure ("" when it succeeded)
};

namespace {

// Rank 0's (ok, value) given to every rank: a verdict and a number (rank 0's pid).
std::pair<bool, int64_t> broadcast_verdict(const PlanContext& plan, bool ok, int64_t value) {
  Tensor t = from_vector<int64_t>({ok ? 1 : 0, value});
  plan.mesh->comm().broadcast(t, 0);
  const auto* p = static_cast<const int64_t*>(t.data_ptr());
  return {p[0] == 1, p[1]};
}

// Whether every rank's `ok` holds.
bool all_ok(const PlanContext& plan, bool ok) {
  Tensor t = from_vector<int64_t>({ok ? 1 : 0});
  plan.mesh->comm().all_reduce(t, CommReduceOp::kMin);
  return static_cast<const int64_t*>(t.data_ptr())[0] == 1;
}

}  // namespace

ShardedSaver::ShardedSaver(ShardedSaveOptions options, const PlanContext& plan, const ModelConfig& config)
    : opt_(std::move(options)), plan_(plan), config_(config) {}

ShardedSaver::~ShardedSaver() {
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

void ShardedSaver::save(const TrainState& state, const NamedTensors& model, const NamedTensors& optimizer) {
  const auto t0 = std::chrono::steady_clock::now();
  commit();
  // Rank 0 checks the history rules and makes the temporary directory; every rank learns its name.
  std::string why;
  int64_t pid = 0;
  if (plan_.is_root()) {
    try {
      prepare_checkpoint_save(opt_.dir, state.step, opt_.overwrite);
      pid = static_cast<int64_t>(::getpid());
      const fs::path tmp = fs::path(opt_.dir) / fmt::format("{}.tmp.{}", step_dir_name(state.step), pid);
      std::error_code ec;
      fs::remove_all(tmp, ec);
      fs::create_directory(tmp, ec);
      MT_CHECK(!ec, "cannot create the temporary checkpoint directory {}: {}", tmp.string(), ec.message());
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  auto [ok, root_pid] = broadcast_verdict(plan_, why.empty(), pid);
  if (!why.empty()) throw Error(why);
  MT_CHECK(ok, "checkpoint of step {}: rank 0 could not start it (its error names the cause)", state.step);
  auto p = std::make_unique<Pending>();
  p->state = state;
  p->tmp = (fs::path(opt_.dir) / fmt::format("{}.tmp.{}", step_dir_name(state.step), root_pid)).string();
  p->snapshot = snapshot_shard({{"model", model}, {"optimizer", optimizer}}, plan_.rank, plan_.world,
                               plan_.mesh->str());
  Pending* raw = p.get();
  auto write = [raw] {
    try {
      write_shard(raw->snapshot, raw->tmp);
    } catch (const std::exception& e) {
      raw->error = e.what();
      if (raw->error.empty()) raw->error = "unknown error";
    }
    raw->snapshot.chunks.clear();  // the host copies are no longer needed
  };
  if (opt_.async) {
    p->writer = std::thread(write);
  } else {
    write();
  }
  pending_ = std::move(p);
  if (!opt_.async) commit();
  blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ShardedSaver::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  commit();
  blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ShardedSaver::commit() {
  if (!pending_) return;
  std::unique_ptr<Pending> p = std::move(pending_);
  if (p->writer.joinable()) p->writer.join();
  const bool written = all_ok(plan_, p->error.empty());
  std::string why;
  std::string final_path;
  if (plan_.is_root()) {
    std::error_code ec;
    try {
      MT_CHECK(written, "checkpoint of step {}: {}", p->state.step,
               p->error.empty() ? "another rank could not write its shard (its error names the file)" : p->error);
      std::vector<ShardedIndex> parts;
      for (int r = 0; r < plan_.world; ++r) {
        const fs::path list = fs::path(p->tmp) / chunk_list_name(shard_file_name(r, plan_.world));
        parts.push_back(read_sharded_index(list.string(), /*check=*/false));
        fs::remove(list, ec);
      }
      const ShardedIndex index = merge_indexes(parts, p->tmp);
      const std::string text = index_to_json(index);
      write_file_atomically((fs::path(p->tmp) / kShardedIndexFile).string(), [&](std::ostream& o) { o << text; });
      write_train_state(p->tmp, p->state);
      write_checkpoint_config(p->tmp, config_);
      final_path = commit_step_directory(opt_.dir, p->tmp, p->state.step);
      apply_retention(opt_.dir, opt_.keep);
    } catch (const std::exception& e) {
      why = e.what();
      fs::remove_all(p->tmp, ec);
    }
  } else if (!p->error.empty()) {
    why = p->error;
  }
  auto [ok, unused] = broadcast_verdict(plan_, plan_.is_root() ? why.empty() : true, 0);
  (void)unused;
  if (!why.empty()) throw Error(why);
  MT_CHECK(ok, "checkpoint of step {}: rank 0 could not commit it (its error names the cause)", p->state.step);
  if (plan_.is_root()) fmt::print("checkpoint {}\n", final_path);
}

}  // namespace mt::cli
