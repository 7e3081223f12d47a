// The job's world: which rank this process is and how many there are. MPI is the bootstrap
// (`mpirun -np N prog`); a process started without mpirun, or a build without MPI, is a world of
// one. world() initializes the transport on first use and finalizes it at exit.
#pragma once

#include <string>

namespace mt {

class World {
 public:
  int rank() const { return rank_; }
  int size() const { return size_; }
  // "MPI (thread level multiple)" or "none (built without MPI)".
  const std::string& transport() const { return transport_; }

 private:
  friend World& world();
  World();
  int rank_ = 0;
  int size_ = 1;
  std::string transport_;
};

// Initialized on first use (thread-safe); also sets the "[rank r/w]" log prefix.
World& world();

// This process's rank among the job's processes on its node, and how many there are, from the
// launcher's environment (Open MPI: OMPI_COMM_WORLD_LOCAL_RANK/_SIZE; MPICH/Hydra: MPI_LOCALRANKID/
// MPI_LOCALNRANKS; Slurm: SLURM_LOCALID/SLURM_NTASKS_PER_NODE); 0 and 1 when none is set. They
// pick each rank's GPU and tell whether ranks share one (mesh/communicator.h, host staging).
int local_rank();
int local_size();
// This process's rank and the job's size as the launcher gives them (0 and 1 without one), without
// starting the transport: for the log prefix of lines before world() (meshtrain's main sets it)
// and for commands that run in one process and refuse a job of several.
struct LauncherWorld {
  int rank = 0, size = 1;
};
LauncherWorld launcher_world();

// Logs `why` with the rank and ends every rank of the job (MPI_Abort). For failures a rank cannot
// recover from alone, such as a peer that never joins a collective: never a silent hang.
[[noreturn]] void abort_job(const std::string& why);

// How a program's main() ends on an error it caught: logs "[rank r/w] error: <why>" and returns
// the exit code `code` (1 unless the program documents others), unless this process has joined a world of several ranks (world() was started
// and its size is > 1). Then it ends every rank of the job at once (MPI_Abort, exit code `code`):
// returning would leave this rank in MPI_Finalize waiting for peers that may themselves be
// waiting for it in a collective or in communicator creation, an error seen by one rank only
// (its metrics file, its disk) would hang the job. Never starts the transport itself: a process
// that fails before joining logs the rank its launcher gave it and returns `code`, which makes mpirun
// end the job.
int end_job_on_error(const std::string& why, int code = 1);

}  // namespace mt
