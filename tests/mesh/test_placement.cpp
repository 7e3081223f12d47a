// Placements and local shard geometry: printing/parsing, chunk sizes, 1-D and 2-D meshes,
// interleaved and ragged layouts, assemble(local_shard) == global for every placement
// combination, and sharded random numbers equal to the single-device tensor bit for bit.
#include <cstring>
#include <unordered_set>

#include "runtime/error.h"

#include "mesh/placement.h"
#include "mesh/shard_layout.h"
#include "tensor/random.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;

namespace {

Placement P(const char* s) { return Placement::parse(s); }
Placements PS(const char* s) { return parse_placements(s); }

// Same dtype, shape and bytes (a bit-for-bit comparison, whatever the layouts).
bool bits_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  if (a.numel() == 0) return true;
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(a.numel() * dtype_size(a.dtype()))) == 0;
}

std::vector<Shape> all_coords(const Shape& mesh) {
  std::vector<Shape> out;
  for (int64_t r = 0; r < mesh.numel(); ++r) {
    Shape c = Shape::filled(mesh.size(), 0);
    int64_t x = r;
    for (int i = mesh.size() - 1; i >= 0; --i) {
      c[i] = x % mesh[i];
      x /= mesh[i];
    }
    out.push_back(c);
  }
  return out;
}

// Local shard sizes along dim 0 for every rank of a 1-D mesh.
std::vector<int64_t> dim0_sizes(const Shape& shape, const Placements& ps, int64_t k) {
  std::vector<int64_t> out;
  for (int64_t c = 0; c < k; ++c) out.push_back(local_layout(shape, ps, {k}, {c}).local_shape[0]);
  return out;
}

// Every placement a mesh dim of size k can take for `shape`: R, P(op), S(d) for each dim,
// IS(d,g) for g in {2,3} dividing the global size, ZS(d) for even sizes, RS(d, irregular units with zeros, block 1 or 2).
std::vector<Placement> candidates(const Shape& shape, int64_t k, PartialOp partial_op) {
  std::vector<Placement> out{Placement::replicate(), Placement::partial(partial_op)};
  for (int d = 0; d < shape.size(); ++d) {
    out.push_back(Placement::shard(d));
    for (int64_t g : {2, 3})
      if (shape[d] % g == 0) out.push_back(Placement::interleaved_shard(d, g));
    if (shape[d] % 2 == 0) out.push_back(Placement::zigzag_shard(d));  // IS(d,2), odd group mirrored
    const int64_t block = shape[d] % 2 == 0 ? 2 : 1;
    std::vector<int64_t> units(static_cast<size_t>(k), 0);
    for (int64_t u = 0; u < shape[d] / block; ++u) units[static_cast<size_t>((u * u + 1) % k)]++;
    out.push_back(Placement::ragged_shard(d, units, block));
  }
  return out;
}

// Every combination of candidates over the mesh dims that is valid at every coordinate (IS and RS
// after another split of the same dim may not fit; those throw and are left out).
std::vector<Placements> valid_combos(const Shape& shape, const Shape& mesh, PartialOp partial_op, int* invalid) {
  std::vector<std::vector<Placement>> cand;
  for (int i = 0; i < mesh.size(); ++i) cand.push_back(candidates(shape, mesh[i], partial_op));
  std::vector<Placements> out;
  std::vector<size_t> idx(static_cast<size_t>(mesh.size()), 0);
  const auto coords = all_coords(mesh);
  while (true) {
    Placements ps;
    for (int i = 0; i < mesh.size(); ++i) ps.push_back(cand[static_cast<size_t>(i)][idx[static_cast<size_t>(i)]]);
    bool ok = true;
    for (const Shape& c : coords) {
      try {
        local_layout(shape, ps, mesh, c);
      } catch (const Error& e) {
        const std::string msg = e.what();
        // Only the fit of IS/RS may fail here, and the message says which.
        REQUIRE((msg.find("groups") != std::string::npos || msg.find("units") != std::string::npos));
        ok = false;
        break;
      }
    }
    if (ok) out.push_back(ps);
    else ++*invalid;
    int i = mesh.size() - 1;
    for (; i >= 0; --i) {
      auto& j = idx[static_cast<size_t>(i)];
      if (++j < cand[static_cast<size_t>(i)].size()) break;
      j = 0;
    }
    if (i < 0) break;
  }
  return out;
}

