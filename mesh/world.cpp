// World bootstrap: a function-local static, so the transport starts on first use from any thread.
#include "mesh/world.h"

#include <atomic>

#include "mesh/comm_backend.h"
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

}  // namespace mt
