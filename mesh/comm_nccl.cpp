// The transport of CUDA tensors: NCCL. This is the only file of mesh/ that includes <nccl.h> or
// CUDA headers and the only one with `#if MT_HAVE_NCCL` (comm_mpi.cpp plays the same part for
// MPI); the front end (communicator.cpp) talks to comm_nccl.h.
//
// Streams: every NCCL communicator has its own communication stream on its device. An operation
// records an event on the calling thread's current stream (the compute stream unless a
// StreamGuard chose another) and makes the communication stream wait on it, so the collective
// sees every kernel queued before it; then the NCCL call(s) and a completion event go on the
// communication stream. The request's test() polls that event (never blocks), so the front end's
// Work::wait() keeps its deadline, and the host learns of completion before it releases or reads
// the buffers. Compute work queued after the wait is therefore ordered after the collective.
#include "mesh/comm_nccl.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "config.h"
#include "runtime/error.h"
#include "runtime/log.h"

#if MT_HAVE_NCCL
#include <nccl.h>

#include "runtime/cuda/check.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/stream.h"
#endif

namespace mt::detail {

#if MT_HAVE_NCCL

static_assert(sizeof(NcclId) == sizeof(ncclUniqueId), "NcclId must hold an ncclUniqueId");

namespace {

[[noreturn]] void nccl_fail(ncclResult_t rc, ncclComm_t comm, const char* expr, const char* file, int line) {
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw Error(fmt::format("NCCL error in `{}` at {}:{}: {}{}{}", expr, file, line, ncclGetErrorString(rc),
                          last && *last ? ": " : "", last ? last : ""));
}

#define MT_NCCL_CHECK(comm, expr)                                         \
  do {                                                                    \
    ncclResult_t mt_nccl_rc_ = (expr);                                    \
    if (mt_nccl_rc_ != ncclSuccess) [[unlikely]]                          \
      ::mt::detail::nccl_fail(mt_nccl_rc_, (comm), #expr, __FILE__, __LINE__); \
  } while (0)

// Communicators still alive when the process exits are left to the OS: at that point the CUDA
// runtime may already be torn down, and ncclCommDestroy could wait on peers that are gone.
std::atomic<bool> g_exiting{false};
void mark_exiting() { g_exiting.store(true); }

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF64: return ncclFloat64;
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI64: return ncclInt64;
    case DType::kI32: return ncclInt32;
    case DType::kU8: return ncclUint8;
    case DType::kBool: return ncclUint8;  // 0/1 bytes: max = or, min = and
  }
  MT_ASSERT(false, "unknown dtype");
  return ncclUint8;
}

ncclRedOp_t nccl_op(NativeOp op) {
  switch (op) {
    case NativeOp::kSum: return ncclSum;
    case NativeOp::kMax: return ncclMax;
    case NativeOp::kMin: return ncclMin;
  }
  return ncclSum;
}

size_t to_count(int64_t n) {
  MT_ASSERT(n >= 0, "negative count {}", n);
  return static_cast<size_t>(n);
}

}  // namespace

class NcclComm {
 public:
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  std::string description;
  cuda::Stream stream;
  std::mutex mutex;  // NCCL calls on one communicator come from one thread at a time
  std::atomic<bool> aborted{false};

  ~NcclComm() {
    if (!comm || aborted.load() || g_exiting.load()) return;
    cuda::DeviceGuard g(device);
    if (ncclCommDestroy(comm) != ncclSuccess)
      MT_LOG_WARN("NCCL: ncclCommDestroy failed for {}: {}", description, ncclGetLastError(comm));
  }

  void abort() noexcept {
    if (!comm || aborted.exchange(true)) return;
    (void)ncclCommAbort(comm);
  }
};

namespace {

// One enqueued NCCL operation: complete when its event on the communication stream is.
class NcclRequest final : public RequestHandle {
 public:
  NcclRequest(NcclPtr c, const char* op) : c_(std::move(c)), op_(op) {}

