// Host collective bandwidth through meshtrain's Communicator against raw MPI on the same buffers,
// measured in one run: all_gather and reduce_scatter (f32, sum) over all ranks, for several sizes.
// Bus bandwidth follows nccl-tests: algbw * (n - 1) / n, with algbw = total bytes / time.
// Run: mpirun -np 4 --oversubscribe ./build/tools/bench/bench_collectives
// Like bench_matmul with Eigen, this tool includes its baseline (MPI) directly.
#define OMPI_SKIP_MPICXX 1  // the C API is enough; the C++ bindings do not build warning-free
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <functional>

#include "mesh/device_mesh.h"
#include "mesh/world.h"
#include "tensor/ops.h"

namespace {

double best_seconds(const std::function<void()>& f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    f();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank
    best = std::min(best, s);
  }
  return best;
}

}  // namespace

int main() {
  using namespace mt;
  const int n = world().size(), rank = world().rank();
  DeviceMesh mesh(Shape{n}, {"dp"});
  Communicator comm = mesh.comm(0);
  if (rank == 0)
    fmt::print("{:>10} {:>14} {:>10} {:>10} {:>7}   (bus GB/s over {} ranks)\n", "total MiB", "collective",
               "meshtrain", "raw MPI", "ratio", n);
  for (int64_t mib : {1, 16, 64}) {
    const int64_t total = mib * (1 << 20) / 4;  // f32 elements in the full tensor
    const int64_t part = total / n;
    Tensor shard = full({part}, 1.0 + rank), whole = empty({part * n});
    const double bytes = static_cast<double>(part * n) * 4, factor = static_cast<double>(n - 1) / n;
    auto report = [&](const char* name, double t_api, double t_raw) {
      if (rank == 0)
        fmt::print("{:>10} {:>14} {:>10.2f} {:>10.2f} {:>7.3f}\n", mib, name, bytes / t_api * factor * 1e-9,
                   bytes / t_raw * factor * 1e-9, t_raw / t_api);
    };
    const int reps = 10;
    double ag_api = best_seconds([&] { comm.all_gather(shard, whole); }, reps);
    double ag_raw = best_seconds([&] {
      MPI_Allgather(shard.data_ptr(), static_cast<int>(part), MPI_FLOAT, whole.data_ptr(), static_cast<int>(part),
                    MPI_FLOAT, MPI_COMM_WORLD);
    }, reps);
    report("all_gather", ag_api, ag_raw);
    double rs_api = best_seconds([&] { comm.reduce_scatter(whole, shard); }, reps);
    double rs_raw = best_seconds([&] {
      MPI_Reduce_scatter_block(whole.data_ptr(), shard.data_ptr(), static_cast<int>(part), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
    }, reps);
    report("reduce_scatter", rs_api, rs_raw);
  }
  return 0;
}
