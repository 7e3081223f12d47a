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
#include <tuple>
#include <vector>

#include "models/json_io.h"
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
constexpr const char* kLayoutKey = "mt.crc32_layout";

// Slicing-by-8 tables: kCrcTables[0] is the byte-at-a-time table; kCrcTables[k][i] is the CRC of
// byte i followed by k zero bytes, so eight bytes are folded per step (about 5x the one-table speed,
// which matters for sharded checkpoints: every chunk and every file is checksummed).
constexpr std::array<std::array<uint32_t, 256>, 8> make_crc_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
  return t;
}
constexpr std::array<std::array<uint32_t, 256>, 8> kCrcTables = make_crc_tables();

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

// The tensor table the data buffer's CRC was computed over, fingerprinted: a file that another tool
// rewrote keeping meshtrain's metadata (the safetensors library orders tensors its own way) has
// another table, and the recorded CRC says nothing about its buffer (docs/checkpoints.md).
// Rows are folded in data order, (begin, end), and then by name: that is the writer's order except
// among empty tensors at one offset, which a reader cannot order as they were written (the header
// parses into a map sorted by name).
class LayoutFingerprint {
 public:
  void add(const std::string& name, DType dtype, const Shape& shape, uint64_t begin, uint64_t end) {
    rows_.push_back({begin, end, name,
                     fmt::format("{}\t{}\t{}\t{}\t{}\n", name, safetensors_dtype_name(dtype),
                                 fmt::join(shape.vec(), ","), begin, end)});
  }
  std::string hex() {
    std::sort(rows_.begin(), rows_.end(), [](const Row& a, const Row& b) {
      return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
    });
    uint32_t crc = 0;
    for (const Row& r : rows_) crc = crc32_update(crc, r.text.data(), r.text.size());
    return hex32(crc);
  }

 private:
  struct Row {
    uint64_t begin, end;
    std::string name, text;
  };
  std::vector<Row> rows_;
};

int64_t json_nonneg_int(const json& v, const std::string& path, const std::string& name, const char* field) {
  MT_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
           "safetensors '{}': tensor '{}': {} must hold non-negative integers, got {}", path, name, field,
           json_brief(v));
  uint64_t u = v.get<uint64_t>();
  MT_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
           "safetensors '{}': tensor '{}': {} value {} is too large", path, name, field, u);
  return static_cast<int64_t>(u);
}

