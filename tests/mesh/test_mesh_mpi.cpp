// Collectives and meshes under `mpirun -np N` (N = 1, 2, 4; also run without mpirun as a world of
// one). Every rank builds rank-dependent inputs, runs the collective, and checks the result
// against the value it computes locally from the inputs every rank would have had.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mesh/communicator.h"
#include "mesh/device_mesh.h"
#include "mesh/world.h"
#include "runtime/error.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;

namespace {

int R() { return world().rank(); }
int P() { return world().size(); }

// One world communicator for the whole test binary: creating one is collective.
Communicator& wcomm() {
  static DeviceMesh mesh({P()}, {"world"});
  static Communicator c = mesh.comm();
  return c;
}

// Input element i of rank r: irregular fractions, so that rounding and order matter.
double val(int r, int64_t i) { return std::sin(0.37 * static_cast<double>(i) + 1.3 * r) * 4.0; }
int64_t ival(int r, int64_t i) { return (r + 1) * 1000 + i * 7 - 50; }

Tensor input(int r, int64_t n, DType dt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = is_floating(dt) ? val(r, i) : static_cast<double>(ival(r, i));
  return from_vector<double>(v, Shape{n}, dt);
}

// What rank r's input holds, as seen after conversion to dt (e.g. rounded to bf16).
std::vector<double> stored(int r, int64_t n, DType dt) { return input(r, n, dt).to_vector<double>(); }

// Local reference of an all-reduce over ranks 0..P-1 in rank order, in double.
std::vector<double> reference(int64_t n, DType dt, CommReduceOp op) {
  std::vector<double> acc = stored(0, n, dt);
  for (int r = 1; r < P(); ++r) {
    auto x = stored(r, n, dt);
    for (int64_t i = 0; i < n; ++i) {
      auto& a = acc[static_cast<size_t>(i)];
      const double b = x[static_cast<size_t>(i)];
      a = (op == CommReduceOp::kMax) ? std::max(a, b) : (op == CommReduceOp::kMin) ? std::min(a, b) : a + b;
    }
  }
  if (op == CommReduceOp::kAvg)
    for (auto& a : acc) a /= P();
  return acc;
}

// The exact bf16/f16 result the design promises: f32 accumulation in rank order, one rounding.
template <class T>
std::vector<float> reference16(int64_t n, DType dt, CommReduceOp op) {
  std::vector<float> out(static_cast<size_t>(n));
  std::vector<std::vector<double>> x;
  for (int r = 0; r < P(); ++r) x.push_back(stored(r, n, dt));
  for (int64_t i = 0; i < n; ++i) {
    float acc = static_cast<float>(x[0][static_cast<size_t>(i)]);
    for (int r = 1; r < P(); ++r) {
      const float v = static_cast<float>(x[static_cast<size_t>(r)][static_cast<size_t>(i)]);
      if (op == CommReduceOp::kMax) acc = std::max(acc, v);
      else if (op == CommReduceOp::kMin) acc = std::min(acc, v);
      else acc += v;
    }
    if (op == CommReduceOp::kAvg) acc /= static_cast<float>(P());
    out[static_cast<size_t>(i)] = static_cast<float>(T(acc));
  }
  return out;
}

// True when every rank holds the same bytes in t.
bool same_on_all_ranks(const Tensor& t) {
  Tensor all = empty(Shape{P() * t.numel()}, t.dtype());
  wcomm().all_gather(t.reshape({t.numel()}), all);
  const auto* p = static_cast<const unsigned char*>(all.data_ptr());
  const size_t bytes = static_cast<size_t>(t.numel() * dtype_size(t.dtype()));
  for (int r = 1; r < P(); ++r)
    if (std::memcmp(p, p + r * bytes, bytes) != 0) return false;
  return true;
}

const CommReduceOp kOps[] = {CommReduceOp::kSum, CommReduceOp::kAvg, CommReduceOp::kMax, CommReduceOp::kMin};

}  // namespace

TEST_CASE("world: rank and size", "[mpi]") {
  REQUIRE(P() >= 1);
  REQUIRE(R() >= 0);
  REQUIRE(R() < P());
  REQUIRE(wcomm().size() == P());
  REQUIRE(wcomm().rank() == R());
  REQUIRE_FALSE(world().transport().empty());
}

