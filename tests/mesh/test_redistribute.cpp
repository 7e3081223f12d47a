// redistribute_local under `mpirun -np N` (N = 1, 2, 4; meshes [N], and [2, 2] when N == 4). For a
// deterministic global tensor every rank builds its source local shard with local_shard (Partial
// terms perturbed so that only their reduction equals the value), redistributes, and compares with
// local_shard(global, dst) bit for bit; Partial destinations are first reduced over their mesh dims
// with all_reduce. Values are small dyadic numbers, so every sum is exact in any order.
#include <string>
#include <vector>

#include "mesh/communicator.h"
#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "mesh/redistribute.h"
#include "mesh/shard_layout.h"
#include "mesh/world.h"
#include "runtime/error.h"
#include "mesh_testing.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;

namespace {

int P() { return testing::world_size(); }
using testing::mesh_1d;
using testing::mesh_2d;

// Size-1 leading dim: a change on mesh dim 0 forces undoing dims 2 and 1 (right to left).
DeviceMesh& mesh_3d() {
  static DeviceMesh m({1, 2, 2}, {"p", "a", "b"});
  return m;
}


// 0.25 * i - 3, row-major.
Tensor global_tensor(const Shape& s, DType dt = DType::kF64) {
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25 * static_cast<double>(i) - 3.0;
  return from_vector<double>(v, s, dt);
}

// Positive perturbation pattern of a shape: 0.5 * (i % 7) + 1.
Tensor pattern(const Shape& s, DType dt) {
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5 * static_cast<double>(i % 7) + 1.0;
  return from_vector<double>(v, s, dt);
}

// This rank's source local: local_shard, with the terms of Partial mesh dims made rank-dependent
// (sum: -(k-1)e at coordinate 0 and +e elsewhere; max: -e off coordinate 0; min: +e off it).
Tensor source_local(const Tensor& global, const Placements& src, const DeviceMesh& mesh) {
  const Shape coord = mesh.coordinate_shape();
  Tensor t = local_shard(global, src, mesh.shape(), coord).clone();
  const Tensor e = pattern(t.shape(), t.dtype());
  for (int j = 0; j < mesh.ndim(); ++j) {
    const Placement& p = src[static_cast<size_t>(j)];
    if (!p.is_partial()) continue;
    const int64_t k = mesh.size(j), c = coord[j];
    switch (p.reduce_op()) {
      case PartialOp::kSum: t.add_(e, c == 0 ? -static_cast<double>(k - 1) : 1.0); break;
      case PartialOp::kMax: if (c != 0) t.add_(e, -1.0); break;
      case PartialOp::kMin: if (c != 0) t.add_(e, 1.0); break;
      case PartialOp::kAvg: break;
    }
  }
  return t;
}

// True when the placements fit the shape at every coordinate of the mesh (same answer on every rank).
bool fits(const Shape& shape, const Placements& ps, const Shape& mesh_shape) {
  const int64_t n = mesh_shape.numel();
  for (int64_t r = 0; r < n; ++r) {
    Shape coord = Shape::filled(mesh_shape.size(), 0);
    int64_t rem = r;
    for (int j = mesh_shape.size() - 1; j >= 0; --j) {
      coord[j] = rem % mesh_shape[j];
      rem /= mesh_shape[j];
    }
    try {
      (void)local_layout(shape, ps, mesh_shape, coord);
    } catch (const Error&) {
      return false;
    }
  }
  return true;
}

// Redistributes src -> dst and checks this rank's result; returns false on a mismatch.
bool check_pair(const Tensor& global, const Placements& src, const Placements& dst, const DeviceMesh& mesh,
                bool noncontig_input = false) {
  Tensor in = source_local(global, src, mesh);
  if (noncontig_input) in = mt::testing::noncontig(in);
  Tensor out = redistribute_local(in, global.shape(), src, dst, mesh);
  Placements reduced = dst;
  Tensor got = out.contiguous().clone();
  for (int j = mesh.ndim() - 1; j >= 0; --j) {
    const Placement& p = dst[static_cast<size_t>(j)];
    if (!p.is_partial()) continue;
    mesh.comm(j).all_reduce(got, comm_reduce_op(p.reduce_op()));
    reduced[static_cast<size_t>(j)] = Placement::replicate();
  }
  const Tensor want = local_shard(global, reduced, mesh.shape(), mesh.coordinate_shape());
  const bool ok = got.shape() == want.shape() && got.dtype() == want.dtype() &&
                  got.to_vector<double>() == want.to_vector<double>();
  if (!ok)
    UNSCOPED_INFO(fmt::format("{} -> {} on {} for global {}: got {} want {}", placements_str(src),
                              placements_str(dst), mesh.str(), global.shape(), got.str(), want.str()));
  return ok;
}

// Every pair of placement lists built from `options` per mesh dim that fit the shape.
void all_pairs(const Tensor& global, const std::vector<Placement>& options, const DeviceMesh& mesh) {
  std::vector<Placements> lists{{}};
  for (int j = 0; j < mesh.ndim(); ++j) {
    std::vector<Placements> next;
    for (const auto& l : lists)
      for (const auto& p : options) {
        Placements m = l;
        m.push_back(p);
        next.push_back(m);
      }
    lists = next;
  }
  std::vector<Placements> valid;
  for (const auto& l : lists)
    if (fits(global.shape(), l, mesh.shape())) valid.push_back(l);
  int bad = 0, total = 0;
  for (const auto& s : valid)
    for (const auto& d : valid) {
      ++total;
      if (!check_pair(global, s, d, mesh, total % 5 == 0)) ++bad;
    }
  INFO(fmt::format("{} on {}: {} of {} pairs wrong", global.shape(), mesh.str(), bad, total));
  CHECK(bad == 0);
}

std::vector<Placement> basic_options(int ndim, bool one_d_mesh) {
  std::vector<Placement> o{Placement::replicate()};
  for (int d = 0; d < std::min(ndim, 3); ++d) o.push_back(Placement::shard(d));
  o.push_back(Placement::partial(PartialOp::kSum));
  if (one_d_mesh) {
    o.push_back(Placement::partial(PartialOp::kMax));
    o.push_back(Placement::partial(PartialOp::kMin));
    o.push_back(Placement::partial(PartialOp::kAvg));
  }
  return o;
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s{{7, 5}, {3, 4, 6}, {2, 0, 3}, {1, 2}};
  return s;
}

}  // namespace