const std::vector<Shape> kMeshes = {{4}, {2, 2}, {2, 3}};
const std::vector<Shape> kShapes = {{7}, {2}, {12}, {6, 5}, {4, 6, 3}, {2, 3, 4, 6}, {3, 2, 4, 1, 6}};

}  // namespace

TEST_CASE("placement: printing, parsing, equality, hashing", "[cpu]") {
  const std::vector<std::pair<Placement, std::string>> cases = {
      {Placement::replicate(), "R"},
      {Placement::shard(0), "S(0)"},
      {Placement::shard(3), "S(3)"},
      {Placement::partial(), "P(sum)"},
      {Placement::partial(PartialOp::kAvg), "P(avg)"},
      {Placement::partial(PartialOp::kMax), "P(max)"},
      {Placement::partial(PartialOp::kMin), "P(min)"},
      {Placement::interleaved_shard(0, 3), "IS(0,3)"},
      {Placement::zigzag_shard(1), "ZS(1)"},
      {Placement::ragged_shard(0, {2, 1, 3}, 4), "RS(0,[2,1,3],b4)"},
      {Placement::ragged_shard(2, {0, 5}), "RS(2,[0,5],b1)"},
  };
  std::unordered_set<Placement> set;
  for (const auto& [p, text] : cases) {
    CHECK(p.str() == text);
    CHECK(fmt::format("{}", p) == text);
    CHECK(Placement::parse(text) == p);
    CHECK(Placement::parse(text).hash() == p.hash());
    set.insert(p);
    set.insert(Placement::parse(text));
  }
  CHECK(set.size() == cases.size());  // all distinct, and parsed copies hash to the originals
  CHECK(Placement() == Placement::replicate());
  CHECK(Placement::shard(0) != Placement::shard(1));
  CHECK(Placement::shard(0) != Placement::interleaved_shard(0, 1));
  CHECK(Placement::ragged_shard(0, {1, 2}) != Placement::ragged_shard(0, {2, 1}));
  CHECK(Placement::ragged_shard(0, {1, 2}, 2) != Placement::ragged_shard(0, {1, 2}, 4));
  CHECK(Placement::partial(PartialOp::kSum) != Placement::partial(PartialOp::kMax));

  // Lenient input: spaces, bare P, RS without block.
  CHECK(P(" IS( 1 , 4 ) ") == Placement::interleaved_shard(1, 4));
  CHECK(P("P") == Placement::partial());
  CHECK(P("RS(1,[3, 4])") == Placement::ragged_shard(1, {3, 4}, 1));
  CHECK(Placement::shard(1).splits());
  CHECK(!Placement::partial().splits());
  CHECK(Placement::shard(2).dim() == 2);

  const Placements ps = PS("[S(0), RS(1,[1,2],b3), P(max), IS(2,2), R]");
  REQUIRE(ps.size() == 5);
  CHECK(ps[1] == Placement::ragged_shard(1, {1, 2}, 3));
  CHECK(placements_str(ps) == "[S(0), RS(1,[1,2],b3), P(max), IS(2,2), R]");
  CHECK(parse_placements(placements_str(ps)) == ps);
  CHECK(PS("S(0),R") == Placements{Placement::shard(0), Placement::replicate()});
  CHECK(PS("[]").empty());

  for (const char* bad : {"S(x)", "Q", "S(0", "S(-1)", "P(prod)", "IS(0)", "IS(0,0)", "RS(0,[1,-1],b2)",
                          "RS(0,[1],b0)", "R R", "", "S(0)x"})
    REQUIRE_THROWS_WITH(Placement::parse(bad), Contains("Placement::parse") && Contains(std::string("'") + bad + "'"));
  REQUIRE_THROWS_WITH(parse_placements("[S(0), S(y)]"), Contains("[S(0), S(y)]") && Contains("'S(y)'"));
  REQUIRE_THROWS_WITH(parse_placements("[S(0,R]"), Contains("unbalanced"));
  REQUIRE_THROWS_WITH(Placement::shard(-1), Contains("Shard") && Contains("-1"));
  REQUIRE_THROWS_WITH(Placement::interleaved_shard(0, 0), Contains("groups"));
  REQUIRE_THROWS_WITH(Placement::ragged_shard(0, {1}, 0), Contains("block"));
  // Units whose row count wraps around 64 bits (to exactly 128 here) used to pass the size check and
  // segfault `meshtrain plan`; they are refused where the placement is made, naming the units.
  REQUIRE_THROWS_WITH(Placement::parse("RS(0,[4611686018427387904,4611686018427387968],b2)"),
                      Contains("[4611686018427387904,4611686018427387968]") && Contains("overflow"));
  REQUIRE_THROWS_WITH(Placement::ragged_shard(0, {int64_t{1} << 62, 1}, 4), Contains("overflow"));
}

