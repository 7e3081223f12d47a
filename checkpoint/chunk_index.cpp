// index.json of sharded checkpoints: JSON form, validation and the tiling check (chunk_index.h).
#include "checkpoint/chunk_index.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/json_io.h"
#include "models/safetensors.h"
#include "runtime/error.h"

namespace mt {

using ordered_json = nlohmann::ordered_json;
using json = nlohmann::json;

namespace {

DType dtype_of_name(const std::string& s, const std::string& path, const std::string& tensor) {
  for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8,
                  DType::kBool})
    if (s == safetensors_dtype_name(d)) return d;
  MT_FAIL("{}: tensor '{}': unknown dtype '{}'", path, tensor, s);
}

Shape dims_of(const json& j, const std::string& path, const std::string& tensor, const char* field) {
  MT_CHECK(j.is_array(), "{}: tensor '{}': '{}' must be an array of integers, got {}", path, tensor, field,
           json_brief(j));
  std::vector<int64_t> v;
  for (const auto& d : j) {
    MT_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0,
             "{}: tensor '{}': '{}' must hold non-negative integers, got {}", path, tensor, field, json_brief(j));
    v.push_back(d.get<int64_t>());
  }
  MT_CHECK(v.size() <= static_cast<size_t>(kMaxDims), "{}: tensor '{}': '{}' has {} dims", path, tensor, field,
           v.size());
  // Every later count (elements, bytes, a chunk's end) stays below 2^63 when the product does.
  int64_t n = 1, bytes = 0;
  for (int64_t d : v)
    MT_CHECK(checked_mul(n, std::max<int64_t>(d, 1), &n) && checked_mul(n, 8, &bytes),
             "{}: tensor '{}': '{}' {} holds more elements than a 64-bit size can count", path, tensor, field,
             json_brief(j));
  return Shape(v);
}

bool boxes_overlap(const ChunkBox& a, const ChunkBox& b) {
  for (int d = 0; d < a.offsets.size(); ++d)
    if (a.offsets[d] + a.sizes[d] <= b.offsets[d] || b.offsets[d] + b.sizes[d] <= a.offsets[d]) return false;
  return true;
}

bool box_less(const ChunkBox& a, const ChunkBox& b) { return a.offsets.vec() < b.offsets.vec(); }

}  // namespace

const IndexedTensor* ShardedIndex::find(const std::string& group, const std::string& name) const {
  for (const auto& t : tensors)
    if (t.group == group && t.name == name) return &t;
  return nullptr;
}

std::string shard_file_name(int64_t rank, int64_t world) {
  return fmt::format("shard-{:05d}-of-{:05d}.safetensors", rank, world);
}

std::string chunk_key(const std::string& group, const std::string& name, const Shape& offsets) {
  std::string k = group + "/" + name + "@";
  for (int d = 0; d < offsets.size(); ++d) {
    if (d > 0) k += ',';
    k += std::to_string(offsets[d]);
  }
  return k;
}

void check_tiling(const IndexedTensor& t, const std::string& path) {
  int64_t covered = 0;
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const ChunkBox& c = t.chunks[i];
    MT_CHECK(c.offsets.size() == t.shape.size() && c.sizes.size() == t.shape.size(),
             "{}: tensor '{}' of shape {}: chunk {} in {} has offsets {} and sizes {} (wrong number of dims)", path,
             t.name, t.shape, i, c.file, c.offsets, c.sizes);
    int64_t n = 1;
    for (int d = 0; d < t.shape.size(); ++d) {
      MT_CHECK(c.offsets[d] <= t.shape[d] && c.sizes[d] <= t.shape[d] - c.offsets[d],
               "{}: tensor '{}' of shape {}: chunk at {} of sizes {} in {} leaves the tensor", path, t.name, t.shape,
               c.offsets, c.sizes, c.file);
      n *= c.sizes[d];
    }
    MT_CHECK(n > 0, "{}: tensor '{}': chunk at {} in {} is empty", path, t.name, c.offsets, c.file);
    for (size_t j = 0; j < i; ++j)
      MT_CHECK(!boxes_overlap(c, t.chunks[j]),
               "{}: tensor '{}': chunk at {} of sizes {} in {} overlaps chunk at {} of sizes {} in {}", path, t.name,
               c.offsets, c.sizes, c.file, t.chunks[j].offsets, t.chunks[j].sizes, t.chunks[j].file);
    covered += n;
  }
  MT_CHECK(covered == t.shape.numel(),
           "{}: tensor '{}' of shape {} ({} elements): its {} chunks cover only {} elements (a hole: a chunk is "
           "missing)", path, t.name, t.shape, t.shape.numel(), t.chunks.size(), covered);
}