TEST_CASE("all_reduce: f64, f32, i64 against local reference, every op", "[mpi]") {
  const int64_t n = 37;
  for (DType dt : {DType::kF64, DType::kF32, DType::kI64, DType::kI32}) {
    for (CommReduceOp op : kOps) {
      if (op == CommReduceOp::kAvg && !is_floating(dt)) continue;
      INFO(dtype_name(dt) << " " << comm_reduce_op_name(op));
      Tensor t = input(R(), n, dt);
      wcomm().all_reduce(t, op);
      const double tol = dt == DType::kF32 ? 1e-6 : 1e-13;
      REQUIRE_CLOSE(t, reference(n, dt, op), tol, tol);
      REQUIRE(same_on_all_ranks(t));
    }
  }
}

TEST_CASE("all_reduce: bf16 and f16 are exact, rank-ordered f32 sums, identical on every rank", "[mpi]") {
  const int64_t n = 101;
  for (CommReduceOp op : kOps) {
    INFO(comm_reduce_op_name(op));
    Tensor b = input(R(), n, DType::kBF16);
    wcomm().all_reduce(b, op);
    REQUIRE(b.to_vector<float>() == reference16<BFloat16>(n, DType::kBF16, op));
    REQUIRE(same_on_all_ranks(b));
    Tensor h = input(R(), n, DType::kF16);
    wcomm().all_reduce(h, op);
    REQUIRE(h.to_vector<float>() == reference16<Float16>(n, DType::kF16, op));
    REQUIRE(same_on_all_ranks(h));
  }
  // Deterministic: the same call twice gives the same bits.
  Tensor a = input(R(), n, DType::kBF16), a2 = input(R(), n, DType::kBF16);
  wcomm().all_reduce(a);
  wcomm().all_reduce(a2);
  REQUIRE(a.to_vector<float>() == a2.to_vector<float>());
}

TEST_CASE("all_reduce: 2-D and empty tensors, bool max/min", "[mpi]") {
  Tensor t = input(R(), 12, DType::kF64).reshape({3, 4});
  wcomm().all_reduce(t, CommReduceOp::kMax);
  REQUIRE(t.shape() == Shape{3, 4});
  REQUIRE_CLOSE(t.reshape({12}), reference(12, DType::kF64, CommReduceOp::kMax), 0, 0);
  Tensor e = empty(Shape{0, 3}, DType::kF32);
  wcomm().all_reduce(e);
  REQUIRE(e.numel() == 0);
  // bool: max is "any rank", min is "every rank". Rank 0 holds true only in element 0.
  Tensor flags = from_vector<double>({R() == 0 ? 1.0 : 0.0, 1.0}, Shape{2}, DType::kBool);
  Tensor any = flags.clone(), all = flags.clone();
  wcomm().all_reduce(any, CommReduceOp::kMax);
  wcomm().all_reduce(all, CommReduceOp::kMin);
  REQUIRE(any.to_vector<double>() == std::vector<double>{1, 1});
  REQUIRE(all.to_vector<double>() == std::vector<double>{P() == 1 ? 1.0 : 0.0, 1});
}

TEST_CASE("all_gather: even, along dim 0, f32 and i64 and bf16", "[mpi]") {
  for (DType dt : {DType::kF32, DType::kI64, DType::kBF16}) {
    Tensor in = input(R(), 6, dt).reshape({3, 2});
    Tensor out = empty(Shape{3 * P(), 2}, dt);
    wcomm().all_gather(in, out);
    std::vector<double> want;
    for (int r = 0; r < P(); ++r) {
      auto v = stored(r, 6, dt);
      want.insert(want.end(), v.begin(), v.end());
    }
    REQUIRE(out.to_vector<double>() == want);
  }
}

TEST_CASE("all_gather_uneven: rank r contributes r rows (rank 0: none)", "[mpi]") {
  for (DType dt : {DType::kF64, DType::kBF16, DType::kI32}) {
    const int64_t rows = R();
    Tensor in = input(R(), rows * 3, dt).reshape({rows, 3});
    Tensor out = wcomm().all_gather_uneven(in);
    int64_t total = 0;
    std::vector<double> want;
    for (int r = 0; r < P(); ++r) {
      auto v = stored(r, r * 3, dt);
      want.insert(want.end(), v.begin(), v.end());
      total += r;
    }
    REQUIRE(out.shape() == Shape{total, 3});
    REQUIRE(out.dtype() == dt);
    REQUIRE(out.to_vector<double>() == want);
  }
  if (P() > 1) {  // every rank sees the mismatch and throws the same error
    Tensor bad = zeros(Shape{1, R() == 0 ? 3 : 2});
    REQUIRE_THROWS_WITH(wcomm().all_gather_uneven(bad),
                        Contains("all_gather_uneven") && Contains("only dim 0 may differ"));
  }
}

