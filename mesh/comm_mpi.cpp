// Host transport of the mesh layer: MPI when meshtrain is built with it, otherwise a world of one.
// This is the only file that includes <mpi.h> and the only one with `#if MT_HAVE_MPI` (STYLE.md):
// the rest of mesh/ talks to comm_backend.h. Every MPI call goes through MT_MPI_CHECK, which turns
// an error code (MPI_ERRORS_RETURN is set on every communicator) into an mt::Error carrying the
// expression, file:line and MPI's own error string.
#include "mesh/comm_backend.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "config.h"
#include "runtime/error.h"
#include "runtime/log.h"

#if MT_HAVE_MPI
// The C API only: the deprecated C++ bindings do not compile cleanly under -Werror.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace mt::detail {
namespace {

int to_int(int64_t n, const char* what) {
  MT_CHECK(n >= 0 && n <= INT_MAX,
           "{}: {} elements do not fit one MPI call (at most {}); split the tensor", what, n,
           INT_MAX);
  return static_cast<int>(n);
}

}  // namespace

#if MT_HAVE_MPI

namespace {

[[noreturn]] void mpi_fail(const char* expr, const char* file, int line, int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) len = 0;
  throw Error(fmt::format("MPI error in `{}` at {}:{}: {}", expr, file, line,
                          len ? std::string(buf, static_cast<size_t>(len)) : "unknown error"));
}

}  // namespace

#define MT_MPI_CHECK(expr)                                                         \
  do {                                                                             \
    int mt_mpi_rc_ = (expr);                                                       \
    if (mt_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                                    \
      ::mt::detail::mpi_fail(#expr, __FILE__, __LINE__, mt_mpi_rc_);               \
  } while (0)

namespace {

int g_thread_level = MPI_THREAD_SINGLE;
std::mutex g_mpi_mutex;

// Below MPI_THREAD_MULTIPLE, MPI may be entered by one thread at a time: serialize ourselves.
class MpiLock {
 public:
  MpiLock() : lock_(g_mpi_mutex, std::defer_lock) {
    if (g_thread_level < MPI_THREAD_MULTIPLE) lock_.lock();
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

bool mpi_finalized() {
  int fin = 0;
  MPI_Finalized(&fin);
  return fin != 0;
}

void finalize_at_exit() {
  if (!mpi_finalized()) MPI_Finalize();
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF64: return MPI_DOUBLE;
    case DType::kF32: return MPI_FLOAT;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;  // moved as bits; reduced by the front end
    case DType::kI64: return MPI_INT64_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kU8: return MPI_UINT8_T;
    case DType::kBool: return MPI_UINT8_T;  // max = or, min = and on 0/1 bytes
  }
  MT_ASSERT(false, "unknown dtype");
  return MPI_BYTE;
}

MPI_Op mpi_op(NativeOp op) {
  switch (op) {
    case NativeOp::kSum: return MPI_SUM;
    case NativeOp::kMax: return MPI_MAX;
    case NativeOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "single";
    case MPI_THREAD_FUNNELED: return "funneled";
    case MPI_THREAD_SERIALIZED: return "serialized";
    case MPI_THREAD_MULTIPLE: return "multiple";
    default: return "unknown";
  }
}

// The count and displacement arrays of a v-collective must outlive the request.
class MpiRequest final : public RequestHandle {
 public:
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int> counts_a, displs_a, counts_b, displs_b;
  // A receive: the element count it must get (MPI lets a shorter message complete it, which would
  // leave the rest of the buffer as it was), its type, and the peer and tag for the message.
  int expect = -1;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int peer = -1, tag = -1;

  bool test() override {
    if (req == MPI_REQUEST_NULL) return true;
    MpiLock lock;
    int flag = 0;
    MPI_Status status;
    MT_MPI_CHECK(MPI_Test(&req, &flag, expect >= 0 ? &status : MPI_STATUS_IGNORE));
    if (flag != 0 && expect >= 0) {
      int got = 0;
      MT_MPI_CHECK(MPI_Get_count(&status, type, &got));
      MT_CHECK(got == expect, "recv from rank {} (tag {}): the message holds {} elements but {} were expected (the "
               "ranks disagree about the tensor's size)", peer, tag, got, expect);
    }
    return flag != 0;
  }
  // An unfinished nonblocking collective may be neither freed nor cancelled (MPI 3.1 §5.12);
  // Work waits before dropping one, so this only leaks on a path that is already aborting.
  ~MpiRequest() override = default;
};

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> d(counts.size(), 0);
  int64_t acc = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    d[i] = to_int(acc, "displacement");
    acc += counts[i];
  }
  return d;
}

std::vector<int> int_counts(const std::vector<int64_t>& counts, const char* what) {
  std::vector<int> out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) out[i] = to_int(counts[i], what);
  return out;
}

}  // namespace