TEST_CASE("placement: chunk semantics for uneven Shard", "[cpu]") {
  CHECK(dim0_sizes({7}, PS("S(0)"), 4) == std::vector<int64_t>{2, 2, 2, 1});
  CHECK(dim0_sizes({2}, PS("S(0)"), 4) == std::vector<int64_t>{1, 1, 0, 0});
  CHECK(dim0_sizes({5}, PS("S(0)"), 4) == std::vector<int64_t>{2, 2, 1, 0});
  CHECK(dim0_sizes({0, 3}, PS("S(0)"), 3) == std::vector<int64_t>{0, 0, 0});
  CHECK(dim0_sizes({8, 3}, PS("S(0)"), 4) == std::vector<int64_t>{2, 2, 2, 2});
  CHECK(dim0_sizes({3, 5}, PS("S(1)"), 2) == std::vector<int64_t>{3, 3});
  CHECK(chunk_range(7, 4, 3) == IndexRange{6, 1});
  CHECK(chunk_range(2, 4, 2) == IndexRange{2, 0});
  CHECK(chunk_range(5, 4, 3) == IndexRange{5, 0});

  // Offsets: 7 rows over 4 ranks start at 0, 2, 4, 6; an empty shard has no pieces.
  for (int64_t c = 0; c < 4; ++c) {
    LocalLayout L = local_layout({7, 3}, PS("S(0)"), {4}, {c});
    REQUIRE(L.pieces.size() == 1);
    CHECK(L.pieces[0].global_offset == Shape{2 * c, 0});
    CHECK(L.pieces[0].global_base == 2 * c * 3);
    CHECK(L.global_strides == Shape{3, 1});
  }
  CHECK(local_layout({2, 3}, PS("S(0)"), {4}, {3}).pieces.empty());
  CHECK(local_layout({2, 3}, PS("S(0)"), {4}, {3}).local_shape == Shape{0, 3});
  // Replicate and Partial do not split; a 0-D tensor is one piece.
  CHECK(local_layout({7, 3}, PS("P(sum)"), {4}, {2}).local_shape == Shape{7, 3});
  CHECK(local_layout({}, PS("R"), {4}, {1}).pieces.size() == 1);
}

