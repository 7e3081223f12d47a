// Sharded checkpoint saving: which boxes a rank writes, their host copies, the shard file
// (shard_writer.h).
#include "checkpoint/shard_writer.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "mesh/dtensor.h"
#include "mesh/shard_layout.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "tensor/autograd.h"

namespace mt {

namespace {

// FNV-1a: the same on every rank and every build (std::hash promises neither).
uint64_t stable_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

Tensor host_copy(const Tensor& view) {
  Tensor c = empty(view.shape(), view.dtype());
  c.copy_(view);
  return c;
}

}  // namespace

std::string chunk_list_name(const std::string& shard_file) { return shard_file + ".chunks.json"; }

ShardSnapshot snapshot_shard(const std::vector<TensorGroup>& groups, int64_t rank, int64_t world,
                             const std::string& mesh, const SnapshotScope& scope) {
  const bool staged = scope.plain_size > 0;
  NoGradGuard no_grad;
  ShardSnapshot s;
  s.file = shard_file_name(rank, world);
  s.part.world_size = world;
  s.part.mesh = mesh;
  auto add_chunk = [&](IndexedTensor& it, const Shape& offsets, const Tensor& view) {
    if (view.numel() == 0) return;
    ChunkBox c;
    c.offsets = offsets;
    c.sizes = view.shape();
    c.file = s.file;
    c.key = chunk_key(it.group, it.name, offsets);
    Tensor h = host_copy(view);
    s.bytes += h.numel() * dtype_size(h.dtype());
    s.chunks.emplace_back(c.key, std::move(h));
    it.chunks.push_back(std::move(c));
  };
  for (const auto& g : groups)
    for (const auto& [name, t] : g.tensors) {
      IndexedTensor it;
      it.group = g.group;
      it.name = name;
      it.dtype = t.dtype();
      const uint64_t h = stable_hash(g.group + "/" + name);
      const bool elsewhere = scope.written_elsewhere.count(g.group + "/" + name) > 0;
      if (!t.is_distributed()) {
        it.shape = t.shape();
        const uint64_t holders = static_cast<uint64_t>(staged ? scope.plain_size : world);
        if (!elsewhere && static_cast<int64_t>(h % holders) == (staged ? scope.plain_index : rank))
          add_chunk(it, Shape(std::vector<int64_t>(static_cast<size_t>(t.dim()), 0)), t.detach());
        s.part.tensors.push_back(std::move(it));
        continue;
      }
      const DTensorSpec& spec = dtensor_spec(t, "checkpoint save");
      const DeviceMesh& m = spec.mesh();
      it.shape = spec.global_shape();
      it.placements = placements_str(spec.placements());
      MT_CHECK(staged || m.size() == world,
               "checkpoint save: tensor '{}' lives on {}, a mesh of {} of the {} ranks; sharded checkpoints need "
               "every DTensor on the whole world", name, m.str(), m.size(), world);
      const std::vector<int64_t> coords = m.coordinates();
      const Shape mshape = m.shape();
      int64_t replicas = 1, replica = 0;
      for (int d = 0; d < mshape.size(); ++d) {
        const Placement& p = spec.placements()[d];
        MT_CHECK(!p.is_partial(), "checkpoint save: tensor '{}' has placements {}: a Partial placement is "
                 "unreduced and cannot be saved", name, it.placements);
        if (p.splits()) continue;
        replica = replica * mshape[d] + coords[d];
        replicas *= mshape[d];
      }
      if (!elsewhere && static_cast<int64_t>(h % static_cast<uint64_t>(replicas)) == replica) {
        const LocalLayout layout = local_layout(spec.global_shape(), spec.placements(), mshape, Shape(coords));
        const Tensor local = to_local(t).detach();
        for (const ShardPiece& p : layout.pieces)
          add_chunk(it, p.global_offset, block_view(local, p.local_offset, p.sizes));
      }
      s.part.tensors.push_back(std::move(it));
    }
  return s;
}

void write_shard(ShardSnapshot& s, const std::string& dir, int64_t stripe_bytes) {
  MT_CHECK(stripe_bytes > 0, "write_shard: stripe_bytes must be positive, got {}", stripe_bytes);
  // Each chunk's stripes of whole rows (about stripe_bytes each), their CRCs, and the chunk's CRC
  // combined from them: the bytes are read once.
  std::map<std::string, const Tensor*> by_key;
  for (const auto& [key, t] : s.chunks) by_key[key] = &t;
  for (auto& it : s.part.tensors)
    for (auto& c : it.chunks) {
      const Tensor& t = *by_key.at(c.key);
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      const int64_t rows = t.dim() > 0 ? t.shape()[0] : 1;
      const int64_t row_bytes = rows > 0 ? t.numel() / rows * dtype_size(t.dtype()) : 0;
      c.stripe_rows = std::max<int64_t>(1, row_bytes > 0 ? stripe_bytes / row_bytes : 1);
      c.stripe_crc32.clear();
      uint32_t whole = 0;
      for (int64_t r = 0; r < rows; r += c.stripe_rows) {
        const auto n = static_cast<size_t>(std::min(c.stripe_rows, rows - r) * row_bytes);
        const uint32_t crc = crc32_update(0, p + r * row_bytes, n);
        c.stripe_crc32.push_back(fmt::format("{:08x}", crc));
        whole = r == 0 ? crc : crc32_combine(whole, crc, n);
      }
      c.crc32 = fmt::format("{:08x}", whole);
    }
  write_safetensors(dir + "/" + s.file, s.chunks, {{"format", "meshtrain-shard"}});
  const std::string list = index_to_json(s.part);
  write_file_atomically(dir + "/" + chunk_list_name(s.file), [&](std::ostream& out) { out << list; });
}

}  // namespace mt