class CommHandle {
 public:
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  ~CommHandle() {
    if (comm != MPI_COMM_NULL && !mpi_finalized()) {
      MpiLock lock;
      MPI_Comm_free(&comm);
    }
  }
};

BackendWorld backend_init() {
  int inited = 0;
  MT_MPI_CHECK(MPI_Initialized(&inited));
  if (!inited) {
    // Ask for MULTIPLE; MPI answers with the best level it has (SERIALIZED and below: we lock).
    int provided = MPI_THREAD_SINGLE;
    MT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    g_thread_level = provided;
    std::atexit(finalize_at_exit);
  } else {
    MT_MPI_CHECK(MPI_Query_thread(&g_thread_level));  // the embedding program owns MPI
  }
  MT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  BackendWorld w;
  MT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank));
  MT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w.size));
  w.transport = fmt::format("MPI (thread level {})", thread_level_name(g_thread_level));
  return w;
}

BackendWorld backend_launcher_world() {
  BackendWorld w{0, 1, "launcher environment"};
  // Open MPI's mpirun, then MPICH's Hydra.
  for (const auto& [rank, size] : {std::pair{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                   std::pair{"PMI_RANK", "PMI_SIZE"}}) {
    const char* r = std::getenv(rank);
    const char* n = std::getenv(size);
    if (!r || !n) continue;
    w.rank = std::atoi(r);
    w.size = std::max(1, std::atoi(n));
    break;
  }
  return w;
}

void backend_abort(int code) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited && !mpi_finalized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

std::shared_ptr<CommHandle> backend_create_group(const std::vector<int>& world_ranks, int tag) {
  MpiLock lock;
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MT_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  MT_MPI_CHECK(MPI_Group_incl(world_group, static_cast<int>(world_ranks.size()),
                              world_ranks.data(), &group));
  auto h = std::make_shared<CommHandle>();
  // Collective over the group's members only (unlike MPI_Comm_split, which needs every rank).
  MT_MPI_CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &h->comm));
  MT_MPI_CHECK(MPI_Group_free(&group));
  MT_MPI_CHECK(MPI_Group_free(&world_group));
  MT_MPI_CHECK(MPI_Comm_set_errhandler(h->comm, MPI_ERRORS_RETURN));
  MT_MPI_CHECK(MPI_Comm_rank(h->comm, &h->rank));
  MT_MPI_CHECK(MPI_Comm_size(h->comm, &h->size));
  return h;
}

int backend_rank(const CommHandle& c) { return c.rank; }
int backend_size(const CommHandle& c) { return c.size; }

bool backend_reduces(DType dtype) { return dtype != DType::kBF16 && dtype != DType::kF16; }

RequestPtr backend_iallreduce(CommHandle& c, void* buf, int64_t count, DType dtype, NativeOp op) {
  auto r = std::make_unique<MpiRequest>();
  MpiLock lock;
  MT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(count, "all_reduce"), mpi_type(dtype),
                              mpi_op(op), c.comm, &r->req));
  return r;
}

RequestPtr backend_iallgather(CommHandle& c, const void* in, int64_t count, void* out, DType dtype) {
  auto r = std::make_unique<MpiRequest>();
  const int n = to_int(count, "all_gather");
  MpiLock lock;
  MT_MPI_CHECK(MPI_Iallgather(in, n, mpi_type(dtype), out, n, mpi_type(dtype), c.comm, &r->req));
  return r;
}