TEST_CASE("placement: 2-D meshes", "[cpu]") {
  SECTION("[S(0), S(0)]: the second mesh dim splits what the first left") {
    // 7 rows over 2 -> 4, 3; then 4 -> 2, 2 and 3 -> 2, 1.
    const std::vector<std::pair<int64_t, int64_t>> expect = {{0, 2}, {2, 2}, {4, 2}, {6, 1}};
    for (const Shape& c : all_coords({2, 2})) {
      LocalLayout L = local_layout({7, 3}, PS("[S(0), S(0)]"), {2, 2}, c);
      const auto [start, len] = expect[static_cast<size_t>(c[0] * 2 + c[1])];
      CHECK(L.local_shape == Shape{len, 3});
      REQUIRE(L.pieces.size() == 1);
      CHECK(L.pieces[0].global_offset == Shape{start, 0});
    }
  }
  SECTION("[S(0), S(1)]") {
    // 5 rows over 2 -> 3, 2; 7 columns over 3 -> 3, 3, 1.
    for (const Shape& c : all_coords({2, 3})) {
      LocalLayout L = local_layout({5, 7}, PS("[S(0), S(1)]"), {2, 3}, c);
      CHECK(L.local_shape == Shape{c[0] == 0 ? 3 : 2, c[1] == 2 ? 1 : 3});
      REQUIRE(L.pieces.size() == 1);
      CHECK(L.pieces[0].global_offset == Shape{3 * c[0], 3 * c[1]});
      CHECK(L.pieces[0].global_base == 3 * c[0] * 7 + 3 * c[1]);
    }
  }
  SECTION("[S(1), IS(0,3)]: fused QKV rows, each of q, k, v chunked") {
    // 6 rows = 3 groups of 2 rows; over 2 ranks each rank gets one row per group.
    for (const Shape& c : all_coords({2, 2})) {
      LocalLayout L = local_layout({6, 4}, PS("[S(1), IS(0,3)]"), {2, 2}, c);
      CHECK(L.local_shape == Shape{3, 2});
      REQUIRE(L.pieces.size() == 3);
      for (int64_t g = 0; g < 3; ++g) {
        const ShardPiece& p = L.pieces[static_cast<size_t>(g)];
        CHECK(p.local_offset == Shape{g, 0});
        CHECK(p.sizes == Shape{1, 2});
        CHECK(p.global_offset == Shape{2 * g + c[1], 2 * c[0]});
      }
    }
  }
  SECTION("IS with uneven groups: 10 rows, 2 groups of 5, over 4 ranks") {
    const std::vector<std::vector<int64_t>> rows = {{0, 1, 5, 6}, {2, 3, 7, 8}, {4, 9}, {}};
    for (int64_t c = 0; c < 4; ++c) {
      LocalLayout L = local_layout({10}, PS("IS(0,2)"), {4}, {c});
      std::vector<int64_t> got;
      for (const ShardPiece& p : L.pieces)
        for (int64_t i = 0; i < p.sizes[0]; ++i) got.push_back(p.global_offset[0] + i);
      CHECK(got == rows[static_cast<size_t>(c)]);
      CHECK(L.local_shape[0] == static_cast<int64_t>(rows[static_cast<size_t>(c)].size()));
    }
  }
  SECTION("IS merges pieces that are contiguous: IS(0,3) over one rank is one piece") {
    CHECK(local_layout({6, 4}, PS("IS(0,3)"), {1}, {0}).pieces.size() == 1);
  }
}

