// Sharded checkpoints without MPI: every rank of a mesh is simulated in this process
// (DeviceMesh::simulated), so one test saves a tensor under one mesh and placements (each rank's
// snapshot_shard + write_shard, then the merge rank 0 does) and loads it under others, checking
// that each rank gets exactly its local shard (bit for bit), reads no byte outside it, and that
// replicated chunks are written once.
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/chunk_index.h"
#include "checkpoint/shard_reader.h"
#include "checkpoint/shard_writer.h"
#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/shard_layout.h"
#include "models/safetensors.h"
#include "testing.h"

using namespace mt;
using mt::testing::same_bits;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

std::vector<int64_t> coords_of(int64_t rank, const Shape& mesh) {
  std::vector<int64_t> c(static_cast<size_t>(mesh.size()));
  for (int d = mesh.size() - 1; d >= 0; --d) {
    c[d] = rank % mesh[d];
    rank /= mesh[d];
  }
  return c;
}

std::vector<std::string> names_for(const Shape& mesh) {
  std::vector<std::string> n;
  for (int d = 0; d < mesh.size(); ++d) n.push_back(fmt::format("m{}", d));
  return n;
}

// Saves `global` (as "w") and a plain scalar under `placements` over `mesh`, as every rank would;
// returns the merged index.
ShardedIndex save(const std::string& dir, const Tensor& global, const Shape& mesh, const Placements& placements,
                  int64_t stripe_bytes = kStripeBytes) {
  const int64_t world = mesh.numel();
  std::vector<ShardedIndex> parts;
  for (int64_t r = 0; r < world; ++r) {
    DeviceMesh m = DeviceMesh::simulated(mesh, names_for(mesh), coords_of(r, mesh));
    Tensor local = local_shard(global, placements, mesh, Shape(coords_of(r, mesh)));
    Tensor dt = from_local(local, m, placements, global.shape());
    ShardSnapshot s = snapshot_shard({{"model", {{"w", dt}}}, {"optimizer", {{"step", scalar_tensor(3, DType::kI64)}}}},
                                     r, world, m.str());
    write_shard(s, dir, stripe_bytes);
    parts.push_back(read_sharded_index((fs::path(dir) / chunk_list_name(s.file)).string(), false));
  }
  ShardedIndex ix = merge_indexes(parts, dir);
  const std::string text = index_to_json(ix);
  write_file_atomically((fs::path(dir) / kShardedIndexFile).string(), [&](std::ostream& o) { o << text; });
  return ix;
}

// Loads "w" under `placements` over `mesh` on every simulated rank and checks its local shard.
void check_load(const std::string& dir, const Tensor& global, const Shape& mesh, const Placements& placements) {
  for (int64_t r = 0; r < mesh.numel(); ++r) {
    DeviceMesh m = DeviceMesh::simulated(mesh, names_for(mesh), coords_of(r, mesh));
    Tensor want = local_shard(global, placements, mesh, Shape(coords_of(r, mesh)));
    Tensor live = from_local(zeros(want.shape(), DType::kF32), m, placements, global.shape());
    ShardedCheckpointReader reader(dir);
    auto got = reader.load_like("model", {{"w", live}});
    INFO("load under " << placements_str(placements) << " on " << m.str() << " rank " << r);
    REQUIRE(got.size() == 1);
    CHECK(same_bits(to_local(got[0].second), want));
    // For each piece of the rank's shard and each chunk it overlaps, the whole rows of the stripes
    // the overlap touches are read (to check their CRC-32), and nothing else.
    const LocalLayout layout = local_layout(global.shape(), placements, mesh, Shape(coords_of(r, mesh)));
    uint64_t want_bytes = 0;
    for (const ChunkBox& c : reader.index().find("model", "w")->chunks)
      for (const ShardPiece& p : layout.pieces) {
        bool overlap = true;
        for (int d = 0; d < 2; ++d)
          overlap = overlap && std::max(p.global_offset[d], c.offsets[d]) <
                                   std::min(p.global_offset[d] + p.sizes[d], c.offsets[d] + c.sizes[d]);
        if (!overlap) continue;
        const int64_t a = std::max(p.global_offset[0], c.offsets[0]) - c.offsets[0];
        const int64_t b = std::min(p.global_offset[0] + p.sizes[0], c.offsets[0] + c.sizes[0]) - c.offsets[0];
        const int64_t rows = std::min(c.sizes[0], (b - 1) / c.stripe_rows * c.stripe_rows + c.stripe_rows) -
                             a / c.stripe_rows * c.stripe_rows;
        want_bytes += static_cast<uint64_t>(rows * c.sizes[1] * 4);
      }
    CHECK(reader.bytes_read() == want_bytes);
    bool row_stripes = true;
    for (const ChunkBox& c : reader.index().find("model", "w")->chunks) row_stripes = row_stripes && c.stripe_rows == 1;
    if (row_stripes) {  // stripes of one row and boxes of whole rows: exactly the rank's own boxes
      bool whole_rows = true;
      for (const ShardPiece& p : layout.pieces) whole_rows = whole_rows && p.sizes[1] == global.shape()[1];
      if (whole_rows) CHECK(reader.bytes_read() == static_cast<uint64_t>(want.numel() * 4));
    }
  }
}

}  // namespace

