// Sharded checkpoint loading: boxes of tensors read from the chunks that overlap them
// (shard_reader.h).
#include "checkpoint/shard_reader.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "mesh/dtensor.h"
#include "mesh/shard_layout.h"
#include "runtime/error.h"
#include "tensor/autograd.h"

namespace mt {

namespace fs = std::filesystem;

ShardedCheckpointReader::ShardedCheckpointReader(const std::string& step_dir)
    : dir_(step_dir), index_path_((fs::path(step_dir) / kShardedIndexFile).string()) {
  index_ = read_sharded_index(index_path_);
}

SafetensorsReader& ShardedCheckpointReader::file(const std::string& name, const std::string& tensor) {
  auto it = files_.find(name);
  if (it != files_.end()) return *it->second;
  const std::string path = (fs::path(dir_) / name).string();
  std::error_code ec;
  MT_CHECK(fs::exists(path, ec), "{}: tensor '{}': its chunk file {} does not exist", index_path_, tensor, path);
  auto r = std::make_unique<SafetensorsReader>(path);
  return *files_.emplace(name, std::move(r)).first->second;
}

uint64_t ShardedCheckpointReader::bytes_read() const {
  uint64_t n = 0;
  for (const auto& [name, r] : files_) n += r->bytes_read();
  return n;
}

SafetensorsReader& ShardedCheckpointReader::checked_chunk(const IndexedTensor& t, const ChunkBox& c) {
  SafetensorsReader& f = file(c.file, t.name);
  const SafetensorsEntry* e = f.find(c.key);
  MT_CHECK(e, "{}: tensor '{}': chunk '{}' (at {}) is not in {}", index_path_, t.name, c.key, c.offsets, f.path());
  MT_CHECK(e->shape == c.sizes && e->dtype == t.dtype,
           "{}: tensor '{}': chunk '{}' is {} {} in {} but the index says {} {}", index_path_, t.name, c.key,
           e->dtype, e->shape, f.path(), t.dtype, c.sizes);
  return f;
}

Tensor ShardedCheckpointReader::read_striped(SafetensorsReader& f, const IndexedTensor& t, const ChunkBox& c,
                                             const Shape& in_chunk, const Shape& sizes) {
  // The whole rows of the stripes the box touches, read in one piece and checked stripe by stripe;
  // the box is a view of them.
  const int nd = c.sizes.size();
  const int64_t rows = c.sizes[0], per = c.stripe_rows;
  const int64_t first = in_chunk[0] / per, last = (in_chunk[0] + sizes[0] - 1) / per;  // sizes[0] > 0
  const int64_t a = first * per, b = std::min(rows, (last + 1) * per);
  Shape off(std::vector<int64_t>(static_cast<size_t>(nd), 0)), span = c.sizes;
  off[0] = a;
  span[0] = b - a;
  Tensor striped = f.read_block(c.key, off, span);
  const int64_t row_bytes = striped.numel() / (b - a) * dtype_size(striped.dtype());
  const auto* p = static_cast<const uint8_t*>(striped.data_ptr());
  for (int64_t s = first; s <= last; ++s) {
    const int64_t r0 = s * per, n = std::min(per, rows - r0);
    const std::string crc =
        fmt::format("{:08x}", crc32_update(0, p + (r0 - a) * row_bytes, static_cast<size_t>(n * row_bytes)));
    MT_CHECK(crc == c.stripe_crc32[static_cast<size_t>(s)],
             "{}: tensor '{}': chunk '{}', stripe {} (rows {}..{}), has CRC-32 {} but the index records {} (the "
             "file is corrupt)",
             f.path(), t.name, c.key, s, r0, r0 + n - 1, crc, c.stripe_crc32[static_cast<size_t>(s)]);
  }
  Shape at = in_chunk;
  at[0] -= a;
  return block_view(striped, at, sizes);
}


void ShardedCheckpointReader::read_box(const IndexedTensor& t, const Shape& offsets, Tensor dst) {
  NoGradGuard no_grad;
  const int nd = t.shape.size();
  MT_CHECK(dst.shape().size() == nd, "{}: tensor '{}' has {} dims, the box {}", index_path_, t.name, nd,
           dst.shape().size());
  for (const ChunkBox& c : t.chunks) {
    std::vector<int64_t> lo(static_cast<size_t>(nd)), sz(static_cast<size_t>(nd));
    bool empty_overlap = false;
    for (int d = 0; d < nd; ++d) {
      const int64_t a = std::max(offsets[d], c.offsets[d]);
      const int64_t b = std::min(offsets[d] + dst.shape()[d], c.offsets[d] + c.sizes[d]);
      if (b <= a) empty_overlap = true;
      lo[d] = a;
      sz[d] = b - a;
    }
    if (empty_overlap) continue;
    SafetensorsReader& f = checked_chunk(t, c);
    Shape in_chunk(std::vector<int64_t>(static_cast<size_t>(nd))), in_dst(std::vector<int64_t>(static_cast<size_t>(nd)));
    for (int d = 0; d < nd; ++d) {
      in_chunk[d] = lo[d] - c.offsets[d];
      in_dst[d] = lo[d] - offsets[d];
    }
    Tensor block;
    if (c.stripe_rows > 0 && nd > 0) {
      block = read_striped(f, t, c, in_chunk, Shape(sz));
    } else {  // a checkpoint without stripes: only a chunk read whole can be checked
      block = f.read_block(c.key, in_chunk, Shape(sz));
      if (!c.crc32.empty() && block.shape() == c.sizes) {
        const auto bytes = static_cast<size_t>(block.numel() * dtype_size(block.dtype()));
        const std::string crc = fmt::format("{:08x}", crc32_update(0, block.data_ptr(), bytes));
        MT_CHECK(crc == c.crc32, "{}: tensor '{}': chunk '{}' has CRC-32 {} but the index records {} (the file is "
                 "corrupt)", f.path(), t.name, c.key, crc, c.crc32);
      }
    }
    Tensor view = block_view(dst, in_dst, Shape(sz));
    view.copy_(block.dtype() == dst.dtype() ? block : block.to(dst.dtype()));
  }
}

Tensor ShardedCheckpointReader::read_full(const IndexedTensor& t) {
  // Every chunk is found in its file with the index's shape before the tensor is allocated: the
  // chunks tile it (checked with the index), so its size is that of data the files really hold,
  // not a number a damaged index.json made up.
  for (const ChunkBox& c : t.chunks) checked_chunk(t, c);
  Tensor out = empty(t.shape, t.dtype);
  read_box(t, Shape(std::vector<int64_t>(static_cast<size_t>(t.shape.size()), 0)), out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> ShardedCheckpointReader::load_like(
    const std::string& group, const std::vector<std::pair<std::string, Tensor>>& live,
    const std::set<std::string>* whole) {
  std::vector<std::string> missing, extra;
  std::set<std::string> wanted;
  for (const auto& [name, l] : live) {
    wanted.insert(name);
    if (!index_.find(group, name)) missing.push_back(name);
  }
  if (!whole) whole = &wanted;
  for (const auto& t : index_.tensors)
    if (t.group == group && !whole->count(t.name)) extra.push_back(t.name);
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 8; ++i) {
      if (i > 0) s += ", ";
      s += v[i];
    }
    if (v.size() > 8) s += fmt::format(", ... ({} more)", v.size() - 8);
    return s;
  };
  MT_CHECK(missing.empty() && extra.empty(), "{}: the {} tensors do not match this model:{}{} (a checkpoint of "
           "another model?)", index_path_, group, missing.empty() ? "" : " missing " + list(missing),
           extra.empty() ? "" : " unexpected " + list(extra));
  NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, l] : live) {
    const IndexedTensor& t = *index_.find(group, name);
    // Floating values convert between widths (a bf16 checkpoint into f32 weights); integer codes or
    // flags read as floats (or floats as codes) would load garbage without a word.
    MT_CHECK(is_floating(t.dtype) == is_floating(l.dtype()),
             "{}: tensor '{}' is {} in the checkpoint but {} in this model ({} values cannot stand for {} ones)",
             index_path_, name, t.dtype, l.dtype(), is_floating(t.dtype) ? "floating" : "integer",
             is_floating(l.dtype()) ? "floating" : "integer");
    if (!l.is_distributed()) {
      MT_CHECK(t.shape == l.shape(), "{}: tensor '{}' has shape {} but this model's is {}", index_path_, name,
               t.shape, l.shape());
      Tensor full = read_full(t);
      out.emplace_back(name, full.dtype() == l.dtype() ? full : full.to(l.dtype()));
      continue;
    }
    const DTensorSpec& spec = dtensor_spec(l, "checkpoint load");
    MT_CHECK(t.shape == spec.global_shape(), "{}: tensor '{}' has shape {} but this model's is {}", index_path_, name,
             t.shape, spec.global_shape());
    const LocalLayout layout =
        local_layout(spec.global_shape(), spec.placements(), spec.mesh().shape(), Shape(spec.mesh().coordinates()));
    Tensor local = empty(layout.local_shape, l.dtype());
    for (const ShardPiece& p : layout.pieces)
      read_box(t, p.global_offset, block_view(local, p.local_offset, p.sizes));
    out.emplace_back(name, from_local(local, spec.mesh(), spec.placements(), spec.global_shape()));
  }
  return out;
}

}  // namespace mt
