// The sharded, asynchronous save protocol of `meshtrain train --plan` (sharded_save.h).
#include "tools/cli/sharded_save.h"

#include <unistd.h>

#include <algorithm>
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

// Rank 0's value, given to every rank.
int64_t broadcast_value(const PlanContext& plan, int64_t value) {
  Tensor t = from_vector<int64_t>({value});
  world_comm(plan).broadcast(t, 0);
  return static_cast<const int64_t*>(t.data_ptr())[0];
}

// The error of the lowest rank that has one, known to every rank ("" when no rank has one), prefixed
// with that rank when it is not this one. Every rank then fails with the message that names the file:
// when one rank's output is cut short (mpirun stops the others once one exits), the cause still shows.
std::string agreed_error(const PlanContext& plan, const std::string& mine) {
  Tensor who = from_vector<int64_t>({mine.empty() ? plan.world : plan.rank});
  world_comm(plan).all_reduce(who, CommReduceOp::kMin);
  const int64_t failed = static_cast<const int64_t*>(who.data_ptr())[0];
  if (failed == plan.world) return "";
  std::vector<int64_t> text;
  if (failed == plan.rank) text.assign(mine.begin(), mine.end());
  Tensor gathered = world_comm(plan).all_gather_uneven(from_vector<int64_t>(text, Shape{static_cast<int64_t>(text.size())}));
  const auto* c = static_cast<const int64_t*>(gathered.data_ptr());
  std::string message(static_cast<size_t>(gathered.numel()), ' ');
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>(c[i]);
  return failed == plan.rank ? message : fmt::format("rank {}: {}", failed, message);
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
  const std::string failed = agreed_error(plan_, why);
  if (!failed.empty()) throw Error(failed);
  const int64_t root_pid = broadcast_value(plan_, pid);
  auto p = std::make_unique<Pending>();
  p->state = state;
  p->tmp = (fs::path(opt_.dir) / fmt::format("{}.tmp.{}", step_dir_name(state.step), root_pid)).string();
  const std::vector<TensorGroup> groups{{"model", model}, {"optimizer", optimizer}};
  SnapshotScope scope;
  std::string mesh = plan_.mesh->str();
  if (plan_.is_pipeline()) {
    // This rank holds its stage's tensors only: plain ones are replicated over the stage's ranks,
    // and a tensor that several stages hold (the optimizer's step, a tied embedding) is written by
    // the first of them.
    const std::vector<int> members = plan_.mesh->world_ranks();
    scope.plain_size = static_cast<int64_t>(members.size());
    scope.plain_index = std::find(members.begin(), members.end(), plan_.rank) - members.begin();
    std::vector<std::string> keys;
    for (const auto& g : groups)
      for (const auto& [name, t] : g.tensors) keys.push_back(g.group + "/" + name);
    const std::vector<std::vector<int64_t>> holders = stages_holding(plan_, keys);
    for (size_t i = 0; i < keys.size(); ++i)
      if (holders[i].front() != plan_.stage) scope.written_elsewhere.insert(keys[i]);
    // The plan's mesh as the user wrote it ([pp=2]), not the runtime's (a pure pp plan runs each
    // stage on a mesh of one rank, an internal "stage" dim).
    std::vector<std::string> quoted;
    for (const std::string& n : plan_.full_mesh.names) quoted.push_back("\"" + n + "\"");
    mesh = fmt::format("DeviceMesh({}, [{}])", plan_.full_mesh.shape, fmt::join(quoted, ", "));
  }
  p->snapshot = snapshot_shard(groups, plan_.rank, plan_.world, mesh, scope);
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
  const std::string write_error = agreed_error(plan_, p->error);
  std::error_code ec;
  if (!write_error.empty()) {
    if (plan_.is_root()) fs::remove_all(p->tmp, ec);
    throw Error(fmt::format("checkpoint of step {}: {}", p->state.step, write_error));
  }
  std::string why;
  std::string final_path;
  if (plan_.is_root()) {
    try {
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
      final_path = commit_step_directory(opt_.dir, p->tmp, p->state.step, opt_.overwrite);
      apply_retention(opt_.dir, opt_.keep, opt_.resumed_from);
    } catch (const std::exception& e) {
      why = fmt::format("checkpoint of step {}: {}", p->state.step, e.what());
      fs::remove_all(p->tmp, ec);
    }
  }
  const std::string failed = agreed_error(plan_, why);
  if (!failed.empty()) throw Error(failed);
  if (plan_.is_root()) fmt::print("checkpoint {}\n", final_path);
}

}  // namespace mt::cli