TEST_CASE("reduce_scatter: each rank gets its chunk of the reduction", "[mpi]") {
  const int64_t m = 5;  // rows per rank, 2 columns
  for (DType dt : {DType::kF64, DType::kF32, DType::kI64, DType::kBF16, DType::kF16}) {
    for (CommReduceOp op : kOps) {
      if (op == CommReduceOp::kAvg && !is_floating(dt)) continue;
      INFO(dtype_name(dt) << " " << comm_reduce_op_name(op));
      const int64_t n = P() * m * 2;
      Tensor in = input(R(), n, dt).reshape({P() * m, 2});
      Tensor out = empty(Shape{m, 2}, dt);
      wcomm().reduce_scatter(in, out, op);
      std::vector<double> want;
      if (dt == DType::kBF16 || dt == DType::kF16) {
        auto full = dt == DType::kBF16 ? reference16<BFloat16>(n, dt, op) : reference16<Float16>(n, dt, op);
        for (int64_t i = R() * m * 2; i < (R() + 1) * m * 2; ++i) want.push_back(full[static_cast<size_t>(i)]);
        REQUIRE(out.to_vector<double>() == want);
      } else {
        auto full = reference(n, dt, op);
        want.assign(full.begin() + R() * m * 2, full.begin() + (R() + 1) * m * 2);
        const double tol = dt == DType::kF32 ? 1e-6 : 1e-13;
        REQUIRE_CLOSE(out.reshape({m * 2}), want, tol, tol);
      }
    }
  }
}

TEST_CASE("all_to_all: chunk j goes to rank j", "[mpi]") {
  // Row j of rank r's input holds (r, j); row j of the output must hold (j, r).
  std::vector<double> v;
  for (int j = 0; j < P(); ++j) v.insert(v.end(), {double(R()), double(j), 0.5});
  for (DType dt : {DType::kF32, DType::kI64, DType::kBF16}) {
    Tensor in = from_vector<double>(v, Shape{P(), 3}, dt);
    Tensor out = empty(Shape{P(), 3}, dt);
    wcomm().all_to_all(in, out);
    std::vector<double> want;
    for (int j = 0; j < P(); ++j) want.insert(want.end(), {double(j), double(R()), is_floating(dt) ? 0.5 : 0.0});
    REQUIRE(out.to_vector<double>() == want);
  }
}

TEST_CASE("all_to_allv: varied counts per peer, zero included", "[mpi]") {
  auto count = [](int src, int dst) { return int64_t((src + 2 * dst) % 3); };
  auto code = [](int src, int dst, int64_t k) { return double(src * 100 + dst * 10 + k); };
  std::vector<int64_t> send;
  std::vector<double> v;
  for (int j = 0; j < P(); ++j) {
    send.push_back(count(R(), j));
    for (int64_t k = 0; k < count(R(), j); ++k) v.insert(v.end(), {code(R(), j, k), -code(R(), j, k)});
  }
  std::vector<int64_t> recv;
  std::vector<double> want;
  for (int j = 0; j < P(); ++j) {
    recv.push_back(count(j, R()));
    for (int64_t k = 0; k < count(j, R()); ++k) want.insert(want.end(), {code(j, R(), k), -code(j, R(), k)});
  }
  const int64_t rows = static_cast<int64_t>(v.size() / 2);
  for (DType dt : {DType::kF64, DType::kI64}) {
    Tensor in = from_vector<double>(v, Shape{rows, 2}, dt);
    Tensor out = wcomm().all_to_allv(in, send);  // receive counts exchanged
    REQUIRE(out.to_vector<double>() == want);
    Tensor out2 = wcomm().all_to_allv(in, send, recv);  // receive counts given
    REQUIRE(out2.to_vector<double>() == want);
    REQUIRE(out2.size(0) == static_cast<int64_t>(want.size() / 2));
  }
  std::vector<int64_t> wrong(send);
  wrong.push_back(1);
  REQUIRE_THROWS_WITH(wcomm().all_to_allv(zeros(Shape{rows, 2}), wrong),
                      Contains("all_to_allv") && Contains("send counts"));
}

