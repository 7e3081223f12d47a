// Communicator front end: validates tensors (naming the collective, shapes and group), routes
// host tensors to MPI and CUDA tensors to NCCL (staged through host memory when ranks share a
// GPU), turns 16-bit float reductions of host tensors into gathers reduced in f32 in rank order,
// and waits on the transport with a deadline. The transports are comm_backend.h (MPI or a world
// of one) and comm_nccl.h (NCCL, its communicator created per group on the first CUDA
// collective, with the unique id broadcast over MPI).
#include "mesh/communicator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "mesh/collective_count.h"
#include "mesh/comm_backend.h"
#include "mesh/comm_nccl.h"
#include "mesh/world.h"
#include "runtime/cuda/device.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "tensor/autograd.h"
#include "tensor/ops_pointwise.h"

namespace mt {

const char* comm_reduce_op_name(CommReduceOp op) {
  switch (op) {
    case CommReduceOp::kSum: return "sum";
    case CommReduceOp::kAvg: return "avg";
    case CommReduceOp::kMax: return "max";
    case CommReduceOp::kMin: return "min";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Timeouts

namespace {

constexpr std::chrono::milliseconds kDefaultTimeout{300'000};

std::chrono::milliseconds timeout_from_env() {
  const char* s = std::getenv("MT_COLLECTIVE_TIMEOUT_S");
  if (!s || !*s) return kDefaultTimeout;
  char* end = nullptr;
  const double secs = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(secs > 0)) {
    MT_LOG_WARN("MT_COLLECTIVE_TIMEOUT_S='{}' is not a positive number of seconds; using {} s", s,
                kDefaultTimeout.count() / 1000);
    return kDefaultTimeout;
  }
  // `inf` (and anything past about 116 days) means no deadline in practice: capped so that the
  // milliseconds fit (inf * 1000 converted to int64 was undefined and came out negative, a timeout
  // at once blamed on the peers); below a millisecond rounds up to one.
  constexpr double kMaxSeconds = 1e7;
  const double capped = std::min(secs, kMaxSeconds);
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::ceil(capped * 1000.0))));
}

std::atomic<int64_t>& timeout_ms() {
  static std::atomic<int64_t> ms{timeout_from_env().count()};
  return ms;
}

}  // namespace

std::chrono::milliseconds collective_timeout() { return std::chrono::milliseconds(timeout_ms().load()); }

void set_collective_timeout(std::chrono::milliseconds timeout) {
  MT_CHECK(timeout.count() > 0, "set_collective_timeout: timeout must be positive, got {} ms",
           timeout.count());
  timeout_ms().store(timeout.count());
}

// ---------------------------------------------------------------------------------------------
// Work

using Clock = std::chrono::steady_clock;

struct Communicator::Impl {
  std::shared_ptr<detail::CommHandle> handle;
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks;
  std::string description;
  std::string label;       // mesh dims, for collective counting
  bool simulated = false;  // Communicator::simulated: no transport
  // NCCL: created on the first CUDA collective (collective over the group), then reused.
  mutable std::mutex nccl_mutex;
  mutable detail::NcclPtr nccl;
  // CUDA tensors a rank sends itself (NCCL has no self send): copies by tag, in order.
  mutable std::mutex self_mutex;
  mutable std::vector<std::pair<int, Tensor>> self_messages;
};

// How long a collective waited on during stack unwinding may still take (Work::State::wait); once
// one was abandoned, the others of the same error (a reducer's buckets, a pipeline's sends) get
// only a glance, so that the error is not held back by one grace per handle.
constexpr std::chrono::milliseconds kUnwindGrace{2000}, kUnwindGlance{50};
std::atomic<bool> g_abandoning{false};  // set by an abandonment, cleared by a wait outside unwinding

struct Work::State {
  std::string op;
  std::shared_ptr<const Communicator::Impl> comm;
  std::vector<detail::RequestPtr> requests;
  std::function<void()> finish;  // runs once, after every request completed
  std::function<void()> on_timeout;  // before abort_job (NCCL: ncclCommAbort)
  std::vector<Tensor> keep;      // buffers the transport reads or writes
  Tensor result;
  Clock::time_point start = Clock::now();
  std::chrono::milliseconds timeout = collective_timeout();
  bool done = false;
  std::mutex mutex;

  bool poll() {  // under mutex
    for (auto& r : requests)
      if (!r->test()) return false;
    return true;
  }
  void complete() {  // under mutex
    requests.clear();
    if (finish) finish();
    finish = nullptr;
    keep.clear();
    done = true;
  }
  void abandon() {  // under mutex: see wait()
    static std::mutex leak_mutex;
    static std::vector<std::pair<std::vector<detail::RequestPtr>, std::vector<Tensor>>>* leaked =
        new std::vector<std::pair<std::vector<detail::RequestPtr>, std::vector<Tensor>>>();  // never freed
    std::lock_guard<std::mutex> lock(leak_mutex);
    leaked->emplace_back(std::move(requests), std::move(keep));
    requests.clear();
    keep.clear();
    finish = nullptr;
    done = true;
  }
  void wait() {
    std::lock_guard<std::mutex> lock(mutex);
    if (done) return;
    // Waited on while an exception unwinds the stack (a destructor of a bucket, a pending pipeline
    // send, a dropped handle): the error already ends the job, and peers that did not see it will
    // not complete this collective. Rather than hold the error back for the whole timeout, give
    // the collective a short grace, then leave it in flight: its buffers are kept for the rest of
    // the process (the transport may still write them) and nothing is copied out.
    const bool unwinding = std::uncaught_exceptions() > 0;
    if (!unwinding) g_abandoning.store(false);
    const auto limit = std::min<std::chrono::milliseconds>(timeout, g_abandoning.load() ? kUnwindGlance : kUnwindGrace);
    const auto wait_start = unwinding ? Clock::now() : start;
    // Spin briefly (collectives on small tensors finish in microseconds), then back off so that
    // oversubscribed ranks leave the cores to their peers.
    for (int64_t iter = 0; !poll(); ++iter) {
      if (unwinding && Clock::now() - wait_start > limit) {
        MT_LOG_WARN("{} on {} left in flight: dropped while an error unwinds (the error ends the job)", op,
                    comm->description);
        g_abandoning.store(true);
        abandon();
        return;
      }
      const auto elapsed = Clock::now() - start;
      if (elapsed > timeout) {
        const double secs = std::chrono::duration<double>(elapsed).count();
        if (on_timeout) on_timeout();
        abort_job(fmt::format(
            "{} timed out after {:.1f} s (timeout {:.1f} s, set by MT_COLLECTIVE_TIMEOUT_S or "
            "set_collective_timeout) on {}, group rank {} of {}, world rank {}: a peer is dead, "
            "hung, or not calling the same collective",
            op, secs, static_cast<double>(timeout.count()) / 1000.0, comm->description, comm->rank,
            comm->size, world().rank()));
      }
      if (iter < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(iter < 1024 ? 50 : 1000));
      }
    }
    complete();
  }
  ~State() {
    if (done) return;
    try {
      wait();
    } catch (const std::exception& e) {
      MT_LOG_ERROR("{} failed while its Work handle was dropped: {}", op, e.what());
    }
  }
};