TEST_CASE("sharded checkpoint: saved under one plan, loaded under others, bit for bit", "[cpu]") {
  const Tensor global = arange(0.0, 7.0 * 6, 1.0, DType::kF32).reshape({7, 6});
  struct Layout {
    Shape mesh;
    Placements placements;
  };
  const std::vector<Layout> layouts = {
      {{2, 2}, {Placement::shard(0), Placement::replicate()}},
      {{2, 2}, {Placement::shard(1), Placement::shard(0)}},
      {{4}, {Placement::shard(0)}},  // 7 over 4: 2, 2, 2, 1
      {{3}, {Placement::shard(1)}},
      {{2}, {Placement::replicate()}},
      {{2}, {Placement::interleaved_shard(1, 2)}},  // two boxes per rank
      {{2}, {Placement::ragged_shard(0, {3, 4})}},
      {{1}, {Placement::replicate()}},
  };
  // Stripes of 1 MiB (one per chunk here) and of one 24-byte row.
  for (const int64_t stripe_bytes : {kStripeBytes, int64_t{24}})
  for (const Layout& from : layouts) {
    mt::testing::TempDir dir;
    const ShardedIndex ix = save(dir.path.string(), global, from.mesh, from.placements, stripe_bytes);
    const IndexedTensor* w = ix.find("model", "w");
    REQUIRE(w);
    CHECK(w->shape == global.shape());
    CHECK(w->placements == placements_str(from.placements));
    for (const Layout& to : layouts) check_load(dir.path.string(), global, to.mesh, to.placements);
    ShardedCheckpointReader reader(dir.path.string());
    CHECK(same_bits(reader.read_full(*w), global));
    CHECK(reader.read_full(*ix.find("optimizer", "step")).item() == 3);
  }
}

TEST_CASE("sharded checkpoint: a corrupt stripe is found by a load that reads part of its chunk", "[cpu]") {
  const Tensor global = arange(0.0, 8.0 * 6, 1.0, DType::kF32).reshape({8, 6});
  mt::testing::TempDir dir;
  const ShardedIndex ix = save(dir.path.string(), global, {2}, {Placement::shard(0)}, 24);  // 1-row stripes
  const ChunkBox& c0 = ix.find("model", "w")->chunks[0];  // rows 0..3, in shard 0
  REQUIRE(c0.stripe_crc32.size() == 4);
  const std::string file = (fs::path(dir.path) / c0.file).string();
  uint64_t at = 0;
  {
    SafetensorsReader r(file);
    std::ifstream in(file, std::ios::binary);
    uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), 8);
    at = 8 + header + r.find(c0.key)->begin + 1 * 24 + 5;  // a byte of row 1
  }
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&b, 1);
  }
  // Under S(0) over 4, rank 0 reads rows 0..1 (part of chunk 0): the corrupt stripe is named.
  // Rank 1 reads rows 2..3 of the same chunk, whose stripes are intact.
  auto load_rank = [&](int64_t r) {
    DeviceMesh m = DeviceMesh::simulated({4}, names_for({4}), coords_of(r, {4}));
    Tensor live = from_local(zeros({2, 6}, DType::kF32), m, {Placement::shard(0)}, global.shape());
    ShardedCheckpointReader reader(dir.path.string());
    return reader.load_like("model", {{"w", live}});
  };
  CHECK_THROWS_WITH(load_rank(0), Contains(c0.file) && Contains("tensor 'w'") &&
                                      Contains("stripe 1 (rows 1..1), has CRC-32") && Contains("the file is corrupt"));
  CHECK(same_bits(to_local(load_rank(1)[0].second), global.slice(0, 2, 4)));
}