TEST_CASE("broadcast from a non-zero root", "[mpi]") {
  const int root = P() - 1;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI64}) {
    Tensor t = input(R(), 9, dt).reshape({3, 3});
    wcomm().broadcast(t, root);
    REQUIRE(t.to_vector<double>() == stored(root, 9, dt));
  }
}

TEST_CASE("send/recv around a ring", "[mpi]") {
  const int next = (R() + 1) % P(), prev = (R() + P() - 1) % P();
  Tensor out = input(R(), 8, DType::kF64);
  Tensor in = empty(Shape{8}, DType::kF64);
  Work s = wcomm().send_async(out, next, 7);
  wcomm().recv(in, prev, 7);
  s.wait();
  REQUIRE(in.to_vector<double>() == stored(prev, 8, DType::kF64));
  // Tags keep messages apart: receive tag 2 before tag 1.
  Tensor a = full(Shape{2}, 1.0), b = full(Shape{2}, 2.0), ra = empty(Shape{2}), rb = empty(Shape{2});
  Work w1 = wcomm().send_async(a, next, 1);
  Work w2 = wcomm().send_async(b, next, 2);
  wcomm().recv(rb, prev, 2);
  wcomm().recv(ra, prev, 1);
  w1.wait();
  w2.wait();
  REQUIRE(ra.to_vector<double>() == std::vector<double>{1, 1});
  REQUIRE(rb.to_vector<double>() == std::vector<double>{2, 2});
  // A message shorter than the receiving tensor is an error, not a buffer filled in part.
  Tensor small = full(Shape{2}, 3.0), big = zeros(Shape{5});
  Work w3 = wcomm().send_async(small, next, 9);
  REQUIRE_THROWS_WITH(wcomm().recv(big, prev, 9),
                      Contains("recv") && (Contains("holds 2 elements but 5 were expected") ||  // MPI
                                           Contains("the receiving tensor has 40")));           // a world of one
  w3.wait();
  wcomm().barrier();
}

TEST_CASE("async: several collectives in flight, waited in any order", "[mpi]") {
  Tensor a = input(R(), 64, DType::kF64);
  Tensor b = input(R(), 64, DType::kBF16);
  Tensor g_in = input(R(), 4, DType::kF32);
  Tensor g_out = empty(Shape{4 * P()}, DType::kF32);
  Work wa = wcomm().all_reduce_async(a, CommReduceOp::kSum);
  Work wb = wcomm().all_reduce_async(b, CommReduceOp::kMax);
  Work wg = wcomm().all_gather_async(g_in, g_out);
  Work wu = wcomm().all_gather_uneven_async(input(R(), R() + 1, DType::kI64));
  Work wbar = wcomm().barrier_async();
  wbar.wait();
  wu.wait();
  wg.wait();
  wb.wait();
  wa.wait();
  wa.wait();  // idempotent
  REQUIRE(wa.is_completed());
  REQUIRE(Work().is_completed());
  REQUIRE_CLOSE(a, reference(64, DType::kF64, CommReduceOp::kSum), 1e-13, 1e-13);
  REQUIRE(b.to_vector<float>() == reference16<BFloat16>(64, DType::kBF16, CommReduceOp::kMax));
  std::vector<double> want;
  for (int r = 0; r < P(); ++r) {
    auto v = stored(r, r + 1, DType::kI64);
    want.insert(want.end(), v.begin(), v.end());
  }
  REQUIRE(wu.result().to_vector<double>() == want);
  // is_completed() eventually turns true without wait().
  Tensor c = ones(Shape{3});
  Work wc = wcomm().all_reduce_async(c);
  while (!wc.is_completed()) {
  }
  REQUIRE(c.to_vector<double>() == std::vector<double>(3, P()));
}

