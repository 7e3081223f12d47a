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

// Logs `why` with the rank and ends every rank of the job (MPI_Abort). For failures a rank cannot
// recover from alone, such as a peer that never joins a collective: never a silent hang.
[[noreturn]] void abort_job(const std::string& why);

}  // namespace mt