TEST_CASE("placement: RaggedShard with blocks", "[cpu]") {
  // 12 rows, block 2: units [2, 0, 3, 1] -> rows 0-3, none, 4-9, 10-11.
  const Placements ps = PS("RS(0,[2,0,3,1],b2)");
  const std::vector<std::pair<int64_t, int64_t>> expect = {{0, 4}, {4, 0}, {4, 6}, {10, 2}};
  for (int64_t c = 0; c < 4; ++c) {
    LocalLayout L = local_layout({12, 5}, ps, {4}, {c});
    CHECK(L.local_shape == Shape{expect[static_cast<size_t>(c)].second, 5});
    if (expect[static_cast<size_t>(c)].second == 0) {
      CHECK(L.pieces.empty());
    } else {
      REQUIRE(L.pieces.size() == 1);
      CHECK(L.pieces[0].global_offset == Shape{expect[static_cast<size_t>(c)].first, 0});
    }
  }
  // On a 2-D mesh after a column shard; and RS on a dim the first mesh dim split evenly.
  LocalLayout L = local_layout({12, 5}, PS("[S(1), RS(0,[1,2],b4)]"), {2, 2}, {1, 1});
  CHECK(L.local_shape == Shape{8, 2});
  CHECK(L.pieces[0].global_offset == Shape{4, 3});
  L = local_layout({12, 5}, PS("[S(0), RS(0,[1,2],b2)]"), {2, 2}, {1, 1});
  CHECK(L.local_shape == Shape{4, 5});
  CHECK(L.pieces[0].global_offset == Shape{8, 0});
}

TEST_CASE("placement: errors name the shape, dim, groups, units and mesh", "[cpu]") {
  REQUIRE_THROWS_WITH(local_layout({7, 4}, PS("IS(0,3)"), {2}, {0}),
                      Contains("IS(0,3)") && Contains("[7, 4]") && Contains("tensor dim 0") &&
                          Contains("size 7") && Contains("3 groups"));
  // Divisible globally but not after the first mesh dim split it (8 -> 4 rows, 3 groups).
  REQUIRE_THROWS_WITH(local_layout({8}, PS("[S(0), IS(0,3)]"), {2, 2}, {0, 0}),
                      Contains("size 4 here") && Contains("3 groups"));
  REQUIRE_THROWS_WITH(local_layout({12}, PS("RS(0,[1,2,3,1],b2)"), {4}, {0}),
                      Contains("[1,2,3,1]") && Contains("sum to 7") && Contains("size 12"));
  REQUIRE_THROWS_WITH(local_layout({12}, PS("RS(0,[1,2],b2)"), {4}, {0}),
                      Contains("units for 2 ranks") && Contains("has 4"));
  REQUIRE_THROWS_WITH(local_layout({12}, PS("S(1)"), {4}, {0}),
                      Contains("S(1)") && Contains("1-D tensor") && Contains("[12]"));
  REQUIRE_THROWS_WITH(local_layout({12}, PS("S(0)"), {4}, {4}),
                      Contains("coord [4] is outside mesh shape [4]"));
  REQUIRE_THROWS_WITH(local_layout({12}, PS("[S(0), R]"), {4}, {0}),
                      Contains("2 placements for a 1-D mesh"));
  REQUIRE_THROWS_WITH(local_shard(zeros({7, 4}), PS("IS(0,2)"), {2}, {0}),
                      Contains("local_shard") && Contains("IS(0,2)") && Contains("2 groups"));
  REQUIRE_THROWS_WITH(assemble({zeros({4}), zeros({4})}, {7}, PS("S(0)"), {2}),
                      Contains("rank 1") && Contains("expected f32 [3]"));
  REQUIRE_THROWS_WITH(assemble({zeros({4})}, {7}, PS("S(0)"), {2}), Contains("1 local tensors"));
  Tensor t = zeros({3});
  REQUIRE_THROWS_WITH(fill_random_sharded(t, RandomDist::kUniform, 0, 1, 1, 0, {7}, PS("P(sum)"), {2}, {0}),
                      Contains("Partial(sum)") && Contains("P(sum)"));
  REQUIRE_THROWS_WITH(fill_random_sharded(t, RandomDist::kUniform, 0, 1, 1, 0, {7}, PS("S(0)"), {2}, {0}),
                      Contains("shape [3]") && Contains("[4]"));
}