TEST_CASE("collective errors name the collective and the shapes", "[mpi]") {
  Tensor nc = zeros(Shape{4, 4}).t();
  REQUIRE_THROWS_WITH(wcomm().all_reduce(nc), Contains("all_reduce") && Contains("contiguous"));
  Tensor i = zeros(Shape{3}, DType::kI64);
  REQUIRE_THROWS_WITH(wcomm().all_reduce(i, CommReduceOp::kAvg), Contains("all_reduce") && Contains("avg"));
  Tensor bl = zeros(Shape{3}, DType::kBool);
  REQUIRE_THROWS_WITH(wcomm().all_reduce(bl), Contains("sum of bool"));
  Tensor in = zeros(Shape{2, 3}), bad = zeros(Shape{2 * P() + 1, 3});
  REQUIRE_THROWS_WITH(wcomm().all_gather(in, bad),
                      Contains("all_gather") && Contains("[2, 3]") && Contains(fmt::format("[{}, 3]", 2 * P() + 1)));
  Tensor out_f64 = zeros(Shape{2 * P(), 3}, DType::kF64);
  REQUIRE_THROWS_WITH(wcomm().all_gather(in, out_f64), Contains("all_gather") && Contains("dtype"));
  Tensor rs_in = zeros(Shape{P() * 2 + 1, 3}), rs_out = zeros(Shape{2, 3});
  if (P() > 1) REQUIRE_THROWS_WITH(wcomm().reduce_scatter(rs_in, rs_out), Contains("reduce_scatter") && Contains("evenly"));
  Tensor s = zeros(Shape{2});
  REQUIRE_THROWS_WITH(wcomm().all_gather(scalar_tensor(1.0), s), Contains("all_gather") && Contains("at least one dim"));
  REQUIRE_THROWS_WITH(wcomm().broadcast(s, P()), Contains("broadcast") && Contains("root"));
  REQUIRE_THROWS_WITH(wcomm().send(s, -1), Contains("send") && Contains("peer -1"));
  REQUIRE_THROWS_WITH(Communicator().barrier(), Contains("barrier") && Contains("undefined"));
  REQUIRE_THROWS_WITH(set_collective_timeout(std::chrono::milliseconds(0)), Contains("positive"));
  Tensor overlap = zeros(Shape{2 * P(), 3});
  if (P() == 1) REQUIRE_THROWS_WITH(wcomm().all_gather(overlap.narrow(0, 0, 2), overlap), Contains("overlap"));
}

TEST_CASE("timeout setting", "[mpi]") {
  const auto before = collective_timeout();
  REQUIRE(before.count() > 0);
  set_collective_timeout(std::chrono::milliseconds(1234));
  REQUIRE(collective_timeout().count() == 1234);
  set_collective_timeout(before);
}

TEST_CASE("DeviceMesh: coordinates, sub-meshes and flattened groups match row-major order", "[mpi]") {
  // [a, b] with names dp, tp: world rank = dp * b + tp.
  const int a = P() % 2 == 0 ? 2 : 1, b = P() / a;
  DeviceMesh mesh({a, b}, {"dp", "tp"});
  REQUIRE(fmt::format("{}", mesh) == fmt::format("DeviceMesh([{}, {}], [\"dp\", \"tp\"])", a, b));
  REQUIRE(mesh.ndim() == 2);
  REQUIRE(mesh.size() == P());
  REQUIRE(mesh.size("dp") == a);
  REQUIRE(mesh.size(1) == b);
  REQUIRE(mesh.coordinate("dp") == R() / b);
  REQUIRE(mesh.coordinate(1) == R() % b);
  REQUIRE(mesh.rank() == R());
  std::vector<int> all;
  for (int r = 0; r < P(); ++r) all.push_back(r);
  REQUIRE(mesh.world_ranks() == all);

  std::vector<int> dp_group, tp_group;
  for (int i = 0; i < a; ++i) dp_group.push_back(i * b + R() % b);
  for (int j = 0; j < b; ++j) tp_group.push_back((R() / b) * b + j);
  DeviceMesh dp = mesh["dp"], tp = mesh["tp"];
  REQUIRE(fmt::format("{}", tp) == fmt::format("DeviceMesh([{}], [\"tp\"])", b));
  REQUIRE(dp.world_ranks() == dp_group);
  REQUIRE(tp.world_ranks() == tp_group);
  REQUIRE(dp.coordinate(0) == R() / b);
  REQUIRE(tp.rank() == R() % b);

  // Communicators: group order is the sub-mesh order; a sum over the group names its members.
  for (auto* sub : {&dp, &tp}) {
    Communicator c = sub->comm();
    REQUIRE(c.size() == sub->size());
    REQUIRE(c.rank() == sub->rank());
    REQUIRE(c.world_ranks() == sub->world_ranks());
    Tensor t = full(Shape{1}, double(R()), DType::kI64);
    c.all_reduce(t);
    int64_t want = 0;
    for (int r : sub->world_ranks()) want += r;
    REQUIRE(t.item_int() == want);
    REQUIRE(c.description().find("mesh dims") != std::string::npos);
  }
  // Cached: asking again returns the same communicator.
  REQUIRE(&mesh.comm("tp").world_ranks() == &tp.comm().world_ranks());

  DeviceMesh flat = mesh.flatten({"dp", "tp"});
  REQUIRE(flat.ndim() == 1);
  REQUIRE(flat.names() == std::vector<std::string>{"dp_tp"});
  REQUIRE(flat.world_ranks() == all);
  REQUIRE(flat.rank() == R());
  REQUIRE(flat.comm().rank() == R());
}