void Work::wait() {
  if (s_) s_->wait();
}

bool Work::is_completed() {
  if (!s_) return true;
  std::lock_guard<std::mutex> lock(s_->mutex);
  if (s_->done) return true;
  if (!s_->poll()) return false;
  s_->complete();
  return true;
}

Tensor Work::result() {
  wait();
  return s_ ? s_->result : Tensor();
}

// ---------------------------------------------------------------------------------------------
// Helpers

namespace {

using detail::NativeOp;

std::shared_ptr<Work::State> new_state(const char* op, const std::shared_ptr<Communicator::Impl>& c) {
  auto s = std::make_shared<Work::State>();
  s->op = op;
  s->comm = c;
  return s;
}

void check_tensor(const char* op, const char* what, const Tensor& t) {
  MT_CHECK(t.defined(), "{}: {} is an undefined tensor", op, what);
  MT_CHECK(t.device().is_cpu() || t.device().is_cuda(), "{}: {} must be a host or CUDA tensor, got {}",
           op, what, t.desc());
  MT_CHECK(t.is_contiguous(), "{}: {} must be contiguous, got {} with strides {}", op, what,
           t.desc(), t.strides());
}

// Where a collective runs: every tensor on the host (MPI), or every tensor on one CUDA device
// (NCCL). A mix is an error naming both tensors.
struct Route {
  bool cuda = false;
  int device = -1;
};

struct Named {
  const char* what;
  const Tensor* t;
};

Route route(const char* op, std::initializer_list<Named> tensors) {
  const Named* first = nullptr;
  for (const Named& n : tensors) {
    check_tensor(op, n.what, *n.t);
    if (!first) {
      first = &n;
      continue;
    }
    MT_CHECK(n.t->device() == first->t->device(),
             "{}: {} is {} but {} is {}; a collective's tensors must be on one device (host tensors "
             "go over MPI, CUDA tensors over NCCL): move one of them with .to()",
             op, first->what, first->t->desc(), n.what, n.t->desc());
  }
  Route r;
  if (first && first->t->device().is_cuda()) {
    r.cuda = true;
    r.device = first->t->device().index;
  }
  return r;
}

// CUDA collectives staged through host memory (docs/cuda.md, "Ranks sharing a GPU"). NCCL needs
// one GPU per rank, so when a node runs more ranks than it has GPUs (or the build has no NCCL, or
// MT_HOST_STAGED_COLLECTIVES=1) a CUDA tensor is copied to the host, the MPI collective runs
// there and the result is copied back. Decided once per process from the launcher's local size,
// with no collective, so that point-to-point calls decide it too and every rank of a node agrees.
bool host_staged() {
  static const bool staged = [] {
    const char* env = std::getenv("MT_HOST_STAGED_COLLECTIVES");
    std::string why;
    if (env && std::string(env) == "1")
      why = "MT_HOST_STAGED_COLLECTIVES=1";
    else if (!detail::nccl_built())
      why = "this build has no NCCL";
    else if (local_size() > cuda::device_count())
      why = fmt::format("{} ranks on this node share {} GPU(s); NCCL needs one GPU per rank", local_size(),
                        cuda::device_count());
    if (!why.empty() && world().rank() == 0)
      MT_LOG_WARN("notice: CUDA collectives are staged through host memory over MPI ({}): same results, slower", why);
    return !why.empty();
  }();
  return staged;
}

// A request that completes with another Work: the host collective of a staged one.
class WorkRequest final : public detail::RequestHandle {
 public:
  explicit WorkRequest(Work w) : w_(std::move(w)) {}
  bool test() override { return w_.is_completed(); }

