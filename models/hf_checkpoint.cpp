// Hugging Face checkpoint directories (config.json + safetensors, optionally sharded with an
// index) and the bridge between their tensors and a Module's parameters.
#include "models/hf_checkpoint.h"

#include "models/json_io.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "models/hf_config.h"
#include "models/safetensors.h"
#include "runtime/error.h"

namespace mt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {


constexpr const char* kEmbedName = "model.embed_tokens.weight";
constexpr const char* kLmHeadName = "lm_head.weight";

// "dir/" and "dir" name the same directory; renaming needs the form without the slash.
fs::path normalize_dir(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();
  return p;
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF64: return "float64";
    default: return nullptr;
  }
}

std::string shard_name(size_t i, size_t n) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n); }

bool is_shard_name(const std::string& name) {
  static const std::regex re(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return std::regex_match(name, re);
}

void read_indexed(const fs::path& dir, HfCheckpoint& ck) {
  const fs::path index_path = dir / kHfIndexFile;
  const std::string ip = index_path.string();
  json doc = read_json_file(ip, "checkpoint index");
  MT_CHECK(doc.is_object() && doc.contains("weight_map") && doc["weight_map"].is_object(),
           "checkpoint index '{}': needs an object 'weight_map' of tensor name -> shard file", ip);
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  std::set<std::string> shards;
  for (auto it = doc["weight_map"].begin(); it != doc["weight_map"].end(); ++it) {
    MT_CHECK(it->is_string(), "checkpoint index '{}': weight_map entry for tensor '{}' must be a file name, got {}",
             ip, it.key(), json_brief(*it));
    std::string shard = it->get<std::string>();
    MT_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
             "checkpoint index '{}': tensor '{}' maps to '{}', which is not a plain file name in the directory", ip,
             it.key(), shard);
    weight_map[it.key()] = shard;
    shards.insert(shard);
  }
  std::unordered_map<std::string, std::string> found;  // tensor -> shard it was read from
  for (const auto& shard : shards) {
    const fs::path sp = dir / shard;
    std::error_code ec;
    MT_CHECK(fs::exists(sp, ec), "checkpoint index '{}' names shard '{}', which does not exist", ip, sp.string());
    SafetensorsFile f = read_safetensors(sp.string());
    for (auto& [name, t] : f.tensors) {
      auto prev = found.find(name);
      MT_CHECK(prev == found.end(), "checkpoint '{}': tensor '{}' appears in two shards, '{}' and '{}'",
               dir.string(), name, prev == found.end() ? "" : prev->second, shard);
      auto m = weight_map.find(name);
      MT_CHECK(m != weight_map.end(), "shard '{}' holds tensor '{}', which checkpoint index '{}' does not list",
               sp.string(), name, ip);
      MT_CHECK(m->second == shard, "shard '{}' holds tensor '{}', but checkpoint index '{}' maps it to '{}'",
               sp.string(), name, ip, m->second);
      found.emplace(name, shard);
      ck.file_of[name] = shard;
      ck.tensors.emplace_back(name, std::move(t));
    }
  }
  for (const auto& [name, shard] : weight_map)
    MT_CHECK(found.count(name), "checkpoint index '{}' maps tensor '{}' to shard '{}', which does not contain it", ip,
             name, (dir / shard).string());
}