TEST_CASE("sharded checkpoint: a tensor is sized by the chunks its files hold, not by index.json alone", "[cpu]") {
  // An index that says a tensor (and its one chunk) has 2^40 elements: the chunk's shape in the
  // file is checked before anything is allocated (this was a 4 TiB allocation).
  const Tensor global = arange(0.0, 8.0, 1.0, DType::kF32).reshape({4, 2});
  mt::testing::TempDir dir;
  save(dir.path.string(), global, {1}, {Placement::replicate()});
  const fs::path index = fs::path(dir.path) / kShardedIndexFile;
  std::ifstream in(index);
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  for (auto& t : j["tensors"])
    if (t["name"] == "w") {
      t["shape"] = {int64_t{1} << 39, 2};
      t["chunks"][0]["sizes"] = t["shape"];
      t["chunks"][0].erase("stripe_rows");
      t["chunks"][0].erase("stripe_crc32");
    }
  std::ofstream(index.string()) << j.dump();
  ShardedCheckpointReader reader(dir.path.string());
  CHECK_THROWS_WITH(reader.read_full(*reader.index().find("model", "w")),
                    Contains("tensor 'w'") && Contains("is f32 [4, 2] in") &&
                        Contains("but the index says f32 [549755813888, 2]"));
}

TEST_CASE("sharded checkpoint: replicated chunks are written once, spread over the replicas", "[cpu]") {
  const Tensor global = arange(0.0, 8.0 * 4, 1.0, DType::kF32).reshape({8, 4});
  mt::testing::TempDir dir;
  // [S(0), R] on 2x2: two boxes, each held by two ranks, written once.
  ShardedIndex ix = save(dir.path.string(), global, {2, 2}, {Placement::shard(0), Placement::replicate()});
  CHECK(ix.find("model", "w")->chunks.size() == 2);
  // Fully replicated tensors over 4 ranks: one chunk each; over many names, every rank writes some.
  std::set<std::string> writers;
  for (int i = 0; i < 16; ++i) {
    const std::string name = fmt::format("t{}", i);
    for (int64_t r = 0; r < 4; ++r) {
      DeviceMesh m = DeviceMesh::simulated({4}, {"dp"}, {r});
      ShardSnapshot s = snapshot_shard({{"model", {{name, from_local(global, m, {Placement::replicate()}, global.shape())}}}},
                                       r, 4, m.str());
      if (!s.chunks.empty()) writers.insert(s.file);
      CHECK(s.part.tensors.at(0).chunks.size() <= 1);
    }
  }
  CHECK(writers.size() == 4);
}

