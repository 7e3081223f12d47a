// DTensor core under `mpirun -np N` (N = 1, 2, 4; meshes [N], and [2, 2] when N == 4): spec
// interning, distribute_tensor / to_local / full_tensor round trips, from_local shape checks,
// redistribute forward against redistribute_local and its gradient against the analytic one.
// Values are small dyadic numbers, so every sum is exact in any order.
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/placement.h"
#include "mesh/redistribute.h"
#include "mesh/shard_layout.h"
#include "mesh/world.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "mesh_testing.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;

namespace {

int P() { return testing::world_size(); }
using testing::mesh_1d;
using testing::mesh_2d;


// scale * i + shift, row-major.
Tensor global_tensor(const Shape& s, double scale = 0.25, double shift = -3.0) {
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<double>(i) + shift;
  return from_vector<double>(v, s, DType::kF64);
}

void require_equal(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.to_vector<double>() == b.to_vector<double>());
}

std::vector<Placements> all_placements(int ndim, bool partial) {
  std::vector<Placement> one = {Placement::replicate(), Placement::shard(0), Placement::shard(1)};
  if (partial) one.push_back(Placement::partial());
  std::vector<Placements> out;
  if (ndim == 1) {
    for (auto& p : one) out.push_back({p});
  } else {
    for (auto& p : one)
      for (auto& q : one) out.push_back({p, q});
  }
  return out;
}

std::vector<DeviceMesh*> meshes() {
  std::vector<DeviceMesh*> ms = {&mesh_1d()};
  if (P() == 4) ms.push_back(&mesh_2d());
  return ms;
}

Placements grad_of(Placements ps) {
  for (auto& p : ps)
    if (p.is_partial()) p = Placement::replicate();
  return ps;
}

}  // namespace

TEST_CASE("dtensor: specs are interned", "[cpu][mpi]") {
  auto a = intern_spec(mesh_1d(), {Placement::shard(0)}, {5, 3});
  auto b = intern_spec(mesh_1d(), parse_placements("S(0)"), {5, 3});
  REQUIRE(a.get() == b.get());
  DeviceMesh again({P()}, {"x"});
  REQUIRE(intern_spec(again, {Placement::shard(0)}, {5, 3}).get() == a.get());
  REQUIRE(intern_spec(mesh_1d(), {Placement::shard(1)}, {5, 3}).get() != a.get());
  REQUIRE(intern_spec(mesh_1d(), {Placement::shard(0)}, {5, 4}).get() != a.get());
  DeviceMesh other({P()}, {"y"});
  REQUIRE(intern_spec(other, {Placement::shard(0)}, {5, 3}).get() != a.get());
  REQUIRE_THAT(a->str(), Contains("S(0)") && Contains("[5, 3]"));
  REQUIRE_THROWS_WITH(intern_spec(mesh_1d(), {Placement::shard(0), Placement::replicate()}, {5, 3}),
                      Contains("placements"));
  REQUIRE_THROWS_AS(intern_spec(mesh_1d(), {Placement::shard(2)}, {5, 3}), Error);
}

TEST_CASE("dtensor: distribute_tensor / to_local / full_tensor round trip", "[cpu][mpi]") {
  for (DeviceMesh* mesh : meshes()) {
    for (const Shape& shape : {Shape{5, 3}, Shape{2, 7}, Shape{8, 4}}) {
      Tensor g = global_tensor(shape);
      for (const Placements& ps : all_placements(mesh->ndim(), true)) {
        INFO(mesh->str() << " " << placements_str(ps) << " " << fmt::format("{}", shape));
        Tensor dt = distribute_tensor(g, *mesh, ps);
        REQUIRE(dt.is_distributed());
        REQUIRE(dt.dist_spec() == intern_spec(*mesh, ps, shape).get());
        REQUIRE(dtensor_spec(dt, "t").local_shape() == dt.local_shape());
        REQUIRE(dt.shape() == shape);  // a DTensor's shape is the global shape
        Tensor loc = to_local(dt);
        REQUIRE(!loc.is_distributed());
        REQUIRE(loc.data_ptr() == dt.view_info().data);  // data_ptr() of a sharded DTensor is refused
        require_equal(loc, local_shard(g, ps, mesh->shape(), mesh->coordinate_shape()));
        // detach keeps the spec.
        REQUIRE(dt.detach().dist_spec() == dt.dist_spec());
        Tensor full = full_tensor(dt);
        REQUIRE(!full.is_distributed());
        require_equal(full, g);
        // from_local of the shard gives the same spec back.
        Tensor dt2 = from_local(loc, *mesh, ps, shape);
        REQUIRE(dt2.dist_spec() == dt.dist_spec());
        require_equal(full_tensor(dt2), g);
      }
    }
  }
}