// Writes config + weights into `dir` (which exists); returns nothing, throws on failure.
void write_files(const fs::path& dir, const ModelConfig& config,
                 const std::vector<std::pair<std::string, Tensor>>& tensors, DType dtype, int64_t max_shard_bytes) {
  // Plan the shards from the converted sizes.
  std::vector<int64_t> bytes;
  int64_t total = 0;
  for (const auto& [name, t] : tensors) {
    DType out = is_floating(t.dtype()) ? dtype : t.dtype();
    bytes.push_back(t.numel() * dtype_size(out));
    total += bytes.back();
  }
  std::vector<std::vector<size_t>> shards;  // indices into tensors
  if (max_shard_bytes <= 0 || total <= max_shard_bytes) {
    shards.emplace_back();
    for (size_t i = 0; i < tensors.size(); ++i) shards[0].push_back(i);
  } else {
    int64_t cur = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (shards.empty() || (cur > 0 && cur + bytes[i] > max_shard_bytes)) {
        shards.emplace_back();
        cur = 0;
      }
      shards.back().push_back(i);
      cur += bytes[i];
    }
  }
  const bool sharded = shards.size() > 1;

  auto shard_tensors = [&](const std::vector<size_t>& idx) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (size_t i : idx) {
      const Tensor& t = tensors[i].second;
      out.emplace_back(tensors[i].first, is_floating(t.dtype()) && t.dtype() != dtype ? t.to(dtype) : t);
    }
    return out;
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}};  // what transformers writes

  std::set<std::string> written;
  json weight_map = json::object();
  if (sharded) {
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name = shard_name(s, shards.size());
      write_safetensors((dir / name).string(), shard_tensors(shards[s]), meta);
      written.insert(name);
      for (size_t i : shards[s]) weight_map[tensors[i].first] = name;
    }
  } else {
    write_safetensors((dir / kHfSingleFile).string(), shard_tensors(shards[0]), meta);
  }
  ModelConfig cfg = config;
  cfg.torch_dtype = torch_dtype_name(dtype);
  save_hf_config(cfg, (dir / kHfConfigFile).string());

  // The commit point: readers prefer the index, so writing it (sharded) or removing it (single
  // file) switches an existing directory to the new weights. Then the old layout's files go.
  std::error_code ec;
  if (sharded) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    write_file_atomically((dir / kHfIndexFile).string(), [&](std::ostream& out) { out << text; });
    fs::remove(dir / kHfSingleFile, ec);
  } else {
    fs::remove(dir / kHfIndexFile, ec);
    MT_CHECK(!ec, "write_hf_checkpoint '{}': cannot remove the previous index: {}", dir.string(), ec.message());
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_shard_name(name) && !written.count(name)) fs::remove(entry.path(), ec);
  }
}

}  // namespace

HfCheckpoint read_hf_checkpoint(const std::string& dir_in) {
  const fs::path dir = normalize_dir(dir_in);
  std::error_code ec;
  MT_CHECK(fs::is_directory(dir, ec), "checkpoint '{}': not a directory", dir_in);
  HfCheckpoint ck;
  ck.config = load_hf_config((dir / kHfConfigFile).string());
  if (fs::exists(dir / kHfIndexFile, ec)) {
    read_indexed(dir, ck);
  } else if (fs::exists(dir / kHfSingleFile, ec)) {
    ck.tensors = read_safetensors((dir / kHfSingleFile).string()).tensors;
    for (const auto& [name, t] : ck.tensors) ck.file_of[name] = kHfSingleFile;
  } else {
    MT_FAIL("checkpoint '{}': neither {} nor {} exists (only safetensors checkpoints are supported)", dir_in,
            kHfSingleFile, kHfIndexFile);
  }
  ck.source = dir_in;
  return ck;
}

void write_hf_checkpoint(const std::string& dir_in, const ModelConfig& config,
                         const std::vector<std::pair<std::string, Tensor>>& tensors, DType dtype,
                         int64_t max_shard_bytes) {
  MT_CHECK(torch_dtype_name(dtype) != nullptr,
           "write_hf_checkpoint '{}': dtype {} is not a floating type (f32, bf16, f16 or f64)", dir_in, dtype);
  MT_CHECK(max_shard_bytes >= 0, "write_hf_checkpoint '{}': max_shard_bytes {} is negative", dir_in,
           max_shard_bytes);
  std::unordered_set<std::string> names;
  for (const auto& [name, t] : tensors) {
    MT_CHECK(names.insert(name).second, "write_hf_checkpoint '{}': tensor '{}' is given twice", dir_in, name);
    MT_CHECK(t.defined() && !t.is_meta(), "write_hf_checkpoint '{}': tensor '{}' has no data (undefined or meta)",
             dir_in, name);
    raw_memory_view(t, fmt::format("write_hf_checkpoint '{}'", dir_in), name);  // before any file is touched
  }
  config.validate();
  const fs::path dir = normalize_dir(dir_in);
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    MT_CHECK(fs::is_directory(dir, ec), "write_hf_checkpoint '{}': exists and is not a directory", dir_in);
    write_files(dir, config, tensors, dtype, max_shard_bytes);
    return;
  }
  // A new directory: build it next to its final place, then rename it into place in one step.
  const fs::path tmp = fs::path(fmt::format("{}.tmp.{}", dir.string(), static_cast<long>(::getpid())));
  if (dir.has_parent_path()) {
    fs::create_directories(dir.parent_path(), ec);
    MT_CHECK(!ec, "write_hf_checkpoint '{}': cannot create the parent directory '{}': {}", dir_in,
             dir.parent_path().string(), ec.message());
  }
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  MT_CHECK(!ec, "write_hf_checkpoint '{}': cannot create '{}': {}", dir_in, tmp.string(), ec.message());
  try {
    write_files(tmp, config, tensors, dtype, max_shard_bytes);
    fsync_path(tmp.string());  // its entries (the files sync themselves) are durable before its name is
    fs::rename(tmp, dir, ec);
    MT_CHECK(!ec, "write_hf_checkpoint '{}': cannot rename '{}' into place: {}", dir_in, tmp.string(), ec.message());
    fsync_path(dir.has_parent_path() ? dir.parent_path().string() : ".");
  } catch (...) {
    std::error_code ec2;
    fs::remove_all(tmp, ec2);
    throw;
  }
}