TEST_CASE("sharded checkpoint: pipeline stages write their own tensors, a shared one once", "[cpu]") {
  // World [pp=2, dp=2]: stage s is world ranks 2s, 2s+1, its mesh [dp=2]. Each stage holds its
  // layer (a DTensor sharded over dp) and its norm (plain, replicated over the stage); both hold
  // the optimizer's step (plain) and a tied weight (replicated DTensor), which stage 0 writes.
  const Tensor layer0 = arange(0.0, 6.0 * 4, 1.0, DType::kF32).reshape({6, 4});
  const Tensor layer1 = add(layer0, 100.0), norm0 = arange(0.0, 4.0, 1.0, DType::kF32), norm1 = add(norm0, 10.0);
  const Tensor tied = arange(0.0, 5.0 * 2, 1.0, DType::kF32).reshape({5, 2});
  const Tensor step = scalar_tensor(7, DType::kI64);
  mt::testing::TempDir dir;
  std::vector<ShardedIndex> parts;
  int64_t chunks_written = 0;
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t stage = r / 2, dp = r % 2;
    DeviceMesh m = DeviceMesh::simulated({2}, {"dp"}, {dp});
    const Tensor& layer = stage == 0 ? layer0 : layer1;
    Tensor w = from_local(local_shard(layer, {Placement::shard(0)}, {2}, Shape{dp}), m, {Placement::shard(0)},
                          layer.shape());
    Tensor t = from_local(tied, m, {Placement::replicate()}, tied.shape());
    const std::string ln = fmt::format("layers.{}.w", stage), nn = fmt::format("norm.{}", stage);
    SnapshotScope scope;
    scope.plain_index = dp;
    scope.plain_size = 2;
    if (stage == 1) scope.written_elsewhere = {"model/tied", "optimizer/step"};
    ShardSnapshot s = snapshot_shard({{"model", {{ln, w}, {nn, stage == 0 ? norm0 : norm1}, {"tied", t}}},
                                      {"optimizer", {{"step", step}}}},
                                     r, 4, "[pp=2, dp=2]", scope);
    chunks_written += static_cast<int64_t>(s.chunks.size());
    write_shard(s, dir.path.string());
    parts.push_back(read_sharded_index((dir.path / chunk_list_name(s.file)).string(), false));
  }
  // Every box once: 2 layers x 2 dp shards, 2 norms, the tied weight and the step.
  CHECK(chunks_written == 8);
  const ShardedIndex ix = merge_indexes(parts, dir.path.string());  // checks that every tensor is tiled
  const std::string text = index_to_json(ix);
  write_file_atomically((dir.path / kShardedIndexFile).string(), [&](std::ostream& o) { o << text; });
  ShardedCheckpointReader reader(dir.path.string());
  CHECK(same_bits(reader.read_full(*ix.find("model", "layers.0.w")), layer0));
  CHECK(same_bits(reader.read_full(*ix.find("model", "layers.1.w")), layer1));
  CHECK(same_bits(reader.read_full(*ix.find("model", "norm.0")), norm0));
  CHECK(same_bits(reader.read_full(*ix.find("model", "norm.1")), norm1));
  CHECK(same_bits(reader.read_full(*ix.find("model", "tied")), tied));
  CHECK(reader.read_full(*ix.find("optimizer", "step")).item() == 7);
  // Without a scope a DTensor on part of the world is refused, naming it.
  DeviceMesh m = DeviceMesh::simulated({2}, {"dp"}, {0});
  CHECK_THROWS_WITH(snapshot_shard({{"model", {{"tied", from_local(tied, m, {Placement::replicate()}, tied.shape())}}}},
                                   0, 4, "[dp=2]"),
                    Contains("'tied'") && Contains("whole world"));
}

TEST_CASE("sharded checkpoint: bad indexes name the file and the tensor", "[cpu]") {
  IndexedTensor t;
  t.name = "w";
  t.shape = Shape{4, 4};
  t.chunks = {{{0, 0}, {2, 4}, "f", "k0", "", 0, {}}, {{2, 0}, {2, 3}, "f", "k1", "", 0, {}}};
  CHECK_THROWS_WITH(check_tiling(t, "ix.json"), Contains("ix.json") && Contains("'w'") && Contains("cover only 14"));
  t.chunks[1].sizes = Shape{2, 4};
  CHECK_NOTHROW(check_tiling(t, "ix.json"));
  t.chunks[1].offsets = Shape{1, 0};
  CHECK_THROWS_WITH(check_tiling(t, "ix.json"), Contains("overlaps"));
  t.chunks[1].offsets = Shape{3, 0};
  CHECK_THROWS_WITH(check_tiling(t, "ix.json"), Contains("leaves the tensor"));
  CHECK_THROWS_WITH(index_from_json("{\"format\": \"other\"}", "ix.json"), Contains("ix.json") && Contains("format"));
  // An offset near 2^63 must not wrap around the bounds check (it used to pass it, leaving rows
  // 2..3 unread by the loader).
  t.chunks[1].offsets = Shape{std::numeric_limits<int64_t>::max(), 0};
  CHECK_THROWS_WITH(check_tiling(t, "ix.json"), Contains("ix.json") && Contains("'w'") && Contains("leaves the tensor"));
  t.chunks[1].offsets = Shape{2, 0};
  t.chunks[1].sizes = Shape{std::numeric_limits<int64_t>::max(), 4};
  CHECK_THROWS_WITH(check_tiling(t, "ix.json"), Contains("leaves the tensor"));
}

