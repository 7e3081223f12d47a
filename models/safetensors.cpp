// safetensors reading and writing. The reader checks the header the way the reference Rust
// implementation does (header size cap, dtype, shape x dtype size == byte range, ranges that tile
// the buffer exactly: no overlap, no holes, no trailing bytes) and names the file and tensor in
// every error; the writer produces byte-identical files for identical input.
#include "models/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/error.h"

namespace mt {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swapping");

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

// The reference implementation refuses headers over 100 MB; so do we (a corrupt length would
// otherwise make us allocate gigabytes before failing).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kCrcKey = "mt.crc32";

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"F64", DType::kF64}, {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16},
    {"I64", DType::kI64}, {"I32", DType::kI32}, {"U8", DType::kU8},     {"BOOL", DType::kBool},
};
// dtypes of the format that meshtrain has no tensor type for: named as "unsupported", not "unknown".
constexpr const char* kForeignDTypes[] = {"I8", "I16", "U16", "U32", "U64", "F8_E5M2", "F8_E4M3",
                                          "F8_E4M3FN", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};

std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

// A tensor's entry in the header, validated.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

int64_t json_nonneg_int(const json& v, const std::string& path, const std::string& name, const char* field) {
  MT_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
           "safetensors '{}': tensor '{}': {} must hold non-negative integers, got {}", path, name, field,
           v.dump());
  uint64_t u = v.get<uint64_t>();
  MT_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
           "safetensors '{}': tensor '{}': {} value {} is too large", path, name, field, u);
  return static_cast<int64_t>(u);
}

Entry parse_entry(const std::string& path, const std::string& name, const json& e) {
  MT_CHECK(e.is_object(), "safetensors '{}': tensor '{}': header entry must be an object, got {}", path, name,
           e.dump());
  Entry out;
  out.name = name;
  for (const char* field : {"dtype", "shape", "data_offsets"})
    MT_CHECK(e.contains(field), "safetensors '{}': tensor '{}': header entry has no '{}'", path, name, field);
  const json& dt = e["dtype"];
  MT_CHECK(dt.is_string(), "safetensors '{}': tensor '{}': dtype must be a string, got {}", path, name, dt.dump());
  const std::string dts = dt.get<std::string>();
  bool found = false;
  for (const auto& d : kDTypeNames)
    if (dts == d.name) {
      out.dtype = d.dtype;
      found = true;
    }
  if (!found) {
    bool foreign = std::any_of(std::begin(kForeignDTypes), std::end(kForeignDTypes),
                               [&](const char* f) { return dts == f; });
    MT_FAIL("safetensors '{}': tensor '{}': {} dtype '{}' (meshtrain reads F64, F32, BF16, F16, I64, I32, U8, BOOL)",
            path, name, foreign ? "unsupported" : "unknown", dts);
  }
  const json& sh = e["shape"];
  MT_CHECK(sh.is_array(), "safetensors '{}': tensor '{}': shape must be an array, got {}", path, name, sh.dump());
  MT_CHECK(sh.size() <= static_cast<size_t>(kMaxDims), "safetensors '{}': tensor '{}': {} dims, at most {} supported",
           path, name, sh.size(), kMaxDims);
  // numel * dtype size, refusing overflow (a corrupt shape must not wrap around to a small size).
  uint64_t nbytes = static_cast<uint64_t>(dtype_size(out.dtype));
  bool overflow = false;
  for (const auto& d : sh) {
    int64_t v = json_nonneg_int(d, path, name, "shape");
    out.shape.push_back(v);
    if (v != 0 && nbytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(v)) overflow = true;
    nbytes *= static_cast<uint64_t>(v);
  }
  // A zero dim makes any other dim harmless. (Not shape.numel() == 0: numel overflows first.)
  if (std::find(out.shape.begin(), out.shape.end(), 0) != out.shape.end()) {
    overflow = false;
    nbytes = 0;
  }
  MT_CHECK(!overflow, "safetensors '{}': tensor '{}': shape {} is too large", path, name, sh.dump());
  const json& off = e["data_offsets"];
  MT_CHECK(off.is_array() && off.size() == 2,
           "safetensors '{}': tensor '{}': data_offsets must be [begin, end], got {}", path, name, off.dump());
  out.begin = static_cast<uint64_t>(json_nonneg_int(off[0], path, name, "data_offsets"));
  out.end = static_cast<uint64_t>(json_nonneg_int(off[1], path, name, "data_offsets"));
  MT_CHECK(out.begin <= out.end, "safetensors '{}': tensor '{}': data_offsets [{}, {}] end before begin", path,
           name, out.begin, out.end);
  MT_CHECK(out.end - out.begin == nbytes,
           "safetensors '{}': tensor '{}': shape {} of {} needs {} bytes but data_offsets [{}, {}] span {}", path,
           name, out.shape, dts, nbytes, out.begin, out.end, out.end - out.begin);
  return out;
}