 private:
  Work w_;
};

Tensor to_host(const Tensor& t) {
  NoGradGuard no_grad;
  return t.detach().to(Device::cpu());
}

Tensor host_like(const Tensor& t) { return empty(t.shape(), t.dtype()); }

// The Work of a staged CUDA collective: completes with `host` (the collective on host copies),
// then copies each host buffer into its CUDA tensor, and a host result (all_gather_uneven,
// all_to_allv) to the device.
Work staged_work(const char* op, const std::shared_ptr<Communicator::Impl>& impl, Work host,
                 std::vector<std::pair<Tensor, Tensor>> back, int device, bool result) {
  auto s = new_state(op, impl);
  s->op = fmt::format("{} (host-staged)", op);
  Work::State* self = s.get();  // finish runs inside complete(), while the state is alive
  s->requests.push_back(std::make_unique<WorkRequest>(host));
  s->finish = [self, host, back = std::move(back), device, result]() mutable {
    NoGradGuard no_grad;
    cuda::DeviceGuard g(device);
    for (auto& [h, d] : back) d.copy_(h);
    if (result) self->result = host.result().to(Device::cuda(device));
  };
  return Work(std::move(s));
}

void check_dim0(const char* op, const Tensor& t) {
  MT_CHECK(t.dim() >= 1, "{}: expected a tensor with at least one dim (split along dim 0), got {}",
           op, t.desc());
}

void check_same_dtype(const char* op, const Tensor& in, const Tensor& out) {
  MT_CHECK(in.dtype() == out.dtype(), "{}: output dtype {} differs from input dtype {}", op,
           out.dtype(), in.dtype());
}

void check_no_overlap(const char* op, const Tensor& in, const Tensor& out) {
  const auto* a = static_cast<const char*>(in.data_ptr());
  const auto* b = static_cast<const char*>(out.data_ptr());
  if (!a || !b) return;
  const int64_t na = in.numel() * dtype_size(in.dtype());
  const int64_t nb = out.numel() * dtype_size(out.dtype());
  MT_CHECK(a + na <= b || b + nb <= a, "{}: input and output must not overlap in memory", op);
}

Shape trailing(const Tensor& t) {
  Shape s = t.shape();
  s.erase(0);
  return s;
}

Shape with_dim0(const Shape& trailing_dims, int64_t n) {
  Shape s = trailing_dims;
  s.insert(0, n);
  return s;
}

int64_t row_numel(const Tensor& t) { return trailing(t).numel(); }

void check_reduce_dtype(const char* op, DType dt, CommReduceOp rop) {
  MT_CHECK(!(rop == CommReduceOp::kAvg && !is_floating(dt)),
           "{}: avg needs a floating dtype, got {} (use sum and divide)", op, dt);
  MT_CHECK(!(rop == CommReduceOp::kSum && dt == DType::kBool),
           "{}: sum of bool is not supported (max is logical or, min is logical and)", op);
}

NativeOp native(CommReduceOp op) {
  switch (op) {
    case CommReduceOp::kSum:
    case CommReduceOp::kAvg: return NativeOp::kSum;
    case CommReduceOp::kMax: return NativeOp::kMax;
    case CommReduceOp::kMin: return NativeOp::kMin;
  }
  return NativeOp::kSum;
}

// avg after a native sum: divide in the tensor's own precision (identical on every rank).
void divide_in_place(Tensor& t, int size) {
  if (size == 1) return;
  const int64_t n = t.numel();
  if (t.dtype() == DType::kF64) {
    auto* p = t.data<double>();
    for (int64_t i = 0; i < n; ++i) p[i] /= size;
  } else if (t.dtype() == DType::kF32) {
    auto* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<float>(size);
  } else {
    MT_ASSERT(false, "divide_in_place on {}", t.dtype());
  }
}

// avg after an NCCL sum: t / size on t's device, in t's dtype (f32 math for bf16/f16), on the
// compute stream once the collective completed.
std::function<void()> cuda_divide(Tensor t, int size) {
  return [t, size]() mutable {
    if (size == 1 || t.numel() == 0) return;
    NoGradGuard no_grad;
    cuda::DeviceGuard g(t.device().index);
    t.copy_(div(t, static_cast<double>(size)));
  };
}

// rows: [size, n] 16-bit floats, row r from group rank r. out[i] = op over rows in rank order,
// accumulated in f32 and rounded once.
template <class T>
void reduce_rows16(const T* rows, int size, int64_t n, CommReduceOp op, T* out) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = static_cast<float>(rows[i]);
    for (int r = 1; r < size; ++r) {
      const float v = static_cast<float>(rows[static_cast<int64_t>(r) * n + i]);
      switch (op) {
        case CommReduceOp::kSum:
        case CommReduceOp::kAvg: acc += v; break;
        case CommReduceOp::kMax: acc = (v > acc || v != v) ? v : acc; break;
        case CommReduceOp::kMin: acc = (v < acc || v != v) ? v : acc; break;
      }
    }
    if (op == CommReduceOp::kAvg) acc /= static_cast<float>(size);
    out[i] = T(acc);
  }
}