std::string index_to_json(const ShardedIndex& index) {
  ordered_json j;
  j["format"] = kShardedIndexFormat;
  j["world_size"] = index.world_size;
  j["mesh"] = index.mesh;
  ordered_json tensors = ordered_json::array();
  for (const auto& t : index.tensors) {
    ordered_json e;
    e["group"] = t.group;
    e["name"] = t.name;
    e["shape"] = t.shape.vec();
    e["dtype"] = safetensors_dtype_name(t.dtype);
    e["placements"] = t.placements;
    ordered_json chunks = ordered_json::array();
    for (const auto& c : t.chunks) {
      ordered_json cj;
      cj["offsets"] = c.offsets.vec();
      cj["sizes"] = c.sizes.vec();
      cj["file"] = c.file;
      cj["key"] = c.key;
      cj["crc32"] = c.crc32;
      if (c.stripe_rows > 0) {
        cj["stripe_rows"] = c.stripe_rows;
        cj["stripe_crc32"] = c.stripe_crc32;
      }
      chunks.push_back(std::move(cj));
    }
    e["chunks"] = std::move(chunks);
    tensors.push_back(std::move(e));
  }
  j["tensors"] = std::move(tensors);
  return j.dump(1) + "\n";
}

ShardedIndex index_from_json(const std::string& text, const std::string& path, bool check) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    MT_FAIL("{}: not valid JSON: {}", path, e.what());
  }
  MT_CHECK(j.is_object(), "{}: the index must be a JSON object", path);
  const JsonFields index(j, fmt::format("{}: the index", path));
  const std::string format = index.string_at("format");
  MT_CHECK(format == kShardedIndexFormat, "{}: field 'format' must be \"{}\", got \"{}\"", path, kShardedIndexFormat,
           format);
  ShardedIndex out;
  out.world_size = index.int_at("world_size", 1);
  out.mesh = index.string_at("mesh");
  const json& tensors = index.at("tensors");
  MT_CHECK(tensors.is_array(), "{}: field 'tensors' must be an array", path);
  for (const auto& e : tensors) {
    MT_CHECK(e.is_object(), "{}: each entry of 'tensors' must be an object, got {}", path, json_brief(e));
    IndexedTensor t;
    t.name = JsonFields(e, fmt::format("{}: a tensor", path)).string_at("name");
    const JsonFields tf(e, fmt::format("{}: tensor '{}'", path, t.name));
    t.group = tf.string_at("group");
    t.shape = dims_of(tf.at("shape"), path, t.name, "shape");
    t.dtype = dtype_of_name(tf.string_at("dtype"), path, t.name);
    t.placements = tf.string_at("placements");
    const json& chunks = tf.at("chunks");
    MT_CHECK(chunks.is_array(), "{}: tensor '{}': 'chunks' must be an array", path, t.name);
    for (const auto& cj : chunks) {
      MT_CHECK(cj.is_object(), "{}: tensor '{}': each chunk must be an object", path, t.name);
      const JsonFields cf(cj, fmt::format("{}: tensor '{}': a chunk", path, t.name));
      ChunkBox c;
      c.offsets = dims_of(cf.at("offsets"), path, t.name, "offsets");
      c.sizes = dims_of(cf.at("sizes"), path, t.name, "sizes");
      c.file = cf.string_at("file");
      c.key = cf.string_at("key");
      c.crc32 = cf.string_at("crc32");
      if (cf.has("stripe_rows")) {
        c.stripe_rows = cf.int_at("stripe_rows", 1);
        const json& stripes = cf.at("stripe_crc32");
        const int64_t rows = c.sizes.size() > 0 ? c.sizes[0] : 1;
        const int64_t want = rows == 0 ? 0 : (rows - 1) / c.stripe_rows + 1;  // no overflow
        MT_CHECK(stripes.is_array() && static_cast<int64_t>(stripes.size()) == want,
                 "{}: tensor '{}': chunk '{}': 'stripe_crc32' must list {} CRCs ({} rows in stripes of {}), got {}",
                 path, t.name, c.key, want, rows, c.stripe_rows, json_brief(stripes));
        for (const json& h : stripes) {
          MT_CHECK(h.is_string() && h.get_ref<const std::string&>().size() == 8,
                   "{}: tensor '{}': chunk '{}': each 'stripe_crc32' entry must be 8 hex digits, got {}", path,
                   t.name, c.key, json_brief(h));
          c.stripe_crc32.push_back(h.get<std::string>());
        }
      }
      MT_CHECK(!c.file.empty() && c.file.find('/') == std::string::npos && c.file != "." && c.file != "..",
               "{}: tensor '{}': chunk file '{}' must be a file name in the step directory", path, t.name, c.file);
      t.chunks.push_back(std::move(c));
    }
    MT_CHECK(!out.find(t.group, t.name), "{}: tensor '{}' of group '{}' appears twice", path, t.name, t.group);
    if (check) check_tiling(t, path);
    // A chunk's key names its tensor and offsets (chunk_key): an entry that points at another
    // tensor's chunk (a mis-merged or edited index) would load that tensor's values, CRCs and all.
    for (const ChunkBox& c : t.chunks) {
      const std::string key = chunk_key(t.group, t.name, c.offsets);
      MT_CHECK(c.key == key, "{}: tensor '{}': the chunk at offsets {} has key '{}', expected '{}': the index points "
               "at another tensor's chunk (a damaged or mis-merged index)", path, t.name, c.offsets,
               c.key.size() <= 120 ? c.key : c.key.substr(0, 117) + "...", key);
    }
    out.tensors.push_back(std::move(t));
  }
  return out;
}

