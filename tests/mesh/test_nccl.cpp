// NCCL collectives: every Communicator collective on CUDA tensors against the same collective on
// host tensors (MPI), async handles, and the errors for mixed devices. Run as a world of one and
// under `mpirun -np 2 / 4`. Without a GPU every rank exits 77 (meson: SKIP) together: the decision
// is agreed over MPI first. With fewer GPUs than ranks (or MT_HOST_STAGED_COLLECTIVES=1) the same
// tests check the host-staged path.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda/cuda_testing.h"
#include "config.h"
#include "mesh/communicator.h"
#include "mesh/device_mesh.h"
#include "mesh/world.h"
#include "runtime/cuda/device.h"
#include "runtime/error.h"
#include "tensor/ops_pointwise.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;

namespace {

int R() { return world().rank(); }
int P() { return world().size(); }

Communicator& wcomm() {
  static DeviceMesh mesh({P()}, {"world"});
  static Communicator c = mesh.comm();
  return c;
}

[[noreturn]] void skip(const std::string& why) {
  if (R() == 0) std::fprintf(stderr, "SKIP: %s\n", why.c_str());
  std::fflush(stderr);
  std::exit(testing::kMesonSkip);
}

// The ranks agree (min over MPI) so that all skip or none does.
Device gpu() {
  static int device = [] {
    Tensor n = from_vector<int64_t>({static_cast<int64_t>(cuda::device_count())});
    wcomm().all_reduce(n, CommReduceOp::kMin);
    const int64_t fewest = n.to_vector<int64_t>()[0];
    if (fewest == 0) skip(fmt::format("no CUDA device: skipping ({})", cuda::unavailable_reason()));
    // Fewer GPUs than ranks: the ranks share them and the collectives are staged through host
    // memory (mesh/communicator.cpp, host_staged): the same assertions hold.
    const int d = local_rank() % static_cast<int>(fewest);
    cuda::set_device(d);
    return d;
  }();
  return Device::cuda(device);
}

void require_nccl() { (void)gpu(); }  // without NCCL the collectives are host-staged

// Input element i of rank r: irregular fractions (integers for integral dtypes).
Tensor input(int r, const Shape& shape, DType dt) {
  const int64_t n = shape.numel();
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = is_floating(dt) ? std::sin(0.37 * static_cast<double>(i) + 1.3 * r) * 4.0
                                                : static_cast<double>(((r + 1) * 37 + i * 7) % 100);
  return from_vector<double>(v, shape, dt);
}

// NCCL's sums and averages may add in another order than MPI from 3 ranks on (ring chunks, and
// bf16/f16 rounded after each step); with 1 or 2 ranks there is one addition: the same bits.
bool exact(DType dt, CommReduceOp op) {
  if (!is_floating(dt) || op == CommReduceOp::kMax || op == CommReduceOp::kMin) return true;
  return P() <= 2;
}

void require_same(const Tensor& cuda_t, const Tensor& host_t, bool bits) {
  REQUIRE(cuda_t.device() == gpu());
  REQUIRE(cuda_t.dtype() == host_t.dtype());
  REQUIRE(cuda_t.shape() == host_t.shape());
  if (bits) {
    REQUIRE(testing::same_bits(cuda_t, host_t));
  } else {
    const testing::Tol tol = testing::DTypeTols{}.of(host_t.dtype());
    REQUIRE_CLOSE(cuda_t.to(Device::cpu()), host_t, tol.rtol * 4, tol.atol * 4);
  }
}

// True when every rank holds the same bytes in t (compared on the host, over MPI).
bool same_on_all_ranks(const Tensor& t) {
  Tensor h = t.to(Device::cpu()).contiguous().reshape({t.numel()});
  Tensor all = empty(Shape{P() * t.numel()}, t.dtype());
  wcomm().all_gather(h, all);
  const auto* p = static_cast<const unsigned char*>(all.data_ptr());
  const size_t bytes = static_cast<size_t>(t.numel() * dtype_size(t.dtype()));
  for (int r = 1; r < P(); ++r)
    if (std::memcmp(p, p + r * bytes, bytes) != 0) return false;
  return true;
}

const CommReduceOp kOps[] = {CommReduceOp::kSum, CommReduceOp::kAvg, CommReduceOp::kMax, CommReduceOp::kMin};
const DType kDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8};

bool op_allowed(DType dt, CommReduceOp op) {
  return !(op == CommReduceOp::kAvg && !is_floating(dt));
}

}  // namespace