void reduce_rows(const Tensor& rows, int size, int64_t n, CommReduceOp op, Tensor& out) {
  if (out.dtype() == DType::kBF16) {
    reduce_rows16(rows.data<BFloat16>(), size, n, op, out.data<BFloat16>());
  } else {
    MT_ASSERT(out.dtype() == DType::kF16, "reduce_rows on {}", out.dtype());
    reduce_rows16(rows.data<Float16>(), size, n, op, out.data<Float16>());
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Deadline of blocking set-up steps

namespace {

// Communicator creation (MPI_Comm_create_group) and NCCL initialization (ncclCommInitRank) block
// until every member joins and cannot be polled like a request. A watchdog thread gives them the
// collective deadline: if the step has not returned when collective_timeout() passes, it ends the
// job with an error naming the step, the group and this rank (as Work::wait does), so a peer that
// died or hung before joining never leaves this rank blocked forever.
class SetupDeadline {
 public:
  SetupDeadline(std::string what, std::string group)
      : what_(std::move(what)), group_(std::move(group)), timeout_(collective_timeout()),
        thread_([this] { watch(); }) {}
  ~SetupDeadline() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SetupDeadline(const SetupDeadline&) = delete;
  SetupDeadline& operator=(const SetupDeadline&) = delete;

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_for(lock, timeout_, [this] { return done_; })) return;
    abort_job(fmt::format(
        "{} timed out after {:.1f} s (timeout set by MT_COLLECTIVE_TIMEOUT_S or set_collective_timeout) "
        "on {}, world rank {}: a peer is dead, hung, or not creating the same group",
        what_, static_cast<double>(timeout_.count()) / 1000.0, group_, world().rank()));
  }

  std::string what_, group_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Communicator

Communicator Communicator::create(const std::vector<int>& world_ranks, int tag, std::string description,
                                  std::string label) {
  const int me = world().rank();
  MT_CHECK(std::find(world_ranks.begin(), world_ranks.end(), me) != world_ranks.end(),
           "Communicator::create: world rank {} is not in the group {}", me, description);
  auto impl = std::make_shared<Impl>();
  {
    SetupDeadline deadline("communicator creation", description);
    impl->handle = detail::backend_create_group(world_ranks, tag);
  }
  impl->rank = detail::backend_rank(*impl->handle);
  impl->size = detail::backend_size(*impl->handle);
  impl->world_ranks = world_ranks;
  impl->description = std::move(description);
  impl->label = std::move(label);
  MT_ASSERT(impl->size == static_cast<int>(world_ranks.size()), "group size {} != {}", impl->size,
            world_ranks.size());
  Communicator c;
  c.impl_ = std::move(impl);
  return c;
}

Communicator Communicator::simulated(int size, int rank, std::string description, std::string label) {
  MT_CHECK(size >= 1 && rank >= 0 && rank < size, "Communicator::simulated: rank {} of a group of {} ({})", rank, size,
           description);
  auto impl = std::make_shared<Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->description = std::move(description);
  impl->label = std::move(label);
  impl->simulated = true;
  Communicator c;
  c.impl_ = std::move(impl);
  return c;
}

bool Communicator::is_simulated() const { return impl("is_simulated").simulated; }
const std::string& Communicator::label() const { return impl("label").label; }

const Communicator::Impl& Communicator::impl(const char* op) const {
  MT_CHECK(impl_ != nullptr, "{}: the communicator is undefined (default-constructed)", op);
  return *impl_;
}

int Communicator::rank() const { return impl("rank").rank; }
int Communicator::size() const { return impl("size").size; }
const std::vector<int>& Communicator::world_ranks() const { return impl("world_ranks").world_ranks; }
const std::string& Communicator::description() const { return impl("description").description; }

void Communicator::all_reduce(Tensor& t, CommReduceOp op) { all_reduce_async(t, op).wait(); }
void Communicator::all_gather(const Tensor& in, Tensor& out) { all_gather_async(in, out).wait(); }
Tensor Communicator::all_gather_uneven(const Tensor& in) { return all_gather_uneven_async(in).result(); }
void Communicator::reduce_scatter(const Tensor& in, Tensor& out, CommReduceOp op) {
  reduce_scatter_async(in, out, op).wait();
}
void Communicator::all_to_all(const Tensor& in, Tensor& out) { all_to_all_async(in, out).wait(); }
Tensor Communicator::all_to_allv(const Tensor& in, const std::vector<int64_t>& send_counts,
                                 std::vector<int64_t> recv_counts) {
  return all_to_allv_async(in, send_counts, std::move(recv_counts)).result();
}
void Communicator::broadcast(Tensor& t, int root) { broadcast_async(t, root).wait(); }
void Communicator::send(const Tensor& t, int peer, int tag) { send_async(t, peer, tag).wait(); }
void Communicator::recv(Tensor& t, int peer, int tag) { recv_async(t, peer, tag).wait(); }
void Communicator::barrier() { barrier_async().wait(); }

namespace {

// The group's NCCL communicator, created on the first CUDA collective: rank 0 makes the unique
// id and broadcasts it over the group's MPI communicator (with the usual deadline), then every
// rank joins with ncclCommInitRank on the tensors' device. Later calls reuse it and must use the
// same device (one GPU per rank).
detail::NcclPtr nccl_comm(const std::shared_ptr<Communicator::Impl>& impl, const char* op, int device) {
  const Communicator::Impl& c = *impl;
  std::lock_guard<std::mutex> lock(c.nccl_mutex);
  if (c.nccl) {
    const int have = detail::nccl_device(*c.nccl);
    MT_CHECK(have == device,
             "{}: the tensors are on cuda:{} but the NCCL communicator of {} was created on cuda:{} "
             "(one GPU per rank: keep a group's CUDA tensors on one device)",
             op, device, c.description, have);
    return c.nccl;
  }
  constexpr int64_t kIdBytes = static_cast<int64_t>(sizeof(detail::NcclId));
  Tensor id = zeros(Shape{kIdBytes}, DType::kU8);
  if (c.rank == 0) {
    const detail::NcclId mine = detail::nccl_unique_id();
    std::memcpy(id.data_ptr(), mine.data(), mine.size());
  }
  {
    auto s = new_state("NCCL bootstrap (unique id broadcast over MPI)", impl);
    s->keep = {id};
    s->requests.push_back(detail::backend_ibcast(*c.handle, id.data_ptr(), kIdBytes, DType::kU8, 0));
    Work(std::move(s)).wait();
  }
  detail::NcclId uid;
  std::memcpy(uid.data(), id.data_ptr(), uid.size());
  {
    SetupDeadline deadline("NCCL communicator initialization", c.description);
    c.nccl = detail::nccl_init(uid, c.rank, c.size, device, c.description);
  }
  return c.nccl;
}

// A Work for an NCCL operation: named "<op> (NCCL)" in the timeout report, and a timeout aborts
// the NCCL communicator (so that its kernels stop) before the job is ended.
std::shared_ptr<Work::State> nccl_state(const char* op, const std::shared_ptr<Communicator::Impl>& impl,
                                        const detail::NcclPtr& nc) {
  auto s = new_state(op, impl);
  s->op = fmt::format("{} (NCCL)", op);
  s->on_timeout = [nc] { detail::nccl_abort(*nc); };
  return s;
}

// recv of a CUDA tensor from this very rank: takes the oldest message with the tag (a device copy
// made by send) once it is there.
class CudaSelfRecv final : public detail::RequestHandle {
 public:
  CudaSelfRecv(std::shared_ptr<const Communicator::Impl> c, Tensor t, int tag)
      : c_(std::move(c)), t_(std::move(t)), tag_(tag) {}
  bool test() override {
    if (done_) return true;
    Tensor msg;
    {
      std::lock_guard<std::mutex> lock(c_->self_mutex);
      auto& q = c_->self_messages;
      for (auto it = q.begin(); it != q.end(); ++it) {
        if (it->first != tag_) continue;
        msg = it->second;
        q.erase(it);
        break;
      }
    }
    if (!msg.defined()) return false;
    MT_CHECK(msg.dtype() == t_.dtype() && msg.numel() == t_.numel(),
             "recv: message with tag {} is {} but the receiving tensor is {}", tag_, msg.desc(), t_.desc());
    NoGradGuard no_grad;
    cuda::DeviceGuard g(t_.device().index);
    t_.copy_(msg.view(t_.shape()));
    done_ = true;
    return true;
  }

 private:
  std::shared_ptr<const Communicator::Impl> c_;
  Tensor t_;
  int tag_;
  bool done_ = false;
};

}  // namespace

namespace {

int64_t nbytes(const Tensor& t) { return t.numel() * static_cast<int64_t>(dtype_size(t.dtype())); }

void count(const char* kind, const Communicator::Impl& c, int64_t bytes) {
  count_collective(kind, c.label, c.size, bytes);
}

// A collective on a simulated communicator: meta tensors only (shapes were checked by the caller
// where it checks them), counted; nothing moves.
Work simulated_op(const char* kind, const Communicator::Impl& c, std::initializer_list<const Tensor*> tensors,
                  int64_t bytes) {
  for (const Tensor* t : tensors)
    MT_CHECK(t->defined() && t->is_meta(), "{}: {} is a simulated communicator (no peers): it takes meta tensors only, got {}",
             kind, c.description, t->defined() ? t->desc() : std::string("an undefined tensor"));
  count(kind, c, bytes);
  return Work();
}

}  // namespace

Work Communicator::all_reduce_async(Tensor& t, CommReduceOp op) {
  const char* name = "all_reduce";
  const Impl& c = impl(name);
  if (c.simulated) {
    if (!t.is_meta() && (op == CommReduceOp::kMax || op == CommReduceOp::kMin)) {
      count("all_reduce", c, nbytes(t));
      return Work();
    }
    return simulated_op("all_reduce", c, {&t}, nbytes(t));
  }
  const Route rt = route(name, {{"tensor", &t}});
  check_reduce_dtype(name, t.dtype(), op);
  const int64_t n = t.numel();
  if (rt.cuda && host_staged()) {
    Tensor h = to_host(t);
    return staged_work(name, impl_, all_reduce_async(h, op), {{h, t}}, rt.device, false);
  }
  count("all_reduce", c, nbytes(t));
  if (rt.cuda) {
    // NCCL reduces every dtype natively (bf16/f16 included); ring and tree algorithms reduce each
    // element once and copy the result to every rank, so every rank gets the same bits.
    auto nc = nccl_comm(impl_, name, rt.device);
    auto s = nccl_state(name, impl_, nc);
    s->keep = {t};
    s->requests.push_back(detail::nccl_all_reduce(nc, name, t.data_ptr(), n, t.dtype(), native(op)));
    if (op == CommReduceOp::kAvg) s->finish = cuda_divide(t, c.size);
    return Work(std::move(s));
  }
  auto s = new_state(name, impl_);
  s->keep = {t};
  if (detail::backend_reduces(t.dtype())) {
    s->requests.push_back(detail::backend_iallreduce(*c.handle, t.data_ptr(), n, t.dtype(), native(op)));
    if (op == CommReduceOp::kAvg) s->finish = [t, size = c.size]() mutable { divide_in_place(t, size); };
  } else {
    Tensor rows = empty(Shape{c.size, n}, t.dtype());
    s->keep.push_back(rows);
    s->requests.push_back(detail::backend_iallgather(*c.handle, t.data_ptr(), n, rows.data_ptr(), t.dtype()));
    s->finish = [t, rows, n, op, size = c.size]() mutable { reduce_rows(rows, size, n, op, t); };
  }
  return Work(std::move(s));
}

Work Communicator::all_gather_async(const Tensor& in, Tensor& out) {
  const char* name = "all_gather";
  const Impl& c = impl(name);
  if (c.simulated) return simulated_op("all_gather", c, {&in, &out}, nbytes(out));
  const Route rt = route(name, {{"input", &in}, {"output", &out}});
  check_dim0(name, in);
  check_same_dtype(name, in, out);
  const Shape want = with_dim0(trailing(in), in.size(0) * c.size);
  MT_CHECK(out.shape() == want,
           "{}: output shape {} must be {} (input {} gathered over {} ranks of {})", name,
           out.shape(), want, in.shape(), c.size, c.description);
  check_no_overlap(name, in, out);
  if (rt.cuda && host_staged()) {
    Tensor hin = to_host(in), hout = host_like(out);
    return staged_work(name, impl_, all_gather_async(hin, hout), {{hout, out}}, rt.device, false);
  }
  count("all_gather", c, nbytes(out));
  if (rt.cuda) {
    auto nc = nccl_comm(impl_, name, rt.device);
    auto s = nccl_state(name, impl_, nc);
    s->keep = {in, out};
    s->requests.push_back(detail::nccl_all_gather(nc, name, in.data_ptr(), in.numel(), out.data_ptr(), in.dtype()));
    return Work(std::move(s));
  }
  if (c.size == 1) {  // a group of one on the host: a copy, no MPI request (FSDP units over a one-rank dim)
    out.copy_(in);
    return Work();
  }
  auto s = new_state(name, impl_);
  s->keep = {in, out};
  s->requests.push_back(
      detail::backend_iallgather(*c.handle, in.data_ptr(), in.numel(), out.data_ptr(), in.dtype()));
  return Work(std::move(s));
}

Work Communicator::all_gather_uneven_async(const Tensor& in) {
  const char* name = "all_gather_uneven";
  const Impl& c = impl(name);
  MT_CHECK(!c.simulated, "{}: {} is a simulated communicator: the peers' sizes are unknown", name, c.description);
  const Route rt = route(name, {{"input", &in}});
  check_dim0(name, in);
  if (rt.cuda && host_staged())
    return staged_work(name, impl_, all_gather_uneven_async(to_host(in)), {}, rt.device, true);
  // Exchange dtype, rank and sizes (over MPI, on the host, for CUDA tensors too) so that a
  // mismatch is an error on every rank, not garbage.
  constexpr int kMeta = kMaxDims + 2;
  Tensor mine = zeros(Shape{kMeta}, DType::kI64);
  auto* m = mine.data<int64_t>();
  m[0] = static_cast<int64_t>(in.dtype());
  m[1] = in.dim();
  for (int d = 0; d < in.dim(); ++d) m[2 + d] = in.size(d);
  Tensor all = empty(Shape{c.size, kMeta}, DType::kI64);
  {
    auto s = new_state("all_gather_uneven (size exchange)", impl_);
    s->keep = {mine, all};
    s->requests.push_back(detail::backend_iallgather(*c.handle, mine.data_ptr(), kMeta, all.data_ptr(), DType::kI64));
    Work(std::move(s)).wait();
  }
  const auto* a = all.data<int64_t>();
  std::vector<int64_t> counts(static_cast<size_t>(c.size));
  int64_t rows = 0;
  for (int r = 0; r < c.size; ++r) {
    const int64_t* mr = a + static_cast<int64_t>(r) * kMeta;
    Shape their;
    for (int d = 0; d < mr[1]; ++d) their.push_back(mr[2 + d]);
    Shape their_trailing = their;
    if (!their.empty()) their_trailing.erase(0);
    MT_CHECK(mr[0] == m[0] && mr[1] == m[1] && their_trailing == trailing(in),
             "{}: group rank {} has {}{} but group rank {} has {}{}; only dim 0 may differ ({})",
             name, r, dtype_name(static_cast<DType>(mr[0])), their, c.rank,
             dtype_name(in.dtype()), in.shape(), c.description);
    counts[static_cast<size_t>(r)] = their[0] * row_numel(in);
    rows += their[0];
  }
  Tensor out = empty(with_dim0(trailing(in), rows), TensorOptions(in.dtype()).with_device(in.device()));
  count("all_gather", c, nbytes(out));
  if (rt.cuda) {
    // One NCCL broadcast per rank into its slice, grouped (ncclGroupStart/End).
    auto nc = nccl_comm(impl_, name, rt.device);
    auto s = nccl_state(name, impl_, nc);
    s->keep = {in, out};
    s->result = out;
    s->requests.push_back(detail::nccl_all_gatherv(nc, name, in.data_ptr(), in.numel(), out.data_ptr(),
                                                   counts, in.dtype()));
    return Work(std::move(s));
  }
  auto s = new_state(name, impl_);
  s->keep = {in, out};
  s->result = out;
  s->requests.push_back(detail::backend_iallgatherv(*c.handle, in.data_ptr(), in.numel(), out.data_ptr(),
                                                    counts, in.dtype()));
  return Work(std::move(s));
}

Work Communicator::reduce_scatter_async(const Tensor& in, Tensor& out, CommReduceOp op) {
  const char* name = "reduce_scatter";
  const Impl& c = impl(name);
  if (c.simulated) return simulated_op("reduce_scatter", c, {&in, &out}, nbytes(in));
  const Route rt = route(name, {{"input", &in}, {"output", &out}});
  check_dim0(name, in);
  check_same_dtype(name, in, out);
  check_reduce_dtype(name, in.dtype(), op);
  MT_CHECK(in.size(0) % c.size == 0,
           "{}: input dim 0 ({}, shape {}) must divide evenly over {} ranks of {}", name,
           in.size(0), in.shape(), c.size, c.description);
  const Shape want = with_dim0(trailing(in), in.size(0) / c.size);
  MT_CHECK(out.shape() == want, "{}: output shape {} must be {} (input {} over {} ranks of {})",
           name, out.shape(), want, in.shape(), c.size, c.description);
  check_no_overlap(name, in, out);
  const int64_t n = out.numel();
  if (rt.cuda && host_staged()) {
    Tensor hin = to_host(in), hout = host_like(out);
    return staged_work(name, impl_, reduce_scatter_async(hin, hout, op), {{hout, out}}, rt.device, false);
  }
  count("reduce_scatter", c, nbytes(in));  // after the staged return: its host collective counts itself
  if (rt.cuda) {
    auto nc = nccl_comm(impl_, name, rt.device);
    auto s = nccl_state(name, impl_, nc);
    s->keep = {in, out};
    s->requests.push_back(
        detail::nccl_reduce_scatter(nc, name, in.data_ptr(), out.data_ptr(), n, in.dtype(), native(op)));
    if (op == CommReduceOp::kAvg) s->finish = cuda_divide(out, c.size);
    return Work(std::move(s));
  }
  if (c.size == 1) {  // a group of one on the host: every reduction of one term is that term
    out.copy_(in);
    return Work();
  }
  auto s = new_state(name, impl_);
  s->keep = {in, out};
  if (detail::backend_reduces(in.dtype())) {
    s->requests.push_back(detail::backend_ireduce_scatter(*c.handle, in.data_ptr(), out.data_ptr(), n,
                                                          in.dtype(), native(op)));
    if (op == CommReduceOp::kAvg) s->finish = [out, size = c.size]() mutable { divide_in_place(out, size); };
  } else {
    // Every rank receives its chunk from every rank ([size, n], in rank order), then reduces.
    Tensor rows = empty(Shape{c.size, n}, in.dtype());
    s->keep.push_back(rows);
    s->requests.push_back(detail::backend_ialltoall(*c.handle, in.data_ptr(), rows.data_ptr(), n, in.dtype()));
    s->finish = [out, rows, n, op, size = c.size]() mutable { reduce_rows(rows, size, n, op, out); };
  }
  return Work(std::move(s));
}

Work Communicator::all_to_all_async(const Tensor& in, Tensor& out) {
  const char* name = "all_to_all";
  const Impl& c = impl(name);
  if (c.simulated) return simulated_op("all_to_all", c, {&in, &out}, nbytes(in));
  const Route rt = route(name, {{"input", &in}, {"output", &out}});
  check_dim0(name, in);
  check_same_dtype(name, in, out);
  MT_CHECK(in.size(0) % c.size == 0,
           "{}: input dim 0 ({}, shape {}) must divide evenly over {} ranks of {}", name,
           in.size(0), in.shape(), c.size, c.description);
  MT_CHECK(out.shape() == in.shape(), "{}: output shape {} must equal input shape {}", name,
           out.shape(), in.shape());
  check_no_overlap(name, in, out);
  const int64_t chunk = in.numel() / c.size;
  if (rt.cuda && host_staged()) {
    Tensor hin = to_host(in), hout = host_like(out);
    return staged_work(name, impl_, all_to_all_async(hin, hout), {{hout, out}}, rt.device, false);
  }
  count("all_to_all", c, nbytes(in));
  if (rt.cuda) {
    // Grouped send/recv: chunk j to and from rank j.
    auto nc = nccl_comm(impl_, name, rt.device);
    auto s = nccl_state(name, impl_, nc);
    s->keep = {in, out};
    const std::vector<int64_t> counts(static_cast<size_t>(c.size), chunk);
    s->requests.push_back(detail::nccl_all_to_allv(nc, name, in.data_ptr(), counts, out.data_ptr(), counts, in.dtype()));
    return Work(std::move(s));
  }
  auto s = new_state(name, impl_);
  s->keep = {in, out};
  s->requests.push_back(detail::backend_ialltoall(*c.handle, in.data_ptr(), out.data_ptr(), chunk, in.dtype()));
  return Work(std::move(s));
}

Work Communicator::all_to_allv_async(const Tensor& in, const std::vector<int64_t>& send_counts,
                                     std::vector<int64_t> recv_counts) {
  const char* name = "all_to_allv";
  const Impl& c = impl(name);
  MT_CHECK(!c.simulated || !recv_counts.empty(),
           "{}: {} is a simulated communicator: the peers' counts are unknown (give the receive counts)", name,
           c.description);
  if (c.simulated) {  // estimates: shapes and counts only, on meta tensors
    int64_t rows = 0;
    for (int64_t n : recv_counts) rows += n;
    Tensor out = empty(with_dim0(trailing(in), rows), TensorOptions(in.dtype()).with_device(Device::meta()));
    (void)simulated_op("all_to_all", c, {&in}, nbytes(in));
    auto s = new_state(name, impl_);
    s->result = out;
    return Work(std::move(s));
  }
  const Route rt = route(name, {{"input", &in}});
  if (rt.cuda && host_staged())
    return staged_work(name, impl_, all_to_allv_async(to_host(in), send_counts, std::move(recv_counts)), {}, rt.device,
                       true);
  check_dim0(name, in);
  MT_CHECK(static_cast<int>(send_counts.size()) == c.size,
           "{}: {} send counts for a group of {} ranks ({})", name, send_counts.size(), c.size,
           c.description);
  int64_t total = 0;
  for (int64_t n : send_counts) {
    MT_CHECK(n >= 0, "{}: negative send count {}", name, n);
    total += n;
  }
  MT_CHECK(total == in.size(0), "{}: send counts sum to {} but input dim 0 is {} (shape {})", name,
           total, in.size(0), in.shape());
  if (recv_counts.empty()) {
    // Over MPI, on the host, for CUDA tensors too.
    Tensor sc = from_vector<int64_t>(send_counts);
    Tensor rc = empty(Shape{c.size}, DType::kI64);
    auto s = new_state("all_to_allv (count exchange)", impl_);
    s->keep = {sc, rc};
    s->requests.push_back(detail::backend_ialltoall(*c.handle, sc.data_ptr(), rc.data_ptr(), 1, DType::kI64));
    Work(std::move(s)).wait();
    recv_counts = rc.to_vector<int64_t>();
  }
  MT_CHECK(static_cast<int>(recv_counts.size()) == c.size,
           "{}: {} receive counts for a group of {} ranks ({})", name, recv_counts.size(), c.size,
           c.description);
  int64_t rows = 0;
  for (int64_t n : recv_counts) {
    MT_CHECK(n >= 0, "{}: negative receive count {}", name, n);
    rows += n;
  }
  const int64_t row = row_numel(in);
  std::vector<int64_t> se(send_counts), re(recv_counts);
  for (auto& v : se) v *= row;
  for (auto& v : re) v *= row;
  count("all_to_all", c, nbytes(in));
  Tensor out = empty(with_dim0(trailing(in), rows), TensorOptions(in.dtype()).with_device(in.device()));
  if (rt.cuda) {
    auto nc = nccl_comm(impl_, name, rt.device);
    auto s = nccl_state(name, impl_, nc);
    s->keep = {in, out};
    s->result = out;
    s->requests.push_back(detail::nccl_all_to_allv(nc, name, in.data_ptr(), se, out.data_ptr(), re, in.dtype()));
    return Work(std::move(s));
  }
  auto s = new_state(name, impl_);
  s->keep = {in, out};
  s->result = out;
  s->requests.push_back(detail::backend_ialltoallv(*c.handle, in.data_ptr(), se, out.data_ptr(), re, in.dtype()));
  return Work(std::move(s));
}

Work Communicator::broadcast_async(Tensor& t, int root) {
  const char* name = "broadcast";
  const Impl& c = impl(name);
  if (c.simulated) return simulated_op("broadcast", c, {&t}, nbytes(t));
  const Route rt = route(name, {{"tensor", &t}});
  MT_CHECK(root >= 0 && root < c.size, "{}: root {} is not a rank of the {}-rank group {}", name,
           root, c.size, c.description);
  if (rt.cuda && host_staged()) {
    Tensor h = to_host(t);
    return staged_work(name, impl_, broadcast_async(h, root), {{h, t}}, rt.device, false);
  }
  count("broadcast", c, nbytes(t));
  if (rt.cuda) {
    auto nc = nccl_comm(impl_, name, rt.device);
    auto s = nccl_state(name, impl_, nc);
    s->keep = {t};
    s->requests.push_back(detail::nccl_broadcast(nc, name, t.data_ptr(), t.numel(), t.dtype(), root));
    return Work(std::move(s));
  }
  auto s = new_state(name, impl_);
  s->keep = {t};
  s->requests.push_back(detail::backend_ibcast(*c.handle, t.data_ptr(), t.numel(), t.dtype(), root));
  return Work(std::move(s));
}

Work Communicator::send_async(const Tensor& t, int peer, int tag) {
  const char* name = "send";
  const Impl& c = impl(name);
  if (c.simulated) return simulated_op("send", c, {&t}, nbytes(t));
  const Route rt = route(name, {{"tensor", &t}});
  MT_CHECK(peer >= 0 && peer < c.size, "{}: peer {} is not a rank of the {}-rank group {}", name,
           peer, c.size, c.description);
  MT_CHECK(tag >= 0, "{}: tag must be non-negative, got {}", name, tag);
  if (rt.cuda && host_staged())
    return staged_work(name, impl_, send_async(to_host(t), peer, tag), {}, rt.device, false);
  count("send", c, nbytes(t));
  if (rt.cuda && peer == c.rank) {
    // NCCL cannot send to itself outside a group: queue a device copy for the matching recv.
    Tensor copy;
    {
      NoGradGuard no_grad;
      cuda::DeviceGuard g(rt.device);
      copy = t.detach().clone();
    }
    std::lock_guard<std::mutex> lock(c.self_mutex);
    c.self_messages.emplace_back(tag, std::move(copy));
    return Work();
  }
  if (rt.cuda) {
    // NCCL has no tags: messages between two ranks match in the order they were posted.
    auto nc = nccl_comm(impl_, name, rt.device);
    auto s = nccl_state(name, impl_, nc);
    s->keep = {t};
    s->requests.push_back(detail::nccl_send(nc, name, t.data_ptr(), t.numel(), t.dtype(), peer));
    return Work(std::move(s));
  }
  auto s = new_state(name, impl_);
  s->keep = {t};
  s->requests.push_back(detail::backend_isend(*c.handle, t.data_ptr(), t.numel(), t.dtype(), peer, tag));
  return Work(std::move(s));
}

Work Communicator::recv_async(Tensor& t, int peer, int tag) {
  const char* name = "recv";
  const Impl& c = impl(name);
  if (c.simulated) return simulated_op("recv", c, {&t}, nbytes(t));
  const Route rt = route(name, {{"tensor", &t}});
  MT_CHECK(peer >= 0 && peer < c.size, "{}: peer {} is not a rank of the {}-rank group {}", name,
           peer, c.size, c.description);
  MT_CHECK(tag >= 0, "{}: tag must be non-negative, got {}", name, tag);
  if (rt.cuda && host_staged()) {
    Tensor h = host_like(t);
    return staged_work(name, impl_, recv_async(h, peer, tag), {{h, t}}, rt.device, false);
  }
  count("recv", c, nbytes(t));
  if (rt.cuda && peer == c.rank) {
    auto s = new_state(name, impl_);
    s->keep = {t};
    s->requests.push_back(std::make_unique<CudaSelfRecv>(impl_, t, tag));
    return Work(std::move(s));
  }
  if (rt.cuda) {
    auto nc = nccl_comm(impl_, name, rt.device);
    auto s = nccl_state(name, impl_, nc);
    s->keep = {t};
    s->requests.push_back(detail::nccl_recv(nc, name, t.data_ptr(), t.numel(), t.dtype(), peer));
    return Work(std::move(s));
  }
  auto s = new_state(name, impl_);
  s->keep = {t};
  s->requests.push_back(detail::backend_irecv(*c.handle, t.data_ptr(), t.numel(), t.dtype(), peer, tag));
  return Work(std::move(s));
}

Work Communicator::barrier_async() {
  // Over MPI: a barrier of host threads. CUDA work already queued is not waited for.
  const char* name = "barrier";
  const Impl& c = impl(name);
  if (c.simulated) return Work();
  auto s = new_state(name, impl_);
  s->requests.push_back(detail::backend_ibarrier(*c.handle));
  return Work(std::move(s));
}

}  // namespace mt
