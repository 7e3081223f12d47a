// A job that leaks one block on purpose after a real collective, for test_leak_check.sh: the
// sanitizer build's LeakSanitizer settings must report this leak of meshtrain-side code, on every
// rank, and nothing of Open MPI's (its exit-time allocations are suppressed, lsan.supp).
#include <cstdlib>

#include "mesh/device_mesh.h"
#include "mesh/world.h"

namespace {

void* volatile g_block = nullptr;

[[gnu::noinline]] void leak_on_purpose() {
  g_block = std::malloc(4096);
  g_block = nullptr;  // the last pointer to the block is gone
}

}  // namespace

int main() {
  try {
    mt::DeviceMesh mesh({mt::world().size()}, {"dp"});
    mt::Communicator comm = mesh.comm();
    mt::Tensor t = mt::ones(mt::Shape{4});
    comm.all_reduce(t);
    leak_on_purpose();
    return 0;
  } catch (const std::exception& e) {
    mt::abort_job(e.what());
  }
}