TEST_CASE("placement: assemble(local_shard) == global for every combination", "[cpu]") {
  int checked = 0, invalid = 0;
  for (const Shape& mesh : kMeshes) {
    for (const Shape& shape : kShapes) {
      const Tensor global = testing::rand(shape, DType::kF64, 7, 1, 2);  // no zeros
      for (const Placements& ps : valid_combos(shape, mesh, PartialOp::kSum, &invalid)) {
        INFO("mesh " << fmt::format("{}", mesh) << " shape " << fmt::format("{}", shape) << " placements "
                     << placements_str(ps));
        std::vector<Tensor> locals;
        for (const Shape& c : all_coords(mesh)) {
          const Tensor local = local_shard(global, ps, mesh, c);
          const LocalLayout L = local_layout(shape, ps, mesh, c);
          REQUIRE(local.shape() == L.local_shape);
          // The pieces copied out of the global tensor give the same local tensor, unless this
          // coordinate holds a zero Partial(sum) term.
          bool zero_term = false;
          for (int i = 0; i < mesh.size(); ++i)
            if (ps[static_cast<size_t>(i)].is_partial() && c[i] != 0) zero_term = true;
          if (!zero_term) {
            Tensor from_pieces = full(L.local_shape, -1, DType::kF64);
            int64_t covered = 0;
            for (const ShardPiece& p : L.pieces) {
              block_view(from_pieces, p.local_offset, p.sizes).copy_(block_view(global, p.global_offset, p.sizes));
              covered += p.sizes.numel();
            }
            REQUIRE(covered == L.local_shape.numel());
            REQUIRE(bits_equal(from_pieces, local));
          }
          locals.push_back(local);
        }
        REQUIRE(bits_equal(assemble(locals, shape, ps, mesh), global));
        ++checked;
      }
    }
  }
  INFO("checked " << checked << ", invalid " << invalid);
  CHECK(checked > 1000);
  CHECK(invalid > 0);
}

TEST_CASE("placement: assemble reduces Partial avg/max/min", "[cpu]") {
  const Tensor global = testing::rand({5, 4}, DType::kF64, 3);
  for (const char* p : {"[P(avg), S(1)]", "[S(0), P(max)]", "[P(min), P(avg)]"}) {
    const Placements ps = PS(p);
    std::vector<Tensor> locals;
    for (const Shape& c : all_coords({2, 3})) locals.push_back(local_shard(global, ps, {2, 3}, c));
    REQUIRE_CLOSE(assemble(locals, {5, 4}, ps, {2, 3}), global, 1e-15, 0);
  }
  // Terms that really differ: max over ranks.
  const Tensor a = testing::rand({3}, DType::kF64, 1), b = testing::rand({3}, DType::kF64, 2);
  REQUIRE(bits_equal(assemble({a, b}, {3}, PS("P(max)"), {2}), maximum(a, b)));
  REQUIRE(bits_equal(assemble({a, b}, {3}, PS("P(sum)"), {2}), add(a, b)));
}

namespace {

struct DistCase {
  const char* name;
  RandomDist dist;
  double a, b;
  DType dtype;
};

const std::vector<DistCase> kDists = {
    {"uniform f32", RandomDist::kUniform, -2, 3, DType::kF32},
    {"uniform f64", RandomDist::kUniform, -2, 3, DType::kF64},
    {"uniform bf16", RandomDist::kUniform, 0, 1, DType::kBF16},
    {"normal f32", RandomDist::kNormal, 0.5, 2, DType::kF32},
    {"normal f64", RandomDist::kNormal, 0, 1, DType::kF64},
    {"randint i64", RandomDist::kRandint, -5, 1000, DType::kI64},
    {"randint i64 wide", RandomDist::kRandint, 0, 1099511627776.0, DType::kI64},
    {"bernoulli f32", RandomDist::kBernoulli, 0.3, 0, DType::kF32},
};

}  // namespace