namespace {

// "model.layers.N.self_attn.rotary_emb.inv_freq": a buffer transformers saved until it made it
// non-persistent (4.31); derived from the config, so a checkpoint's copy is not read.
bool is_saved_rotary_buffer(const std::string& name) {
  constexpr std::string_view kPrefix = "model.layers.", kSuffix = ".self_attn.rotary_emb.inv_freq";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0 ||
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return false;
  const std::string_view layer(name.data() + kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  return std::all_of(layer.begin(), layer.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

}  // namespace

void load_into_module(Module& m, const HfCheckpoint& ck) {
  // " (in FILE)" when the checkpoint says which file holds the tensor (a sharded one has several).
  auto in_file = [&](const std::string& name) {
    auto it = ck.file_of.find(name);
    return it == ck.file_of.end() ? std::string() : fmt::format(" (in {})", it->second);
  };
  const std::string what =
      ck.source.empty() ? std::string("the checkpoint") : fmt::format("checkpoint '{}'", ck.source);
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [name, t] : ck.tensors)
    MT_CHECK(given.emplace(name, &t).second, "load_into_module: tensor '{}' appears twice in {}", name, what);
  const bool tied = ck.config.tie_word_embeddings;
  auto find = [&](const std::string& name) -> const Tensor* {
    auto it = given.find(name);
    return it == given.end() ? nullptr : it->second;
  };

  // A parallelized model's parameters hold shards: full checkpoint tensors do not go into them.
  for (const auto& [path, p] : m.named_parameters())
    MT_CHECK(!p.is_distributed(),
             "load_into_module: parameter '{}' is a DTensor {} (the model is parallelized): load the checkpoint "
             "before parallelize(), which slices loaded weights to this rank's shards",
             path, p.desc());
  Module::NamedTensors state;
  std::vector<std::string> missing, unexpected, mismatched;
  auto take = [&](const std::string& path, const Tensor& dst, const Tensor* src, const std::string& src_name) {
    if (src->shape() != dst.shape())
      mismatched.push_back(fmt::format("'{}'{} is {} in the checkpoint but {} in the model", src_name, in_file(src_name),
                                       src->shape(), dst.shape()));
    else if (is_floating(src->dtype()) != is_floating(dst.dtype()))  // widths convert; integers are no weights
      mismatched.push_back(fmt::format("'{}'{} is {} in the checkpoint but {} in the model", src_name,
                                       in_file(src_name), src->dtype(), dst.dtype()));
    else
      state.emplace_back(path, *src);
  };
  for (const auto& [path, p] : m.named_parameters()) {
    // Tied embeddings: the output projection is the embedding, whatever the file holds.
    const std::string src_name = tied && path == kLmHeadName ? std::string(kEmbedName) : path;
    const Tensor* src = find(src_name);
    if (!src) {
      missing.push_back(path);
      continue;
    }
    take(path, p, src, src_name);
  }
  for (const auto& [path, b] : m.named_buffers())
    if (const Tensor* src = find(path)) take(path, b, src, path);
  std::unordered_set<std::string> known;  // every path, tied aliases included
  for (const auto& [path, t] : m.state_dict()) known.insert(path);
  for (const auto& [name, t] : ck.tensors)
    if (!known.count(name) && !(tied && name == kLmHeadName) && !is_saved_rotary_buffer(name))
      unexpected.push_back(name + in_file(name));

  std::vector<std::string> errors;
  if (!missing.empty()) errors.push_back(fmt::format("missing from the checkpoint: {}", join(missing)));
  if (!unexpected.empty()) errors.push_back(fmt::format("not in the model: {}", join(unexpected)));
  if (!mismatched.empty()) errors.push_back(fmt::format("shape or dtype mismatch: {}", join(mismatched)));
  MT_CHECK(errors.empty(), "load_into_module: {} ({} tensors) does not fit the model ({} parameters): {}", what,
           ck.tensors.size(), m.named_parameters().size(), join(errors));
  m.load_state_dict(state, Strict::kNo);
}

std::vector<std::pair<std::string, Tensor>> hf_state(const Module& m, const ModelConfig& config) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [path, p] : m.named_parameters())
    if (!(config.tie_word_embeddings && path == kLmHeadName)) out.emplace_back(path, p.detach());
  return out;
}

}  // namespace mt