TEST_CASE("DeviceMesh: 3-D mesh, flatten of adjacent and non-adjacent dims, select", "[mpi]") {
  // [a, 1, b] (dp, cp, tp): flatten(dp, cp) is the dp group; flatten(dp, tp) is the world.
  const int a = P() % 2 == 0 ? 2 : 1, b = P() / a;
  DeviceMesh mesh({a, 1, b}, {"dp", "cp", "tp"});
  DeviceMesh dpcp = mesh.flatten({"dp", "cp"});
  REQUIRE(dpcp.world_ranks() == mesh["dp"].world_ranks());
  REQUIRE(dpcp.size(0) == a);
  DeviceMesh dptp = mesh.flatten({"dp", "tp"});
  REQUIRE(dptp.size() == P());
  REQUIRE(dptp.rank() == R());
  REQUIRE(mesh["cp"].world_ranks() == std::vector<int>{R()});
  DeviceMesh sel = mesh.select({"dp", "tp"});
  REQUIRE(sel.shape() == Shape{a, b});
  REQUIRE(sel.coordinates() == std::vector<int64_t>{R() / b, R() % b});
  // flatten of a flattened sub-mesh's dims composes.
  REQUIRE(sel.flatten({"dp", "tp"}).world_ranks() == dptp.world_ranks());
  Tensor t = ones(Shape{2}, DType::kF32);
  dpcp.comm().all_reduce(t, CommReduceOp::kSum);
  REQUIRE(t.to_vector<double>() == std::vector<double>(2, a));
  if (P() == 4) {
    // The 2x2 case spelled out: rank 3 is (1, 1); its dp group is {1, 3}, its tp group {2, 3}.
    DeviceMesh m({2, 2}, {"dp", "tp"});
    const std::vector<std::vector<int>> dp = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
    const std::vector<std::vector<int>> tp = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
    REQUIRE(m["dp"].world_ranks() == dp[static_cast<size_t>(R())]);
    REQUIRE(m["tp"].world_ranks() == tp[static_cast<size_t>(R())]);
    REQUIRE(m["dp"].comm().rank() == R() / 2);
    REQUIRE(m["tp"].comm().rank() == R() % 2);
  }
}

TEST_CASE("DeviceMesh errors name the shape, the names and the world size", "[mpi]") {
  REQUIRE_THROWS_WITH(DeviceMesh({P() + 1}, {"dp"}),
                      Contains(fmt::format("DeviceMesh([{}], [\"dp\"])", P() + 1)) &&
                          Contains(fmt::format("the world has {}", P())));
  REQUIRE_THROWS_WITH(DeviceMesh({P(), 1}, {"dp"}), Contains("2 dims but 1 names"));
  REQUIRE_THROWS_WITH(DeviceMesh({P(), 1}, {"dp", "dp"}), Contains("\"dp\" is repeated"));
  REQUIRE_THROWS_WITH(DeviceMesh({P(), 0}, {"dp", "tp"}), Contains("size 0"));
  DeviceMesh mesh({P(), 1}, {"dp", "tp"});
  REQUIRE_THROWS_WITH(mesh["cp"], Contains("no dim named \"cp\"") && Contains("[\"dp\", \"tp\"]"));
  REQUIRE_THROWS_WITH(mesh.flatten({"tp", "dp"}), Contains("flatten") && Contains("mesh order"));
  REQUIRE_THROWS_WITH(mesh.flatten({}), Contains("flatten"));
  REQUIRE_THROWS_WITH(mesh.size(2), Contains("dim 2 out of range"));
}