Entry parse_entry(const std::string& path, const std::string& name, const json& e) {
  MT_CHECK(e.is_object(), "safetensors '{}': tensor '{}': header entry must be an object, got {}", path, name,
           json_brief(e));
  Entry out;
  out.name = name;
  for (const char* field : {"dtype", "shape", "data_offsets"})
    MT_CHECK(e.contains(field), "safetensors '{}': tensor '{}': header entry has no '{}'", path, name, field);
  const json& dt = e["dtype"];
  MT_CHECK(dt.is_string(), "safetensors '{}': tensor '{}': dtype must be a string, got {}", path, name, json_brief(dt));
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
  MT_CHECK(sh.is_array(), "safetensors '{}': tensor '{}': shape must be an array, got {}", path, name, json_brief(sh));
  MT_CHECK(sh.size() <= static_cast<size_t>(kMaxDims), "safetensors '{}': tensor '{}': {} dims, at most {} supported",
           path, name, sh.size(), kMaxDims);
  // numel * dtype size, refusing overflow: a corrupt shape must not wrap around to a small (or
  // zero) size. A zero dim makes the tensor empty whatever the other dims are; otherwise every
  // partial product must stay below 2^63 (the element count is an int64 in meshtrain).
  bool has_zero = false;
  for (const auto& d : sh) {
    int64_t v = json_nonneg_int(d, path, name, "shape");
    out.shape.push_back(v);
    has_zero |= v == 0;
  }
  // An empty tensor still gets strides (the products of the trailing dims): they must fit too.
  int64_t stride = 1;
  for (int i = out.shape.size() - 1; i > 0; --i)
    MT_CHECK(checked_mul(stride, std::max<int64_t>(out.shape[i], 1), &stride),
             "safetensors '{}': tensor '{}': shape {} of {} is too large: its strides overflow a 64-bit integer "
             "(a corrupt header?)", path, name, out.shape, dts);
  int64_t nbytes = has_zero ? 0 : dtype_size(out.dtype);
  for (int i = 0; i < out.shape.size() && nbytes > 0; ++i)
    MT_CHECK(checked_mul(nbytes, out.shape[i], &nbytes),
             "safetensors '{}': tensor '{}': shape {} of {} is too large: its size in bytes overflows a 64-bit "
             "integer (a corrupt header?)", path, name, out.shape, dts);
  const json& off = e["data_offsets"];
  MT_CHECK(off.is_array() && off.size() == 2,
           "safetensors '{}': tensor '{}': data_offsets must be [begin, end], got {}", path, name, json_brief(off));
  out.begin = static_cast<uint64_t>(json_nonneg_int(off[0], path, name, "data_offsets"));
  out.end = static_cast<uint64_t>(json_nonneg_int(off[1], path, name, "data_offsets"));
  MT_CHECK(out.begin <= out.end, "safetensors '{}': tensor '{}': data_offsets [{}, {}] end before begin", path,
           name, out.begin, out.end);
  MT_CHECK(out.end - out.begin == static_cast<uint64_t>(nbytes),
           "safetensors '{}': tensor '{}': shape {} of {} needs {} bytes but data_offsets [{}, {}] span {} ({} "
           "elements of {} bytes each)", path, name, out.shape, dts, nbytes, out.begin, out.end, out.end - out.begin,
           out.shape.numel(), dtype_size(out.dtype));
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
  const auto& t = kCrcTables;
  crc = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // little-endian host (static_assert above)
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
          t[3][hi & 0xffu] ^ t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) crc = t[0][(crc ^ *p) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

namespace {

// Multiplies the 32x32 matrix over GF(2) (column i = what bit i of the input turns into) by `v`.
uint32_t gf2_apply(const std::array<uint32_t, 32>& m, uint32_t v) {
  uint32_t out = 0;
  for (int i = 0; v != 0; ++i, v >>= 1)
    if (v & 1u) out ^= m[static_cast<size_t>(i)];
  return out;
}

std::array<uint32_t, 32> gf2_square(const std::array<uint32_t, 32>& m) {
  std::array<uint32_t, 32> sq{};
  for (size_t i = 0; i < 32; ++i) sq[i] = gf2_apply(m, m[i]);
  return sq;
}

}  // namespace

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // Appending B to A changes A's register as len_b zero bytes would (the CRC is linear), then B's
  // own CRC is added. The operator "feed one zero bit" is a matrix; squaring it doubles the bits.
  std::array<uint32_t, 32> op{};
  op[0] = 0xEDB88320u;  // the reflected polynomial: bit 0 shifted out feeds it back
  for (size_t i = 1; i < 32; ++i) op[i] = 1u << (i - 1);
  for (int k = 0; k < 3; ++k) op = gf2_square(op);  // one zero byte (8 bits)
  for (; len_b != 0; len_b >>= 1) {
    if (len_b & 1u) crc_a = gf2_apply(op, crc_a);
    if (len_b > 1) op = gf2_square(op);
  }
  return crc_a ^ crc_b;
}

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  MT_ASSERT(false, "dtype {} has no safetensors name", t);
  return "";
}

namespace {

struct ParsedHeader {
  std::vector<Entry> entries;  // sorted by begin
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
};

// The size of the regular file `path` (errors name it when it is missing or no regular file).
uint64_t checked_file_size(const std::string& path) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  MT_CHECK(fs::exists(status), "safetensors '{}': file does not exist", path);
  MT_CHECK(fs::is_regular_file(status), "safetensors '{}': not a regular file", path);
  const uint64_t file_size = fs::file_size(path, ec);
  MT_CHECK(!ec, "safetensors '{}': cannot get the file size: {}", path, ec.message());
  return file_size;
}

