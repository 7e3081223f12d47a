// Internal seam between the Communicator front end and NCCL, the transport of CUDA tensors.
// Everything that names NCCL or CUDA types lives in comm_nccl.cpp, the one file with
// `#if MT_HAVE_NCCL`; a build without NCCL compiles the same functions as stubs (nccl_built()
// is false and the front end says so before calling anything else), so no caller needs an #if.
//
// Buffers are raw, contiguous device memory of the communicator's device; counts are in elements
// of `dtype`. Each call orders itself after the work already queued on the calling thread's
// current stream of that device (an event), enqueues the NCCL operation(s) on the communicator's
// own communication stream, and returns a request that completes when the operation is done on
// the GPU. Its test() polls the completion event and ncclCommGetAsyncError: an asynchronous NCCL
// error aborts the NCCL communicator and throws mt::Error naming the operation and the group.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mesh/comm_backend.h"
#include "runtime/dtype.h"

namespace mt::detail {

// True when meshtrain was built with NCCL (MT_HAVE_NCCL).
bool nccl_built();

// The bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES), created by one rank and sent to the others.
using NcclId = std::array<uint8_t, 128>;
NcclId nccl_unique_id();

// One NCCL communicator with its communication stream, bound to one CUDA device.
class NcclComm;

// ncclCommInitRank on `device` (collective over the `size` ranks that received `id`; blocks until
// all of them joined). `description` names the group in errors.
std::shared_ptr<NcclComm> nccl_init(const NcclId& id, int rank, int size, int device,
                                    std::string description);
int nccl_device(const NcclComm& c);
// ncclCommAbort: ends every pending operation of c so that the process can exit; c is unusable
// afterwards. Never throws.
void nccl_abort(NcclComm& c) noexcept;

using NcclPtr = std::shared_ptr<NcclComm>;

// `op` is the collective's name for error messages. Reductions see NativeOp (avg is a sum
// followed by a division in the front end).
RequestPtr nccl_all_reduce(const NcclPtr& c, const char* op, void* buf, int64_t count, DType dtype,
                           NativeOp rop);
RequestPtr nccl_all_gather(const NcclPtr& c, const char* op, const void* in, int64_t count, void* out,
                           DType dtype);
// Rank r's `counts[r]` elements land at the sum of the earlier counts (grouped broadcasts).
RequestPtr nccl_all_gatherv(const NcclPtr& c, const char* op, const void* in, int64_t count, void* out,
                            const std::vector<int64_t>& counts, DType dtype);
RequestPtr nccl_reduce_scatter(const NcclPtr& c, const char* op, const void* in, void* out,
                               int64_t count_per_rank, DType dtype, NativeOp rop);
// Grouped send/recv; counts per peer in elements, packed in rank order on both sides.
RequestPtr nccl_all_to_allv(const NcclPtr& c, const char* op, const void* in,
                            const std::vector<int64_t>& send_counts, void* out,
                            const std::vector<int64_t>& recv_counts, DType dtype);
RequestPtr nccl_broadcast(const NcclPtr& c, const char* op, void* buf, int64_t count, DType dtype, int root);
// Point to point with another rank (NCCL has no tags: messages between two ranks match in order).
RequestPtr nccl_send(const NcclPtr& c, const char* op, const void* buf, int64_t count, DType dtype, int peer);
RequestPtr nccl_recv(const NcclPtr& c, const char* op, void* buf, int64_t count, DType dtype, int peer);

}  // namespace mt::detail
