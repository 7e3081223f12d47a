// World bootstrap: a function-local static, so the transport starts on first use from any thread.
#include "mesh/world.h"

#include <atomic>
#include <cstdlib>
#include <initializer_list>

#include "mesh/comm_backend.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace mt {
namespace {

std::atomic<int> g_started_world_size{0};  // 0 until world() has started the transport

}  // namespace

World::World() {
  detail::BackendWorld w = detail::backend_init();
  rank_ = w.rank;
  size_ = w.size;
  transport_ = std::move(w.transport);
  set_log_rank(rank_, size_);
  g_started_world_size.store(size_);
  MT_LOG_DEBUG("world of {} rank(s), transport {}", size_, transport_);
}

LauncherWorld launcher_world() {
  const detail::BackendWorld w = detail::backend_launcher_world();
  return {w.rank, w.size};
}

World& world() {
  static World w;
  return w;
}

void abort_job(const std::string& why) {
  try {
    world();  // the log prefix names the rank
  } catch (...) {  // the transport itself failed to start: still log and end this process
  }
  MT_LOG_ERROR("aborting the job: {}", why);
  detail::backend_abort();
}

int end_job_on_error(const std::string& why, int code) {
  if (g_started_world_size.load() == 0) {
    // Failed before joining the world: name the rank the launcher gave us. Returning is then
    // enough, since mpirun ends the job when a process exits non-zero without initializing MPI.
    const detail::BackendWorld w = detail::backend_launcher_world();
    set_log_rank(w.rank, w.size);
  }
  MT_LOG_ERROR("{}", why);
  if (g_started_world_size.load() > 1) detail::backend_abort(code);
  return code;
}


namespace {
int env_int(std::initializer_list<const char*> vars, int fallback, int lo) {
  for (const char* var : vars) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    MT_CHECK(end && *end == '\0' && r >= lo && r < (1 << 24), "{}={} is not a valid value (from the launcher)",
             var, v);
    return static_cast<int>(r);
  }
  return fallback;
}
}  // namespace

int local_rank() { return env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, 0, 0); }
int local_size() {
  return env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}, 1, 1);
}

}  // namespace mt