TEST_CASE("nccl: all_reduce on CUDA equals all_reduce on the host, every dtype and op", "[nccl]") {
  require_nccl();
  for (DType dt : kDTypes) {
    for (CommReduceOp op : kOps) {
      if (!op_allowed(dt, op)) continue;
      INFO(dtype_name(dt) << " " << comm_reduce_op_name(op));
      for (const Shape& shape : {Shape{37}, Shape{3, 5, 7}, Shape{0}}) {
        Tensor h = input(R(), shape, dt);
        Tensor g = h.to(gpu());
        wcomm().all_reduce(h, op);
        wcomm().all_reduce(g, op);
        require_same(g, h, exact(dt, op));
        REQUIRE(same_on_all_ranks(g));
      }
    }
  }
  // bool: max is or, min is and.
  for (CommReduceOp op : {CommReduceOp::kMax, CommReduceOp::kMin}) {
    Tensor hb = from_vector<double>({R() == 0 ? 1.0 : 0.0, 1.0, 0.0, R() % 2 == 1 ? 1.0 : 0.0}, Shape{4}, DType::kBool);
    Tensor gb = hb.to(gpu());
    wcomm().all_reduce(hb, op);
    wcomm().all_reduce(gb, op);
    require_same(gb, hb, true);
  }
}

TEST_CASE("nccl: the collective sees kernels queued before it on the compute stream", "[nccl]") {
  require_nccl();
  const int64_t n = 1 << 20;
  Tensor x = full(Shape{n}, 1.0, TensorOptions(DType::kF32).with_device(gpu()));
  Tensor y = mul(x, 3.0);  // a kernel on the compute stream, not waited for by the host
  wcomm().all_reduce(y);
  Tensor z = add(y, 1.0);  // queued after the wait
  const auto v = z.to_vector<float>();
  REQUIRE(v.front() == static_cast<float>(3 * P() + 1));
  REQUIRE(v.back() == static_cast<float>(3 * P() + 1));
}

TEST_CASE("nccl: all_gather and all_gather_uneven equal the host results", "[nccl]") {
  require_nccl();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI64, DType::kU8}) {
    INFO(dtype_name(dt));
    Tensor h = input(R(), Shape{3, 5}, dt), g = h.to(gpu());
    Tensor ho = empty(Shape{3 * P(), 5}, dt);
    Tensor go = empty(Shape{3 * P(), 5}, TensorOptions(dt).with_device(gpu()));
    wcomm().all_gather(h, ho);
    wcomm().all_gather(g, go);
    require_same(go, ho, true);
    // Uneven: rank r has r rows (rank 0 none), then r + 1 rows.
    for (int extra : {0, 1}) {
      Tensor hu = input(R(), Shape{R() + extra, 4}, dt), gu = hu.to(gpu());
      Tensor hr = wcomm().all_gather_uneven(hu);
      Tensor gr = wcomm().all_gather_uneven(gu);
      require_same(gr, hr, true);
    }
  }
}

TEST_CASE("nccl: reduce_scatter equals the host result, every op", "[nccl]") {
  require_nccl();
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32}) {
    for (CommReduceOp op : kOps) {
      if (!op_allowed(dt, op)) continue;
      INFO(dtype_name(dt) << " " << comm_reduce_op_name(op));
      Tensor h = input(R(), Shape{2 * P(), 7}, dt), g = h.to(gpu());
      Tensor ho = empty(Shape{2, 7}, dt);
      Tensor go = empty(Shape{2, 7}, TensorOptions(dt).with_device(gpu()));
      wcomm().reduce_scatter(h, ho, op);
      wcomm().reduce_scatter(g, go, op);
      require_same(go, ho, exact(dt, op));
    }
  }
}

TEST_CASE("nccl: all_to_all and all_to_allv equal the host results", "[nccl]") {
  require_nccl();
  for (DType dt : {DType::kF32, DType::kF16, DType::kI64}) {
    INFO(dtype_name(dt));
    Tensor h = input(R(), Shape{2 * P(), 3}, dt), g = h.to(gpu());
    Tensor ho = empty(h.shape(), dt), go = empty(h.shape(), TensorOptions(dt).with_device(gpu()));
    wcomm().all_to_all(h, ho);
    wcomm().all_to_all(g, go);
    require_same(go, ho, true);
    // v: (r + j) % 3 rows from rank r to rank j (zeros included).
    std::vector<int64_t> send(static_cast<size_t>(P())), recv(static_cast<size_t>(P()));
    int64_t rows = 0;
    for (int j = 0; j < P(); ++j) {
      send[static_cast<size_t>(j)] = (R() + j) % 3;
      recv[static_cast<size_t>(j)] = (j + R()) % 3;
      rows += send[static_cast<size_t>(j)];
    }
    Tensor hv = input(R(), Shape{rows, 2}, dt), gv = hv.to(gpu());
    Tensor hr = wcomm().all_to_allv(hv, send);
    Tensor gr = wcomm().all_to_allv(gv, send);
    require_same(gr, hr, true);
    Tensor gr2 = wcomm().all_to_allv(gv, send, recv);  // receive counts given: no exchange
    require_same(gr2, hr, true);
  }
}