ShardedIndex read_sharded_index(const std::string& path, bool check) {
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), "cannot read the sharded checkpoint index {}", path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return index_from_json(text, path, check);
}

ShardedIndex merge_indexes(const std::vector<ShardedIndex>& parts, const std::string& what) {
  MT_CHECK(!parts.empty(), "{}: no chunk lists to merge", what);
  ShardedIndex out;
  out.world_size = parts[0].world_size;
  out.mesh = parts[0].mesh;
  // In the order of the first list (every rank lists every tensor, in the order saved).
  std::map<std::pair<std::string, std::string>, size_t> position;
  for (const auto& p : parts)
    for (const auto& t : p.tensors) {
      auto [it, fresh] = position.try_emplace({t.group, t.name}, out.tensors.size());
      if (fresh) {
        out.tensors.push_back(t);
        continue;
      }
      IndexedTensor& have = out.tensors[it->second];
      MT_CHECK(have.shape == t.shape && have.dtype == t.dtype,
               "{}: tensor '{}' is {} {} on one rank and {} {} on another", what, t.name, have.shape, have.dtype,
               t.shape, t.dtype);
      for (const auto& c : t.chunks) have.chunks.push_back(c);
    }
  for (auto& t : out.tensors) {
    std::sort(t.chunks.begin(), t.chunks.end(), box_less);
    check_tiling(t, what);
  }
  return out;
}

}  // namespace mt