RequestPtr backend_iallgatherv(CommHandle& c, const void* in, int64_t count, void* out,
                               const std::vector<int64_t>& counts, DType dtype) {
  auto r = std::make_unique<MpiRequest>();
  r->counts_a = int_counts(counts, "all_gather_uneven");
  r->displs_a = displacements(r->counts_a);
  MpiLock lock;
  MT_MPI_CHECK(MPI_Iallgatherv(in, to_int(count, "all_gather_uneven"), mpi_type(dtype), out,
                               r->counts_a.data(), r->displs_a.data(), mpi_type(dtype), c.comm,
                               &r->req));
  return r;
}

RequestPtr backend_ireduce_scatter(CommHandle& c, const void* in, void* out, int64_t count_per_rank,
                                   DType dtype, NativeOp op) {
  auto r = std::make_unique<MpiRequest>();
  MpiLock lock;
  MT_MPI_CHECK(MPI_Ireduce_scatter_block(in, out, to_int(count_per_rank, "reduce_scatter"),
                                         mpi_type(dtype), mpi_op(op), c.comm, &r->req));
  return r;
}

RequestPtr backend_ialltoall(CommHandle& c, const void* in, void* out, int64_t count_per_rank,
                             DType dtype) {
  auto r = std::make_unique<MpiRequest>();
  const int n = to_int(count_per_rank, "all_to_all");
  MpiLock lock;
  MT_MPI_CHECK(MPI_Ialltoall(in, n, mpi_type(dtype), out, n, mpi_type(dtype), c.comm, &r->req));
  return r;
}

RequestPtr backend_ialltoallv(CommHandle& c, const void* in, const std::vector<int64_t>& send_counts,
                              void* out, const std::vector<int64_t>& recv_counts, DType dtype) {
  auto r = std::make_unique<MpiRequest>();
  r->counts_a = int_counts(send_counts, "all_to_allv");
  r->displs_a = displacements(r->counts_a);
  r->counts_b = int_counts(recv_counts, "all_to_allv");
  r->displs_b = displacements(r->counts_b);
  MpiLock lock;
  MT_MPI_CHECK(MPI_Ialltoallv(in, r->counts_a.data(), r->displs_a.data(), mpi_type(dtype), out,
                              r->counts_b.data(), r->displs_b.data(), mpi_type(dtype), c.comm,
                              &r->req));
  return r;
}

RequestPtr backend_ibcast(CommHandle& c, void* buf, int64_t count, DType dtype, int root) {
  auto r = std::make_unique<MpiRequest>();
  MpiLock lock;
  MT_MPI_CHECK(MPI_Ibcast(buf, to_int(count, "broadcast"), mpi_type(dtype), root, c.comm, &r->req));
  return r;
}

RequestPtr backend_isend(CommHandle& c, const void* buf, int64_t count, DType dtype, int peer, int tag) {
  auto r = std::make_unique<MpiRequest>();
  MpiLock lock;
  MT_MPI_CHECK(MPI_Isend(buf, to_int(count, "send"), mpi_type(dtype), peer, tag, c.comm, &r->req));
  return r;
}

RequestPtr backend_irecv(CommHandle& c, void* buf, int64_t count, DType dtype, int peer, int tag) {
  auto r = std::make_unique<MpiRequest>();
  r->expect = to_int(count, "recv");
  r->type = mpi_type(dtype);
  r->peer = peer;
  r->tag = tag;
  MpiLock lock;
  MT_MPI_CHECK(MPI_Irecv(buf, r->expect, r->type, peer, tag, c.comm, &r->req));
  return r;
}

RequestPtr backend_ibarrier(CommHandle& c) {
  auto r = std::make_unique<MpiRequest>();
  MpiLock lock;
  MT_MPI_CHECK(MPI_Ibarrier(c.comm, &r->req));
  return r;
}

#else  // !MT_HAVE_MPI: a world of one. Every group is {0}; collectives are local copies.

