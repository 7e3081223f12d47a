// World bootstrap: a function-local static, so the transport starts on first use from any thread.
#include "mesh/world.h"

#include "mesh/comm_backend.h"
#include "runtime/log.h"

namespace mt {

World::World() {
  detail::BackendWorld w = detail::backend_init();
  rank_ = w.rank;
  size_ = w.size;
  transport_ = std::move(w.transport);
  set_log_rank(rank_, size_);
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

}  // namespace mt