TEST_CASE("nccl: broadcast, send and recv", "[nccl]") {
  require_nccl();
  for (int root = 0; root < P(); ++root) {
    Tensor h = input(R(), Shape{9}, DType::kBF16), g = h.to(gpu());
    wcomm().broadcast(h, root);
    wcomm().broadcast(g, root);
    require_same(g, h, true);
    require_same(g, input(root, Shape{9}, DType::kBF16), true);
  }
  // A ring: rank r sends to r + 1 and receives from r - 1 (itself in a world of one). NCCL
  // send/recv block on the GPU until the peer posts the matching call, so even ranks send first.
  const int next = (R() + 1) % P(), prev = (R() + P() - 1) % P();
  Tensor mine = input(R(), Shape{4, 6}, DType::kF32).to(gpu());
  Tensor got = zeros(Shape{4, 6}, TensorOptions(DType::kF32).with_device(gpu()));
  if (R() % 2 == 0 || P() == 1) {
    wcomm().send(mine, next, 3);
    wcomm().recv(got, prev, 3);
  } else {
    wcomm().recv(got, prev, 3);
    wcomm().send(mine, next, 3);
  }
  require_same(got, input(prev, Shape{4, 6}, DType::kF32), true);
  wcomm().barrier();
}

TEST_CASE("nccl: async handles: several in flight, is_completed, result", "[nccl]") {
  require_nccl();
  Tensor a = input(R(), Shape{1000}, DType::kF32), b = input(R() + 7, Shape{333}, DType::kF64);
  Tensor ga = a.to(gpu()), gb = b.to(gpu());
  Work wa = wcomm().all_reduce_async(ga, CommReduceOp::kAvg);
  Work wb = wcomm().all_reduce_async(gb, CommReduceOp::kMax);
  Tensor u = input(R(), Shape{R() + 1, 2}, DType::kF32).to(gpu());
  Work wu = wcomm().all_gather_uneven_async(u);
  while (!wb.is_completed()) {
  }
  wb.wait();
  wb.wait();  // idempotent
  wa.wait();
  Tensor gathered = wu.result();
  wcomm().all_reduce(a, CommReduceOp::kAvg);
  wcomm().all_reduce(b, CommReduceOp::kMax);
  require_same(ga, a, P() <= 2);
  require_same(gb, b, true);
  require_same(gathered, wcomm().all_gather_uneven(input(R(), Shape{R() + 1, 2}, DType::kF32)), true);
  // Dropping an unfinished handle waits for it; a polled handle completes without wait().
  Tensor before = ga.to(Device::cpu());
  { Work dropped = wcomm().all_reduce_async(ga, CommReduceOp::kMax); }
  require_same(ga, before, true);  // max of identical tensors: unchanged, and complete
  Work polled = wcomm().all_reduce_async(ga, CommReduceOp::kMin);
  while (!polled.is_completed()) {
  }
  require_same(ga, before, true);
}

TEST_CASE("nccl: mixed host and CUDA tensors are an error naming both", "[nccl]") {
  require_nccl();
  Tensor h = input(R(), Shape{2, 3}, DType::kF32), g = h.to(gpu());
  Tensor ho = empty(Shape{2 * P(), 3}, DType::kF32);
  REQUIRE_THROWS_WITH(wcomm().all_gather(g, ho),
                      Contains("all_gather: input is f32[2, 3] cuda:") && Contains("but output is f32[") &&
                          Contains("cpu") && Contains("one device"));
  Tensor go = empty(Shape{2, 3}, TensorOptions(DType::kF32).with_device(gpu()));
  Tensor hin = input(R(), Shape{2 * P(), 3}, DType::kF32);
  REQUIRE_THROWS_WITH(wcomm().reduce_scatter(hin, go), Contains("reduce_scatter: input is") &&
                                                           Contains("cpu") && Contains("cuda:"));
  Tensor hh = empty(h.shape(), DType::kF32);
  REQUIRE_THROWS_WITH(wcomm().all_to_all(g, hh), Contains("all_to_all") && Contains("move one of them"));
  // Non-contiguous CUDA tensors are refused like host ones.
  Tensor gt = zeros(Shape{3, 4}, TensorOptions(DType::kF32).with_device(gpu())).transpose(0, 1);
  REQUIRE_THROWS_WITH(wcomm().all_reduce(gt), Contains("all_reduce: tensor must be contiguous"));
}