std::string errno_text() { return std::strerror(errno); }

void read_exact(std::ifstream& in, void* dst, uint64_t n, const std::string& path, const std::string& what) {
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  MT_CHECK(in.good() && static_cast<uint64_t>(in.gcount()) == n,
           "safetensors '{}': {}: read failed after {} of {} bytes (file truncated or unreadable)", path, what,
           in.gcount(), n);
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  MT_ASSERT(false, "dtype {} has no safetensors name", t);
  return "";
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  MT_CHECK(fs::exists(status), "safetensors '{}': file does not exist", path);
  MT_CHECK(fs::is_regular_file(status), "safetensors '{}': not a regular file", path);
  const uint64_t file_size = fs::file_size(path, ec);
  MT_CHECK(!ec, "safetensors '{}': cannot get the file size: {}", path, ec.message());
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.is_open(), "safetensors '{}': cannot open: {}", path, errno_text());
  MT_CHECK(file_size >= 8, "safetensors '{}': file is {} bytes, too short for the 8-byte header length", path,
           file_size);

  uint8_t len_bytes[8];
  read_exact(in, len_bytes, 8, path, "header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  MT_CHECK(header_len <= file_size - 8,
           "safetensors '{}': header length {} exceeds the {} bytes that follow it (file truncated or not "
           "safetensors)", path, header_len, file_size - 8);
  MT_CHECK(header_len <= kMaxHeaderBytes, "safetensors '{}': header length {} exceeds the {} byte limit", path,
           header_len, kMaxHeaderBytes);
  std::string header(header_len, '\0');
  read_exact(in, header.data(), header_len, path, "header");

  // Parse, refusing duplicate top-level keys (nlohmann would keep the last one silently).
  std::set<std::string> keys;
  std::string duplicate;
  json doc;
  try {
    doc = json::parse(header, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second &&
          duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const json::exception& e) {
    MT_FAIL("safetensors '{}': header is not valid JSON: {}", path, e.what());
  }
  MT_CHECK(duplicate.empty(), "safetensors '{}': tensor '{}' appears twice in the header", path, duplicate);
  MT_CHECK(doc.is_object(), "safetensors '{}': header must be a JSON object, got {}", path, doc.type_name());

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "__metadata__") {
      MT_CHECK(it->is_object(), "safetensors '{}': __metadata__ must be an object of strings", path);
      for (auto m = it->begin(); m != it->end(); ++m) {
        MT_CHECK(m->is_string(), "safetensors '{}': __metadata__ value of '{}' must be a string, got {}", path,
                 m.key(), m->dump());
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, it.key(), it.value()));
  }

  // The ranges must tile [0, buffer size) exactly, as the reference implementation requires.
  const uint64_t buffer_size = file_size - 8 - header_len;
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const auto& e : entries) {
    MT_CHECK(e.end <= buffer_size,
             "safetensors '{}': tensor '{}': data_offsets [{}, {}] lie outside the {}-byte data buffer (file "
             "truncated?)", path, e.name, e.begin, e.end, buffer_size);
    MT_CHECK(e.begin >= pos, "safetensors '{}': tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]",
             path, e.name, e.begin, e.end, prev ? prev->name : "", prev ? prev->begin : 0, pos);
    MT_CHECK(e.begin == pos, "safetensors '{}': tensor '{}': data_offsets [{}, {}] leave a hole of {} bytes before it",
             path, e.name, e.begin, e.end, e.begin - pos);
    pos = e.end;
    prev = &e;
  }
  MT_CHECK(pos == buffer_size, "safetensors '{}': the data buffer has {} bytes but the tensors cover only {}", path,
           buffer_size, pos);

  uint32_t crc = 0;
  for (const auto& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    const uint64_t n = e.end - e.begin;
    if (n > 0) {
      read_exact(in, t.data_ptr(), n, path, fmt::format("tensor '{}'", e.name));
      crc = crc32_update(crc, t.data_ptr(), n);
      if (e.dtype == DType::kBool) {
        const auto* b = static_cast<const uint8_t*>(t.data_ptr());
        for (uint64_t i = 0; i < n; ++i)
          MT_CHECK(b[i] <= 1, "safetensors '{}': tensor '{}': BOOL element {} has byte value {} (not 0 or 1)", path,
                   e.name, i, b[i]);
      }
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  if (auto it = out.metadata.find(kCrcKey); it != out.metadata.end())
    MT_CHECK(it->second == hex32(crc),
             "safetensors '{}': checksum mismatch: {} in the header is {} but the data buffer's CRC-32 is {} (the "
             "file is corrupt)", path, kCrcKey, it->second, hex32(crc));
  return out;
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& fill) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  auto cleanup = [&] {
    std::error_code ec;
    fs::remove(tmp, ec);
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MT_CHECK(out.is_open(), "cannot write '{}': {}", path, errno_text());
    try {
      fill(out);
      out.flush();
    } catch (...) {
      out.close();
      cleanup();
      throw;
    }
    if (!out.good()) {
      std::string why = errno_text();
      out.close();
      cleanup();
      MT_FAIL("cannot write '{}': {}", path, why);
    }
    out.close();
    if (out.fail()) {
      cleanup();
      MT_FAIL("cannot write '{}': closing failed", path);
    }
  }
  // Make the data durable before the rename publishes it (fsync through any descriptor of the file).
  int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    cleanup();
    MT_FAIL("cannot write '{}': renaming the temporary file failed: {}", path, ec.message());
  }
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  std::vector<Tensor> data;  // contiguous CPU tensors, in order
  data.reserve(tensors.size());
  ordered_json tensor_entries = ordered_json::object();
  uint64_t offset = 0;
  uint32_t crc = 0;
  for (const auto& [name, t] : tensors) {
    MT_CHECK(!name.empty() && name != "__metadata__",
             "write_safetensors '{}': invalid tensor name '{}'", path, name);
    MT_CHECK(names.insert(name).second, "write_safetensors '{}': tensor '{}' is given twice", path, name);
    MT_CHECK(t.defined(), "write_safetensors '{}': tensor '{}' is undefined", path, name);
    MT_CHECK(!t.is_meta(), "write_safetensors '{}': tensor '{}' is on the meta device (no data); materialize it first",
             path, name);
    Tensor c = (t.device().is_cpu() ? t : t.to(Device::cpu())).contiguous();
    const uint64_t n = static_cast<uint64_t>(c.numel() * dtype_size(c.dtype()));
    if (n > 0) crc = crc32_update(crc, c.data_ptr(), n);
    ordered_json e;
    e["dtype"] = safetensors_dtype_name(c.dtype());
    e["shape"] = c.shape().vec();
    e["data_offsets"] = {offset, offset + n};
    tensor_entries[name] = std::move(e);
    offset += n;
    data.push_back(std::move(c));
  }
  ordered_json header = ordered_json::object();
  ordered_json meta = ordered_json::object();
  for (const auto& [k, v] : metadata)
    if (k != kCrcKey) meta[k] = v;
  meta[kCrcKey] = hex32(crc);
  header["__metadata__"] = std::move(meta);
  for (auto it = tensor_entries.begin(); it != tensor_entries.end(); ++it) header[it.key()] = std::move(it.value());
  std::string text;
  try {
    text = header.dump();
  } catch (const ordered_json::exception& e) {
    MT_FAIL("write_safetensors '{}': cannot encode the header (names and metadata must be UTF-8): {}", path,
            e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so that the data buffer starts 8-byte aligned
  write_file_atomically(path, [&](std::ostream& out) {
    uint8_t len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& c : data) {
      const auto bytes = static_cast<std::streamsize>(c.numel() * dtype_size(c.dtype()));
      if (bytes > 0) out.write(static_cast<const char*>(c.data_ptr()), bytes);
    }
  });
}

}  // namespace mt