namespace {

class DoneRequest final : public RequestHandle {
 public:
  bool test() override { return true; }
};

RequestPtr done() { return std::make_unique<DoneRequest>(); }

// Messages a rank of one sent to itself, in order; send is eager, recv matches by tag.
struct SelfMessage {
  int tag;
  std::vector<char> bytes;
};
std::mutex g_self_mutex;
std::vector<SelfMessage> g_self_messages;

class SelfRecv final : public RequestHandle {
 public:
  SelfRecv(void* buf, int64_t bytes, int tag) : buf_(buf), bytes_(bytes), tag_(tag) {}
  bool test() override {
    if (done_) return true;
    std::lock_guard<std::mutex> lock(g_self_mutex);
    for (auto it = g_self_messages.begin(); it != g_self_messages.end(); ++it) {
      if (it->tag != tag_) continue;
      MT_CHECK(static_cast<int64_t>(it->bytes.size()) == bytes_,
               "recv: message with tag {} has {} bytes but the receiving tensor has {}", tag_,
               it->bytes.size(), bytes_);
      if (bytes_ > 0) std::memcpy(buf_, it->bytes.data(), it->bytes.size());
      g_self_messages.erase(it);
      done_ = true;
      return true;
    }
    return false;
  }

 private:
  void* buf_;
  int64_t bytes_;
  int tag_;
  bool done_ = false;
};

void copy_elems(const void* in, void* out, int64_t count, DType dtype) {
  if (count > 0 && in != out) std::memcpy(out, in, static_cast<size_t>(count * dtype_size(dtype)));
}

}  // namespace

class CommHandle {};

BackendWorld backend_init() { return BackendWorld{0, 1, "none (built without MPI)"}; }

BackendWorld backend_launcher_world() { return BackendWorld{0, 1, "none (built without MPI)"}; }

void backend_abort(int) { std::abort(); }

std::shared_ptr<CommHandle> backend_create_group(const std::vector<int>& world_ranks, int /*tag*/) {
  MT_ASSERT(world_ranks.size() == 1 && world_ranks[0] == 0, "a world of one has only rank 0");
  return std::make_shared<CommHandle>();
}

int backend_rank(const CommHandle&) { return 0; }
int backend_size(const CommHandle&) { return 1; }

bool backend_reduces(DType dtype) { return dtype != DType::kBF16 && dtype != DType::kF16; }

RequestPtr backend_iallreduce(CommHandle&, void*, int64_t count, DType, NativeOp) {
  to_int(count, "all_reduce");
  return done();
}
RequestPtr backend_iallgather(CommHandle&, const void* in, int64_t count, void* out, DType dtype) {
  copy_elems(in, out, count, dtype);
  return done();
}
RequestPtr backend_iallgatherv(CommHandle&, const void* in, int64_t count, void* out,
                               const std::vector<int64_t>&, DType dtype) {
  copy_elems(in, out, count, dtype);
  return done();
}
RequestPtr backend_ireduce_scatter(CommHandle&, const void* in, void* out, int64_t count, DType dtype,
                                   NativeOp) {
  copy_elems(in, out, count, dtype);
  return done();
}
RequestPtr backend_ialltoall(CommHandle&, const void* in, void* out, int64_t count, DType dtype) {
  copy_elems(in, out, count, dtype);
  return done();
}
RequestPtr backend_ialltoallv(CommHandle&, const void* in, const std::vector<int64_t>& send_counts,
                              void* out, const std::vector<int64_t>&, DType dtype) {
  copy_elems(in, out, send_counts.at(0), dtype);
  return done();
}
RequestPtr backend_ibcast(CommHandle&, void*, int64_t, DType, int) { return done(); }
RequestPtr backend_isend(CommHandle&, const void* buf, int64_t count, DType dtype, int, int tag) {
  const auto* p = static_cast<const char*>(buf);
  std::lock_guard<std::mutex> lock(g_self_mutex);
  g_self_messages.push_back({tag, std::vector<char>(p, p + count * dtype_size(dtype))});
  return done();
}
RequestPtr backend_irecv(CommHandle&, void* buf, int64_t count, DType dtype, int, int tag) {
  return std::make_unique<SelfRecv>(buf, count * dtype_size(dtype), tag);
}
RequestPtr backend_ibarrier(CommHandle&) { return done(); }

#endif  // MT_HAVE_MPI

}  // namespace mt::detail