TEST_CASE("dtensor: bad inputs throw", "[cpu][mpi]") {
  DeviceMesh& mesh = mesh_1d();
  Placements s0 = {Placement::shard(0)};
  Shape want = intern_spec(mesh, s0, {5, 3})->local_shape();
  Shape bad = want;
  bad[1] = 4;
  REQUIRE_THROWS_WITH(from_local(zeros(bad, DType::kF64), mesh, s0, {5, 3}),
                      Contains("from_local") && Contains(fmt::format("rank {}", world().rank())) &&
                          Contains(fmt::format("{}", want)) && Contains(fmt::format("{}", bad)));
  Tensor plain = zeros({2}, DType::kF64);
  REQUIRE_THROWS_WITH(to_local(plain), Contains("to_local") && Contains("local tensor"));
  REQUIRE_THROWS_WITH(full_tensor(plain), Contains("full_tensor"));
  REQUIRE_THROWS_WITH(redistribute(plain, s0), Contains("redistribute"));
  Tensor dt = distribute_tensor(global_tensor({5, 3}), mesh, s0);
  REQUIRE_THROWS_WITH(redistribute(dt, {Placement::replicate(), Placement::replicate()}),
                      Contains("redistribute"));
  REQUIRE_THROWS_WITH(distribute_tensor(dt, mesh, s0), Contains("already a DTensor"));
  Tensor l = zeros(intern_spec(mesh, {Placement::partial(PartialOp::kMax)}, {5, 3})->local_shape(), DType::kF64);
  l.requires_grad_();
  REQUIRE_THROWS_WITH(from_local(l, mesh, {Placement::partial(PartialOp::kMax)}, {5, 3}),
                      Contains("from_local") && Contains("P(max)"));
}

TEST_CASE("dtensor: redistribute forward equals redistribute_local", "[cpu][mpi]") {
  for (DeviceMesh* mesh : meshes()) {
    Shape shape{5, 6};
    Tensor g = global_tensor(shape);
    for (const Placements& src : all_placements(mesh->ndim(), true)) {
      for (const Placements& dst : all_placements(mesh->ndim(), true)) {
        INFO(mesh->str() << " " << placements_str(src) << " -> " << placements_str(dst));
        Tensor dt = distribute_tensor(g, *mesh, src);
        Tensor out = redistribute(dt, dst);
        REQUIRE(out.dist_spec() == intern_spec(*mesh, dst, shape).get());
        Tensor ref = redistribute_local(to_local(dt), shape, src, dst, *mesh);
        require_equal(to_local(out), ref);
        require_equal(full_tensor(out), g);
      }
    }
  }
}

TEST_CASE("dtensor: redistribute gradient", "[cpu][mpi]") {
  for (DeviceMesh* mesh : meshes()) {
    for (const Shape& shape : {Shape{5, 6}, Shape{3, 2}}) {
      Tensor g = global_tensor(shape);
      Tensor w = global_tensor(shape, 0.5, -2.0);
      for (const Placements& src : all_placements(mesh->ndim(), true)) {
        for (const Placements& dst : all_placements(mesh->ndim(), true)) {
          INFO(mesh->str() << " " << placements_str(src) << " -> " << placements_str(dst));
          Tensor x = distribute_tensor(g, *mesh, src);
          x.requires_grad_();
          Tensor loss = sum(mul(w, full_tensor(redistribute(x, dst))));
          REQUIRE(loss.item() == sum(mul(w, g)).item());
          loss.backward();
          Tensor gx = x.grad();
          REQUIRE(gx.defined());
          // The gradient is a DTensor with the source placements, Partial mapped to Replicate,
          // whose global value is dloss/dx = w.
          Placements gp = grad_of(src);
          REQUIRE(gx.dist_spec() == intern_spec(*mesh, gp, shape).get());
          require_equal(to_local(gx), local_shard(w, gp, mesh->shape(), mesh->coordinate_shape()));
          require_equal(full_tensor(gx), w);
        }
      }
    }
  }
}

TEST_CASE("dtensor: gradient through from_local / to_local and a chain", "[cpu][mpi]") {
  for (DeviceMesh* mesh : meshes()) {
    Shape shape{7, 3};
    Tensor g = global_tensor(shape);
    Tensor w = global_tensor(shape, 0.5, -2.0);
    for (const Placements& ps : all_placements(mesh->ndim(), true)) {
      INFO(mesh->str() << " " << placements_str(ps));
      Tensor l = local_shard(g, ps, mesh->shape(), mesh->coordinate_shape());
      l.requires_grad_();
      Tensor dt = from_local(l, *mesh, ps, shape);
      // A chain through every placement of the list and back.
      Tensor y = dt;
      for (const Placements& q : all_placements(mesh->ndim(), true)) y = redistribute(y, q);
      sum(mul(w, full_tensor(y))).backward();
      REQUIRE(!l.grad().is_distributed());
      // Partial(sum) terms: the gradient of each term is the gradient of the sum (replicated).
      require_equal(l.grad(), local_shard(w, grad_of(ps), mesh->shape(), mesh->coordinate_shape()));
    }
  }
}

TEST_CASE("dtensor: gradient accumulates as a DTensor", "[cpu][mpi]") {
  DeviceMesh& mesh = mesh_1d();
  Shape shape{6, 2};
  Tensor w = global_tensor(shape, 0.5, -2.0);
  Tensor x = distribute_tensor(global_tensor(shape), mesh, {Placement::shard(0)});
  x.requires_grad_();
  Tensor a = full_tensor(redistribute(x, {Placement::replicate()}));
  Tensor b = full_tensor(redistribute(x, {Placement::shard(1)}));
  add(sum(mul(w, a)), sum(mul(w, b))).backward();
  REQUIRE(x.grad().dist_spec() == x.dist_spec());
  require_equal(full_tensor(x.grad()), mul(w, 2.0));
}