  bool test() override {
    if (done_) return true;
    MT_CHECK(!c_->aborted.load(), "{} on {}: the NCCL communicator was aborted after an earlier error",
             op_, c_->description);
    if (done.query()) {
      done_ = true;
      return true;
    }
    ncclResult_t async = ncclSuccess;
    MT_NCCL_CHECK(c_->comm, ncclCommGetAsyncError(c_->comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string last = ncclGetLastError(c_->comm);
      c_->abort();
      MT_FAIL("{} on {}: NCCL reported an asynchronous error ({}{}{}); the NCCL communicator was aborted",
              op_, c_->description, ncclGetErrorString(async), last.empty() ? "" : ": ", last);
    }
    return false;
  }

  cuda::Event ready, done;

 private:
  NcclPtr c_;
  const char* op_;
  bool done_ = false;
};

// Orders the operation after the caller's current stream, enqueues it on the communication
// stream (enqueue(comm, stream)), records completion.
template <class F>
RequestPtr launch(const NcclPtr& c, const char* op, F&& enqueue) {
  MT_CHECK(!c->aborted.load(), "{} on {}: the NCCL communicator was aborted after an earlier error", op,
           c->description);
  std::lock_guard<std::mutex> lock(c->mutex);
  cuda::DeviceGuard g(c->device);
  auto r = std::make_unique<NcclRequest>(c, op);
  r->ready.record(cuda::current_stream_of(c->device));
  r->ready.wait(c->stream);
  enqueue(c->comm, c->stream.handle());
  r->done.record(c->stream);
  return r;
}

const char* bytes_at(const void* p, int64_t elems, DType dt) {
  return static_cast<const char*>(p) + elems * static_cast<int64_t>(dtype_size(dt));
}
char* bytes_at(void* p, int64_t elems, DType dt) {
  return static_cast<char*>(p) + elems * static_cast<int64_t>(dtype_size(dt));
}

}  // namespace

bool nccl_built() { return true; }

NcclId nccl_unique_id() {
  ncclUniqueId id;
  MT_NCCL_CHECK(nullptr, ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

NcclPtr nccl_init(const NcclId& id, int rank, int size, int device, std::string description) {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(mark_exiting); });
  cuda::check_device(Device::cuda(device), "an NCCL communicator");
  cuda::DeviceGuard g(device);
  auto c = std::make_shared<NcclComm>();
  c->rank = rank;
  c->size = size;
  c->device = device;
  c->description = std::move(description);
  c->stream = cuda::Stream::create(device);
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  MT_NCCL_CHECK(nullptr, ncclCommInitRank(&c->comm, size, uid, rank));
  int v = 0;
  (void)ncclGetVersion(&v);
  MT_LOG_DEBUG("NCCL {}: communicator for {} on cuda:{} (rank {} of {})", v, c->description, device, rank, size);
  return c;
}

int nccl_device(const NcclComm& c) { return c.device; }

void nccl_abort(NcclComm& c) noexcept { c.abort(); }

RequestPtr nccl_all_reduce(const NcclPtr& c, const char* op, void* buf, int64_t count, DType dtype,
                           NativeOp rop) {
  return launch(c, op, [&](ncclComm_t comm, cudaStream_t s) {
    if (count > 0)
      MT_NCCL_CHECK(comm, ncclAllReduce(buf, buf, to_count(count), nccl_type(dtype), nccl_op(rop), comm, s));
  });
}

RequestPtr nccl_all_gather(const NcclPtr& c, const char* op, const void* in, int64_t count, void* out,
                           DType dtype) {
  return launch(c, op, [&](ncclComm_t comm, cudaStream_t s) {
    if (count > 0) MT_NCCL_CHECK(comm, ncclAllGather(in, out, to_count(count), nccl_type(dtype), comm, s));
  });
}

RequestPtr nccl_all_gatherv(const NcclPtr& c, const char* op, const void* in, int64_t count, void* out,
                            const std::vector<int64_t>& counts, DType dtype) {
  MT_ASSERT(static_cast<int>(counts.size()) == c->size, "{} counts for {} ranks", counts.size(), c->size);
  MT_ASSERT(counts[static_cast<size_t>(c->rank)] == count, "own count {} != {}", count,
            counts[static_cast<size_t>(c->rank)]);
  return launch(c, op, [&](ncclComm_t comm, cudaStream_t s) {
    // One broadcast per rank into its slice; the counts are known on every rank, so empty slices
    // are skipped by all of them.
    MT_NCCL_CHECK(comm, ncclGroupStart());
    int64_t offset = 0;
    for (int r = 0; r < c->size; ++r) {
      const int64_t n = counts[static_cast<size_t>(r)];
      if (n > 0) {
        // sendbuff is read on the root only.
        ncclResult_t rc = ncclBroadcast(in, bytes_at(out, offset, dtype), to_count(n), nccl_type(dtype), r, comm, s);
        if (rc != ncclSuccess) {
          (void)ncclGroupEnd();
          nccl_fail(rc, comm, "ncclBroadcast", __FILE__, __LINE__);
        }
      }
      offset += n;
    }
    MT_NCCL_CHECK(comm, ncclGroupEnd());
  });
}

RequestPtr nccl_reduce_scatter(const NcclPtr& c, const char* op, const void* in, void* out,
                               int64_t count_per_rank, DType dtype, NativeOp rop) {
  return launch(c, op, [&](ncclComm_t comm, cudaStream_t s) {
    if (count_per_rank > 0)
      MT_NCCL_CHECK(comm, ncclReduceScatter(in, out, to_count(count_per_rank), nccl_type(dtype), nccl_op(rop), comm, s));
  });
}

RequestPtr nccl_all_to_allv(const NcclPtr& c, const char* op, const void* in,
                            const std::vector<int64_t>& send_counts, void* out,
                            const std::vector<int64_t>& recv_counts, DType dtype) {
  MT_ASSERT(static_cast<int>(send_counts.size()) == c->size && static_cast<int>(recv_counts.size()) == c->size,
            "all_to_allv counts for {} ranks", c->size);
  return launch(c, op, [&](ncclComm_t comm, cudaStream_t s) {
    MT_NCCL_CHECK(comm, ncclGroupStart());
    int64_t soff = 0, roff = 0;
    for (int r = 0; r < c->size; ++r) {
      const int64_t ns = send_counts[static_cast<size_t>(r)], nr = recv_counts[static_cast<size_t>(r)];
      ncclResult_t rc = ncclSuccess;
      if (ns > 0) rc = ncclSend(bytes_at(in, soff, dtype), to_count(ns), nccl_type(dtype), r, comm, s);
      if (rc == ncclSuccess && nr > 0)
        rc = ncclRecv(bytes_at(out, roff, dtype), to_count(nr), nccl_type(dtype), r, comm, s);
      if (rc != ncclSuccess) {
        (void)ncclGroupEnd();
        nccl_fail(rc, comm, "ncclSend/ncclRecv", __FILE__, __LINE__);
      }
      soff += ns;
      roff += nr;
    }
    MT_NCCL_CHECK(comm, ncclGroupEnd());
  });
}

RequestPtr nccl_broadcast(const NcclPtr& c, const char* op, void* buf, int64_t count, DType dtype, int root) {
  return launch(c, op, [&](ncclComm_t comm, cudaStream_t s) {
    if (count > 0) MT_NCCL_CHECK(comm, ncclBroadcast(buf, buf, to_count(count), nccl_type(dtype), root, comm, s));
  });
}

RequestPtr nccl_send(const NcclPtr& c, const char* op, const void* buf, int64_t count, DType dtype, int peer) {
  MT_ASSERT(peer != c->rank, "NCCL send to itself");
  return launch(c, op, [&](ncclComm_t comm, cudaStream_t s) {
    if (count > 0) MT_NCCL_CHECK(comm, ncclSend(buf, to_count(count), nccl_type(dtype), peer, comm, s));
  });
}

RequestPtr nccl_recv(const NcclPtr& c, const char* op, void* buf, int64_t count, DType dtype, int peer) {
  MT_ASSERT(peer != c->rank, "NCCL recv from itself");
  return launch(c, op, [&](ncclComm_t comm, cudaStream_t s) {
    if (count > 0) MT_NCCL_CHECK(comm, ncclRecv(buf, to_count(count), nccl_type(dtype), peer, comm, s));
  });
}

#else  // !MT_HAVE_NCCL: the front end checks nccl_built() first; nothing below is reached.

class NcclComm {};

namespace {
[[noreturn]] void not_built() {
  MT_FAIL("NCCL collectives: meshtrain was built without NCCL (-Dnccl=disabled, no CUDA backend, or "
          "libnccl/nccl.h not found)");
}
}  // namespace

bool nccl_built() { return false; }
NcclId nccl_unique_id() { not_built(); }
NcclPtr nccl_init(const NcclId&, int, int, int, std::string) { not_built(); }
int nccl_device(const NcclComm&) { return -1; }
void nccl_abort(NcclComm&) noexcept {}
RequestPtr nccl_all_reduce(const NcclPtr&, const char*, void*, int64_t, DType, NativeOp) { not_built(); }
RequestPtr nccl_all_gather(const NcclPtr&, const char*, const void*, int64_t, void*, DType) { not_built(); }
RequestPtr nccl_all_gatherv(const NcclPtr&, const char*, const void*, int64_t, void*,
                            const std::vector<int64_t>&, DType) {
  not_built();
}
RequestPtr nccl_reduce_scatter(const NcclPtr&, const char*, const void*, void*, int64_t, DType, NativeOp) {
  not_built();
}
RequestPtr nccl_all_to_allv(const NcclPtr&, const char*, const void*, const std::vector<int64_t>&, void*,
                            const std::vector<int64_t>&, DType) {
  not_built();
}
RequestPtr nccl_broadcast(const NcclPtr&, const char*, void*, int64_t, DType, int) { not_built(); }
RequestPtr nccl_send(const NcclPtr&, const char*, const void*, int64_t, DType, int) { not_built(); }
RequestPtr nccl_recv(const NcclPtr&, const char*, void*, int64_t, DType, int) { not_built(); }

#endif  // MT_HAVE_NCCL

}  // namespace mt::detail
