// A job in which rank 1 never joins an all_reduce: it sleeps ("hang") or leaves without
// finalizing ("exit"); or never joins the creation of the communicator ("create": it sleeps
// first). Rank 0 must end the whole job with an error naming the collective (or the creation)
// once MT_COLLECTIVE_TIMEOUT_S passes (checked by test_killed_rank.sh), never hang. In "throw",
// rank 0 fails with an all_reduce in flight: the error must end the job at once, not after the
// timeout that the in-flight collective's wait during unwinding would take.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "mesh/device_mesh.h"
#include "mesh/world.h"
#include "runtime/error.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "hang";
  try {
    mt::DeviceMesh mesh({mt::world().size()}, {"dp"});
    if (mode == "create" && mt::world().rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(120));
    mt::Communicator comm = mesh.comm();
    comm.barrier();
    if (mt::world().rank() == 1) {
      if (mode == "exit") std::_Exit(0);
      std::this_thread::sleep_for(std::chrono::seconds(120));
    }
    mt::Tensor t = mt::ones(mt::Shape{4});
    if (mode == "throw") {
      mt::Work w = comm.all_reduce_async(t);
      MT_FAIL("rank 0 failed with an all_reduce in flight");
    }
    comm.all_reduce(t);
    std::printf("rank %d: all_reduce returned, which it must not\n", mt::world().rank());
    return 0;
  } catch (const std::exception& e) {
    mt::abort_job(e.what());
  }
}
