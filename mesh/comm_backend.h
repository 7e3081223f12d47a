// Internal seam between the mesh layer and its host transport. Everything that names MPI lives in
// comm_mpi.cpp, the one file with `#if MT_HAVE_MPI`; without MPI the same functions implement a
// world of one (every group has one member and every collective is a local copy).
// Buffers are raw, contiguous and host-resident; counts are in elements of `dtype`. The
// Communicator front end (communicator.cpp) validates tensors and turns 16-bit float reductions
// into gathers, so the reductions here only see dtypes the transport reduces natively.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace mt::detail {

// Reductions the transport performs natively (avg is a sum followed by a division).
enum class NativeOp { kSum, kMax, kMin };

// A group communicator (an MPI_Comm in MPI builds). Freed when the last handle goes, unless MPI is
// already finalized.
class CommHandle;

// One in-flight nonblocking operation (an MPI_Request in MPI builds).
class RequestHandle {
 public:
  virtual ~RequestHandle() = default;
  // True once complete; throws mt::Error on a transport error (MT_MPI_CHECK).
  virtual bool test() = 0;
};
using RequestPtr = std::unique_ptr<RequestHandle>;

struct BackendWorld {
  int rank = 0;
  int size = 1;
  std::string transport;  // "MPI (thread level ...)" or "none (built without MPI)"
};

// Initializes MPI if needed (MPI_Init_thread, errors returned rather than fatal) and registers
// MPI_Finalize with atexit when meshtrain was the one to initialize it. Called once by world().
BackendWorld backend_init();
// Ends every rank of the job: MPI_Abort with exit code `code`, or std::abort in a build without
// MPI.
[[noreturn]] void backend_abort(int code = 1);
// The rank and world size the launcher gave this process (mpirun's environment), read without
// starting MPI; {0, 1} when there is no launcher or MPI is not built in.
BackendWorld backend_launcher_world();

// A communicator over `world_ranks` (in that order); collective over those ranks only.
// `tag` tells apart groups created concurrently over the same ranks.
std::shared_ptr<CommHandle> backend_create_group(const std::vector<int>& world_ranks, int tag);
int backend_rank(const CommHandle& c);
int backend_size(const CommHandle& c);

// True when the transport can reduce `dtype` natively (f64, f32, i64, i32, u8, bool).
bool backend_reduces(DType dtype);

RequestPtr backend_iallreduce(CommHandle& c, void* buf, int64_t count, DType dtype, NativeOp op);
RequestPtr backend_iallgather(CommHandle& c, const void* in, int64_t count, void* out, DType dtype);
RequestPtr backend_iallgatherv(CommHandle& c, const void* in, int64_t count, void* out,
                               const std::vector<int64_t>& counts, DType dtype);
RequestPtr backend_ireduce_scatter(CommHandle& c, const void* in, void* out, int64_t count_per_rank,
                                   DType dtype, NativeOp op);
RequestPtr backend_ialltoall(CommHandle& c, const void* in, void* out, int64_t count_per_rank,
                             DType dtype);
RequestPtr backend_ialltoallv(CommHandle& c, const void* in, const std::vector<int64_t>& send_counts,
                              void* out, const std::vector<int64_t>& recv_counts, DType dtype);
RequestPtr backend_ibcast(CommHandle& c, void* buf, int64_t count, DType dtype, int root);
RequestPtr backend_isend(CommHandle& c, const void* buf, int64_t count, DType dtype, int peer, int tag);
RequestPtr backend_irecv(CommHandle& c, void* buf, int64_t count, DType dtype, int peer, int tag);
RequestPtr backend_ibarrier(CommHandle& c);

}  // namespace mt::detail