TEST_CASE("placement: fill_random_sharded equals the single-device tensor bit for bit", "[cpu]") {
  const uint64_t seed = 1234, offset = 17;
  int checked = 0, invalid = 0;
  for (const Shape& mesh : kMeshes) {
    for (const Shape& shape : kShapes) {
      // Partial(max) ranks hold the whole value, like Replicate; Partial(sum) is rejected.
      const auto combos = valid_combos(shape, mesh, PartialOp::kMax, &invalid);
      for (const DistCase& dc : kDists) {
        Tensor global = empty(shape, dc.dtype);
        fill_random(global, dc.dist, dc.a, dc.b, seed, offset, 0, shape.contiguous_strides());
        for (const Placements& ps : combos) {
          for (const Shape& c : all_coords(mesh)) {
            INFO(dc.name << " mesh " << fmt::format("{}", mesh) << " shape " << fmt::format("{}", shape)
                         << " placements " << placements_str(ps) << " coord " << fmt::format("{}", c));
            const Tensor expect = local_shard(global, ps, mesh, c);
            Tensor local = full(expect.shape(), 7, dc.dtype);
            fill_random_sharded(local, dc.dist, dc.a, dc.b, seed, offset, shape, ps, mesh, c);
            REQUIRE(bits_equal(local, expect));
            // A transposed view of a local buffer (all dims reversed).
            Shape rev;
            std::vector<int64_t> perm;
            for (int d = expect.dim() - 1; d >= 0; --d) {
              rev.push_back(expect.size(d));
              perm.push_back(d);
            }
            Tensor buf = full(rev, 7, dc.dtype);
            Tensor view = buf.permute(perm);
            fill_random_sharded(view, dc.dist, dc.a, dc.b, seed, offset, shape, ps, mesh, c);
            REQUIRE(bits_equal(view, expect));
            ++checked;
          }
        }
      }
    }
  }
  INFO("checked " << checked);
  CHECK(checked > 10000);
}

TEST_CASE("placement: sharded random numbers on a strided sub-view and a 2-D weight", "[cpu]") {
  // A column-sharded [6, 13] weight over a [2, 3] mesh with rows interleaved: write into every
  // other column of a wider buffer.
  const Shape shape{6, 13};
  const Placements ps = PS("[IS(0,3), S(1)]");
  Tensor global = empty(shape, DType::kF32);
  fill_random(global, RandomDist::kNormal, 0, 0.02, 5, 3, 0, shape.contiguous_strides());
  std::vector<Tensor> locals;
  for (const Shape& c : all_coords({2, 3})) {
    const LocalLayout L = local_layout(shape, ps, {2, 3}, c);
    Tensor wide = zeros({L.local_shape[0], 2 * L.local_shape[1]}, DType::kF32);
    Tensor local = wide.slice(1, 0, 2 * L.local_shape[1], 2);
    fill_random_sharded(local, RandomDist::kNormal, 0, 0.02, 5, 3, shape, ps, {2, 3}, c);
    REQUIRE(bits_equal(local, local_shard(global, ps, {2, 3}, c)));
    locals.push_back(local);
  }
  REQUIRE(bits_equal(assemble(locals, shape, ps, {2, 3}), global));
}

TEST_CASE("placement: left to right differs from one flat shard", "[cpu]") {
  std::vector<int64_t> sizes;
  for (const Shape& c : all_coords({2, 2}))
    sizes.push_back(local_layout({5}, PS("[S(0), S(0)]"), {2, 2}, c).local_shape[0]);
  CHECK(sizes == std::vector<int64_t>{2, 1, 1, 1});
  CHECK(dim0_sizes({5}, PS("S(0)"), 4) == std::vector<int64_t>{2, 2, 1, 0});
  REQUIRE_THROWS_WITH(local_layout({6}, PS("[S(0), IS(0,2)]"), {2, 2}, {1, 0}), Contains("size 3 here"));
  CHECK(local_layout({6}, PS("IS(0,2)"), {2}, {1}).local_shape == Shape{2});
}