TEST_CASE("sharded checkpoint: an index's bad fields are named, with their tensor", "[cpu]") {
  ShardedIndex ix;
  ix.world_size = 2;
  ix.mesh = "[dp=2]";
  IndexedTensor t;
  t.group = "model";
  t.name = "w";
  t.shape = Shape{2, 3};
  t.dtype = DType::kF32;
  t.placements = "[S(0)]";
  t.chunks = {{{0, 0}, {2, 3}, "shard-00000-of-00002.safetensors", "model/w@0,0", "00000000", 0, {}}};
  ix.tensors = {t};
  const nlohmann::json good = nlohmann::json::parse(index_to_json(ix));
  CHECK_NOTHROW(index_from_json(good.dump(), "ix.json"));
  auto bad = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return j.dump();
  };
  CHECK_THROWS_WITH(index_from_json(bad([](auto& j) { j.erase("mesh"); }), "ix.json"),
                    Contains("ix.json: the index: field 'mesh' is missing (required)"));
  CHECK_THROWS_WITH(index_from_json(bad([](auto& j) { j["world_size"] = 0; }), "ix.json"),
                    Contains("ix.json: the index: field 'world_size' must be an integer >= 1, got 0"));
  CHECK_THROWS_WITH(index_from_json(bad([](auto& j) { j["world_size"] = "2"; }), "ix.json"),
                    Contains("field 'world_size' must be an integer, got \"2\""));
  CHECK_THROWS_WITH(index_from_json(bad([](auto& j) { j["tensors"][0]["dtype"] = 5; }), "ix.json"),
                    Contains("ix.json: tensor 'w': field 'dtype' must be a string, got 5"));
  CHECK_THROWS_WITH(index_from_json(bad([](auto& j) { j["tensors"][0]["chunks"][0]["file"] = nullptr; }), "ix.json"),
                    Contains("ix.json: tensor 'w': a chunk: field 'file' is missing (required)"));
  // A shape whose element or byte count overflows 64 bits is refused before any count is formed.
  CHECK_THROWS_WITH(index_from_json(bad([](auto& j) {
                                      j["tensors"][0]["shape"] = {int64_t{1} << 32, (int64_t{1} << 32) + 1};
                                      j["tensors"][0]["chunks"][0]["sizes"] = j["tensors"][0]["shape"];
                                    }),
                                    "ix.json"),
                    Contains("ix.json: tensor 'w': 'shape' [4294967296,4294967297] holds more elements"));
  CHECK_THROWS_WITH(index_from_json(bad([](auto& j) { j["tensors"][0]["shape"] = {int64_t{1} << 61, 0}; }), "ix.json"),
                    Contains("'shape' [2305843009213693952,0] holds more elements"));
  // A chunk's key names its own tensor and offsets: an entry pointing at another tensor's chunk
  // (the two entries' chunk lists swapped) would load that tensor's values.
  CHECK_THROWS_WITH(index_from_json(bad([](auto& j) { j["tensors"][0]["chunks"][0]["key"] = "model/v@0,0"; }), "ix.json"),
                    Contains("ix.json: tensor 'w': the chunk at offsets [0, 0] has key 'model/v@0,0', expected "
                             "'model/w@0,0': the index points at another tensor's chunk"));
  CHECK_THROWS_WITH(index_from_json(bad([](auto& j) { j["tensors"][0]["chunks"][0]["key"] = std::string(1000, 'k'); }),
                                    "ix.json"),
                    Contains("has key 'kkkk") && Contains("...', expected"));
  // A hostile value is cut short in the message, not copied whole.
  const std::string long_name(100000, 'x');
  try {
    index_from_json(bad([&](auto& j) { j["tensors"][0]["name"] = nlohmann::json::array({long_name}); }), "ix.json");
    FAIL("a list as the tensor name was accepted");
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("ix.json: a tensor: field 'name' must be a string, got [\"xxx") && Contains("..."));
    CHECK(msg.size() < 400);
  }
}