// Reads and validates the header of `path` through `in` (positioned at 0).
ParsedHeader parse_header(const std::string& path, std::ifstream& in, uint64_t file_size) {
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

  ParsedHeader out;
  out.data_start = 8 + header_len;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "__metadata__") {
      MT_CHECK(it->is_object(), "safetensors '{}': __metadata__ must be an object of strings", path);
      for (auto m = it->begin(); m != it->end(); ++m) {
        MT_CHECK(m->is_string(), "safetensors '{}': __metadata__ value of '{}' must be a string, got {}", path,
                 m.key(), json_brief(*m));
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    out.entries.push_back(parse_entry(path, it.key(), it.value()));
  }

  // The ranges must tile [0, buffer size) exactly, as the reference implementation requires.
  const uint64_t buffer_size = file_size - 8 - header_len;
  std::vector<Entry>& entries = out.entries;
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
  return out;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  const uint64_t file_size = checked_file_size(path);
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.is_open(), "safetensors '{}': cannot open: {}", path, errno_text());
  ParsedHeader h = parse_header(path, in, file_size);
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  uint32_t crc = 0;
  for (const auto& e : h.entries) {
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
  LayoutFingerprint layout;
  for (const auto& e : h.entries) layout.add(e.name, e.dtype, e.shape, e.begin, e.end);
  const auto recorded_layout = out.metadata.find(kLayoutKey);
  // Files written before the fingerprint (no kLayoutKey) are checked as they were.
  const bool same_layout = recorded_layout == out.metadata.end() || recorded_layout->second == layout.hex();
  if (auto it = out.metadata.find(kCrcKey); it != out.metadata.end() && same_layout)
    MT_CHECK(it->second == hex32(crc),
             "safetensors '{}': checksum mismatch: {} in the header is {} but the data buffer's CRC-32 is {} (the "
             "file is corrupt)", path, kCrcKey, it->second, hex32(crc));
  return out;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  const uint64_t file_size = checked_file_size(path);
  ParsedHeader h;
  {
    std::ifstream in(path, std::ios::binary);
    MT_CHECK(in.is_open(), "safetensors '{}': cannot open: {}", path, errno_text());
    h = parse_header(path, in, file_size);
  }
  data_start_ = h.data_start;
  metadata_ = std::move(h.metadata);
  for (auto& e : h.entries) {
    by_name_[e.name] = entries_.size();
    entries_.push_back({e.name, e.dtype, e.shape, e.begin, e.end});
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd_ >= 0, "safetensors '{}': cannot open: {}", path, errno_text());
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

Tensor SafetensorsReader::read_block(const std::string& name, const Shape& offset, const Shape& sizes) {
  const SafetensorsEntry* e = find(name);
  MT_CHECK(e, "safetensors '{}': tensor '{}' is not in the file", path_, name);
  const int nd = e->shape.size();
  MT_CHECK(offset.size() == nd && sizes.size() == nd,
           "safetensors '{}': tensor '{}' has {} dims but the requested box [{} + {}] has {}", path_, name, nd, offset,
           sizes, offset.size());
  for (int d = 0; d < nd; ++d)
    MT_CHECK(offset[d] >= 0 && sizes[d] >= 0 && offset[d] + sizes[d] <= e->shape[d],
             "safetensors '{}': tensor '{}' of shape {}: the box at {} of sizes {} leaves it", path_, name, e->shape,
             offset, sizes);
  Tensor out = empty(sizes, e->dtype);
  if (out.numel() == 0) return out;
  const int64_t esize = dtype_size(e->dtype);
  // The innermost dims the box covers whole merge into one contiguous run with the first
  // partial dim (from the right); the dims outside it are iterated.
  int inner = nd;  // dims [inner, nd) form one run
  int64_t run = 1;
  while (inner > 0) {
    run *= sizes[inner - 1];
    --inner;
    if (sizes[inner] != e->shape[inner]) break;
  }
  Shape strides = e->shape;  // row-major element strides of the stored tensor
  {
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; --d) {
      strides[d] = s;
      s *= e->shape[d];
    }
  }
  auto* dst = static_cast<char*>(out.data_ptr());
  const uint64_t run_bytes = static_cast<uint64_t>(run * esize);
  std::vector<int64_t> idx(static_cast<size_t>(inner), 0);  // position in the outer dims of the box
  while (true) {
    int64_t elem = 0;
    for (int d = 0; d < nd; ++d) elem += (offset[d] + (d < inner ? idx[d] : 0)) * strides[d];
    uint64_t pos = data_start_ + e->begin + static_cast<uint64_t>(elem * esize);
    uint64_t done = 0;
    while (done < run_bytes) {
      const ssize_t got = ::pread(fd_, dst + done, run_bytes - done, static_cast<off_t>(pos + done));
      if (got < 0 && errno == EINTR) continue;
      MT_CHECK(got > 0, "safetensors '{}': tensor '{}': read failed at byte {}: {}", path_, name, pos + done,
               got < 0 ? errno_text() : std::string("unexpected end of file"));
      done += static_cast<uint64_t>(got);
    }
    bytes_read_ += run_bytes;
    dst += run_bytes;
    int d = inner - 1;
    while (d >= 0 && ++idx[d] == sizes[d]) idx[d--] = 0;
    if (d < 0) break;
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  std::vector<Tensor> data;  // contiguous CPU tensors, in order
  data.reserve(tensors.size());
  ordered_json tensor_entries = ordered_json::object();
  uint64_t offset = 0;
  uint32_t crc = 0;
  LayoutFingerprint layout;
  for (const auto& [name, t] : tensors) {
    MT_CHECK(!name.empty() && name != "__metadata__",
             "write_safetensors '{}': invalid tensor name '{}'", path, name);
    MT_CHECK(names.insert(name).second, "write_safetensors '{}': tensor '{}' is given twice", path, name);
    MT_CHECK(t.defined(), "write_safetensors '{}': tensor '{}' is undefined", path, name);
    MT_CHECK(!t.is_meta(), "write_safetensors '{}': tensor '{}' is on the meta device (no data); materialize it first",
             path, name);
    // A DTensor's memory is its shard only: refused unless replicated (models/ cannot gather).
    Tensor whole = raw_memory_view(t, fmt::format("write_safetensors '{}'", path), name);
    Tensor c = (whole.device().is_cpu() ? whole : whole.to(Device::cpu())).contiguous();
    const uint64_t n = static_cast<uint64_t>(c.numel() * dtype_size(c.dtype()));
    if (n > 0) crc = crc32_update(crc, c.data_ptr(), n);
    ordered_json e;
    e["dtype"] = safetensors_dtype_name(c.dtype());
    e["shape"] = c.shape().vec();
    e["data_offsets"] = {offset, offset + n};
    tensor_entries[name] = std::move(e);
    layout.add(name, c.dtype(), c.shape(), offset, offset + n);
    offset += n;
    data.push_back(std::move(c));
  }
  ordered_json header = ordered_json::object();
  ordered_json meta = ordered_json::object();
  for (const auto& [k, v] : metadata)
    if (k != kCrcKey && k != kLayoutKey) meta[k] = v;
  meta[kCrcKey] = hex32(crc);
  meta[kLayoutKey] = layout.hex();
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

void write_safetensors_streamed(const std::string& path, const std::vector<SafetensorsSpec>& specs,
                                const std::function<Tensor(size_t)>& produce,
                                const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  ordered_json header = ordered_json::object();
  ordered_json meta = ordered_json::object();
  for (const auto& [k, v] : metadata)
    if (k != kCrcKey && k != kLayoutKey) meta[k] = v;
  constexpr const char* kPlaceholder = "@@crc32@";  // 8 characters, replaced by the hex CRC
  meta[kCrcKey] = kPlaceholder;
  header["__metadata__"] = nullptr;  // first, as write_safetensors puts it (filled in below)
  LayoutFingerprint layout;
  uint64_t offset = 0;
  for (const auto& sp : specs) {
    MT_CHECK(!sp.name.empty() && sp.name != "__metadata__" && names.insert(sp.name).second,
             "write_safetensors '{}': invalid or repeated tensor name '{}'", path, sp.name);
    const uint64_t n = static_cast<uint64_t>(sp.shape.numel() * dtype_size(sp.dtype));
    ordered_json e;
    e["dtype"] = safetensors_dtype_name(sp.dtype);
    e["shape"] = sp.shape.vec();
    e["data_offsets"] = {offset, offset + n};
    header[sp.name] = std::move(e);
    layout.add(sp.name, sp.dtype, sp.shape, offset, offset + n);
    offset += n;
  }
  meta[kLayoutKey] = layout.hex();
  header["__metadata__"] = std::move(meta);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const size_t crc_at = text.find(kPlaceholder);
  MT_ASSERT(crc_at != std::string::npos, "placeholder lost");
  uint32_t crc = 0;
  std::streampos header_start = 0;
  write_file_atomically(path, [&](std::ostream& out) {
    uint8_t len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    header_start = out.tellp();
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (size_t i = 0; i < specs.size(); ++i) {
      Tensor t = produce(i);
      MT_CHECK(t.dtype() == specs[i].dtype && t.shape() == specs[i].shape,
               "write_safetensors '{}': tensor '{}' is {} {}, announced as {} {}", path, specs[i].name, t.dtype(),
               t.shape(), specs[i].dtype, specs[i].shape);
      Tensor c = (t.device().is_cpu() ? t : t.to(Device::cpu())).contiguous();
      const auto bytes = static_cast<size_t>(c.numel() * dtype_size(c.dtype()));
      if (bytes > 0) {
        crc = crc32_update(crc, c.data_ptr(), bytes);
        out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(bytes));
      }
    }
    const std::string hex = hex32(crc);
    out.seekp(header_start + static_cast<std::streamoff>(crc_at));
    out.write(hex.data(), 8);
    out.seekp(0, std::ios::end);
  });
}

}  // namespace mt