TEST_CASE("redistribute: all pairs of R, S, P on a 1-D mesh", "[cpu][mpi]") {
  for (const Shape& s : shapes()) all_pairs(global_tensor(s), basic_options(s.size(), true), mesh_1d());
}

TEST_CASE("redistribute: all pairs of R, S, P on a [2, 2] mesh", "[cpu][mpi]") {
  if (P() != 4) return;
  for (const Shape& s : shapes()) all_pairs(global_tensor(s), basic_options(s.size(), false), mesh_2d());
}

TEST_CASE("redistribute: all pairs of R, S, P on a [1, 2, 2] mesh", "[cpu][mpi]") {
  if (P() != 4) return;
  for (const Shape& s : {Shape{7, 5}, Shape{3, 4, 2}})
    all_pairs(global_tensor(s), basic_options(2, false), mesh_3d());
}

TEST_CASE("redistribute: interleaved, zigzag and ragged shards", "[cpu][mpi]") {
  const int64_t k = P();
  const std::vector<int64_t> units = k == 1 ? std::vector<int64_t>{6}
                                     : k == 2 ? std::vector<int64_t>{4, 2}
                                              : std::vector<int64_t>{0, 3, 1, 2};
  std::vector<Placement> opts{Placement::replicate(), Placement::shard(0), Placement::shard(1),
                              Placement::partial(), Placement::interleaved_shard(0, 2),
                              Placement::interleaved_shard(0, 3), Placement::ragged_shard(0, units, 2),
                              Placement::zigzag_shard(0)};
  all_pairs(global_tensor({12, 5}), opts, mesh_1d());
  if (P() == 4) {
    std::vector<Placement> o2{Placement::replicate(), Placement::shard(0), Placement::shard(1),
                              Placement::partial(), Placement::interleaved_shard(0, 2),
                              Placement::ragged_shard(1, {2, 3}), Placement::ragged_shard(0, {1, 0}, 3),
                              Placement::zigzag_shard(0)};
    all_pairs(global_tensor({12, 5}), o2, mesh_2d());
  }
}

TEST_CASE("redistribute: other dtypes", "[cpu][mpi]") {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI64}) {
    const Tensor g = global_tensor({6, 5}, dt);
    for (const char* s : {"R", "S(0)", "S(1)", "P(sum)", "P(max)"})
      for (const char* d : {"R", "S(0)", "S(1)", "P(sum)", "P(min)"}) {
        const Placements src = parse_placements(s), dst = parse_placements(d);
        INFO(fmt::format("{} -> {} in {}", s, d, dtype_name(dt)));
        CHECK(check_pair(g, src, dst, mesh_1d()));
      }
  }
}

TEST_CASE("redistribute: identical placements return the input", "[cpu][mpi]") {
  const Tensor g = global_tensor({7, 5});
  const Placements ps = parse_placements("S(1)");
  const Tensor in = local_shard(g, ps, mesh_1d().shape(), mesh_1d().coordinate_shape());
  CHECK(redistribute_local(in, g.shape(), ps, ps, mesh_1d()).same(in));
}

TEST_CASE("redistribute: errors name the placements, the shape and the mesh", "[cpu][mpi]") {
  const Tensor g = global_tensor({7, 5});
  const DeviceMesh& m = mesh_1d();
  const Tensor in = local_shard(g, parse_placements("R"), m.shape(), m.coordinate_shape());
  REQUIRE_THROWS_WITH(redistribute_local(in, g.shape(), parse_placements("R, R"), parse_placements("S(0)"), m),
                      Contains("redistribute([R, R] -> [S(0)], global shape [7, 5], DeviceMesh(") &&
                          Contains("one placement per mesh dim"));
  REQUIRE_THROWS_WITH(redistribute_local(in, g.shape(), parse_placements("R"), parse_placements("S(2)"), m),
                      Contains("redistribute([R] -> [S(2)], global shape [7, 5]") && Contains("S(2)"));
  REQUIRE_THROWS_WITH(redistribute_local(in.narrow(0, 0, 3), g.shape(), parse_placements("R"),
                                         parse_placements("S(0)"), m),
                      Contains("local tensor has shape [3, 5]") && Contains("[7, 5]"));
  REQUIRE_THROWS_WITH(redistribute_local(in, g.shape(), parse_placements("R"), parse_placements("IS(0,2)"), m),
                      Contains("IS(0,2)") && Contains("[7, 5]"));
}
