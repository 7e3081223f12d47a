// llm.c token shards, text token files and the DataLoader (see data.h for the formats).
#include "models/data.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>

#include "runtime/error.h"
#include "runtime/file_io.h"

namespace mt {

namespace {

// Explicit little-endian byte order, so files are portable whatever the host.
void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_u16(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v & 0xFF));
  out.push_back(static_cast<char>((v >> 8) & 0xFF));
}
uint32_t get_u32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint32_t get_u16(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
}

// The whole file, or a clear error naming it.
std::string read_all(const std::string& path, const char* what) {
  std::error_code ec;
  MT_CHECK(std::filesystem::exists(path, ec), "{}: file '{}' does not exist", what, path);
  MT_CHECK(!std::filesystem::is_directory(path, ec), "{}: '{}' is a directory, not a file", what, path);
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "{}: cannot open '{}': {}", what, path, std::strerror(errno));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MT_CHECK(!in.bad(), "{}: error while reading '{}'", what, path);
  return data;
}

// Writes the file whole or not at all (runtime/file_io.h: a temporary renamed over `path`, a device
// written in place); errors name `what`.
void write_atomic(const std::string& path, const std::string& bytes, const char* what) {
  try {
    write_file_atomically(
        path, [&](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
  } catch (const Error& e) {
    MT_FAIL("{}: {}", what, e.what());
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

// ---- llm.c token shards ----

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens) {
  bool wide = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    MT_CHECK(tokens[i] >= 0, "write_token_file '{}': token {} at position {} is negative", path,
             tokens[i], i);
    if (tokens[i] >= 65536) wide = true;
  }
  MT_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
           "write_token_file '{}': {} tokens do not fit the int32 count of the header", path,
           tokens.size());
  std::string bytes;
  bytes.reserve(static_cast<size_t>(kTokenFileHeaderBytes) + tokens.size() * (wide ? 4 : 2));
  put_u32(bytes, static_cast<uint32_t>(wide ? kTokenFileMagicU32 : kTokenFileMagicU16));
  put_u32(bytes, static_cast<uint32_t>(wide ? kTokenFileVersionU32 : kTokenFileVersionU16));
  put_u32(bytes, static_cast<uint32_t>(tokens.size()));
  for (int64_t i = 3; i < kTokenFileHeaderInts; ++i) put_u32(bytes, 0);
  for (int32_t t : tokens) {
    if (wide) {
      put_u32(bytes, static_cast<uint32_t>(t));
    } else {
      put_u16(bytes, static_cast<uint32_t>(t));
    }
  }
  write_atomic(path, bytes, "write_token_file");
}

TokenFileLayout read_token_file_header(const std::string& path) {
  // The header is read and checked against the file size before the body is read, so a file
  // that is not a token shard (or claims more tokens than it holds) costs 1 KiB of reading.
  std::error_code ec;
  MT_CHECK(std::filesystem::exists(path, ec), "read_token_file: file '{}' does not exist", path);
  MT_CHECK(!std::filesystem::is_directory(path, ec), "read_token_file: '{}' is a directory, not a file", path);
  MT_CHECK(std::filesystem::is_regular_file(path, ec), "read_token_file: '{}' is not a regular file", path);
  const auto file_size = std::filesystem::file_size(path, ec);
  MT_CHECK(!ec, "read_token_file: cannot get the size of '{}': {}", path, ec.message());
  const int64_t size = static_cast<int64_t>(file_size);
  MT_CHECK(size >= kTokenFileHeaderBytes,
           "read_token_file '{}': file is {} bytes, too short for the {}-byte header (256 int32)", path,
           size, kTokenFileHeaderBytes);
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "read_token_file: cannot open '{}': {}", path, std::strerror(errno));
  std::string data(static_cast<size_t>(kTokenFileHeaderBytes), '\0');
  in.read(data.data(), kTokenFileHeaderBytes);
  MT_CHECK(in.gcount() == kTokenFileHeaderBytes, "read_token_file '{}': cannot read the header", path);
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const auto magic = static_cast<int32_t>(get_u32(p));
  const auto version = static_cast<int32_t>(get_u32(p + 4));
  const auto count = static_cast<int32_t>(get_u32(p + 8));
  int width = 0;
  if (magic == kTokenFileMagicU16) {
    MT_CHECK(version == kTokenFileVersionU16,
             "read_token_file '{}': unsupported version {} for magic {} (uint16 tokens; expected version {})",
             path, version, magic, kTokenFileVersionU16);
    width = 2;
  } else if (magic == kTokenFileMagicU32) {
    MT_CHECK(version == kTokenFileVersionU32 || version == 2,
             "read_token_file '{}': unsupported version {} for magic {} (uint32 tokens; expected version {} or 2)",
             path, version, magic, kTokenFileVersionU32);
    width = 4;
  } else {
    MT_FAIL("read_token_file '{}': bad magic {}, expected {} (uint16 tokens) or {} (uint32 tokens); "
            "is this an llm.c token file?",
            path, magic, kTokenFileMagicU16, kTokenFileMagicU32);
  }
  MT_CHECK(count >= 0, "read_token_file '{}': negative token count {} in the header", path, count);
  const int64_t body = size - kTokenFileHeaderBytes;
  MT_CHECK(body == int64_t{count} * width,
           "read_token_file '{}': header says {} tokens ({} bytes of uint{}), but the file has {} bytes "
           "after the header",
           path, count, int64_t{count} * width, width * 8, body);
  return {width, count};
}

std::vector<int32_t> read_token_file(const std::string& path) {
  const TokenFileLayout layout = read_token_file_header(path);
  const int64_t body = layout.count * layout.width;
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "read_token_file: cannot open '{}': {}", path, std::strerror(errno));
  std::string data(static_cast<size_t>(body), '\0');
  in.seekg(kTokenFileHeaderBytes);
  in.read(data.data(), body);
  MT_CHECK(in.gcount() == body, "read_token_file '{}': read {} of the {} token bytes (file changed or unreadable)",
           path, static_cast<int64_t>(in.gcount()), body);
  const auto* q = reinterpret_cast<const unsigned char*>(data.data());
  std::vector<int32_t> tokens(static_cast<size_t>(layout.count));
  for (int64_t i = 0; i < layout.count; ++i) {
    if (layout.width == 2) {
      tokens[static_cast<size_t>(i)] = static_cast<int32_t>(get_u16(q + 2 * i));
    } else {
      const uint32_t v = get_u32(q + 4 * i);
      MT_CHECK(v <= static_cast<uint32_t>(std::numeric_limits<int32_t>::max()),
               "read_token_file '{}': token {} at position {} does not fit int32", path, v, i);
      tokens[static_cast<size_t>(i)] = static_cast<int32_t>(v);
    }
  }
  return tokens;
}

// ---- text token files ----

TokenRows read_token_lines(const std::string& path) {
  const std::string data = read_all(path, "read_token_lines");
  // A file with a NUL byte is no text of ids (a binary token shard, say): said as such, not as an
  // id whose quoted bytes the message's first NUL cut short (until 2026-12-07).
  if (const size_t nul = data.find('\0'); nul != std::string::npos)
    MT_FAIL("read_token_lines '{}': byte {} is a NUL: the file is not text; this takes lines of comma-separated "
            "token ids (a binary token shard is train's --data)", path, nul);
  std::vector<std::string_view> lines;
  std::string_view rest(data);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    lines.push_back(rest.substr(0, nl));
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  }
  while (!lines.empty() && trim(lines.back()).empty()) lines.pop_back();  // trailing blank lines
  MT_CHECK(!lines.empty(), "read_token_lines '{}': the file has no token lines", path);

  TokenRows out;
  out.rows = static_cast<int64_t>(lines.size());
  for (size_t li = 0; li < lines.size(); ++li) {
    const size_t line_no = li + 1;
    const std::string_view line = trim(lines[li]);
    MT_CHECK(!line.empty(), "read_token_lines '{}': line {} is blank (blank lines are allowed only at the end)",
             path, line_no);
    int64_t n = 0;
    size_t start = 0;
    while (true) {
      const size_t comma = line.find(',', start);
      const std::string_view field =
          trim(line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
      ++n;
      MT_CHECK(!field.empty(), "read_token_lines '{}': line {}, id {} is empty (two commas in a row or a "
               "comma at the end of the line?)", path, line_no, n);
      int64_t id = 0;
      const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), id);
      MT_CHECK(ec != std::errc::result_out_of_range, "read_token_lines '{}': line {}, id {}: '{}' is out of "
               "the int64 range", path, line_no, n, field);
      MT_CHECK(ec == std::errc() && end == field.data() + field.size(),
               "read_token_lines '{}': line {}, id {}: '{}' is not an integer token id", path, line_no, n, field);
      MT_CHECK(id >= 0, "read_token_lines '{}': line {}, id {}: token id {} is negative", path, line_no, n, id);
      out.ids.push_back(id);
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (li == 0) {
      out.cols = n;
    } else {
      MT_CHECK(n == out.cols, "read_token_lines '{}': line {} has {} ids, line 1 has {}", path, line_no, n,
               out.cols);
    }
  }
  return out;
}

void check_token_range(const TokenRows& rows, int64_t vocab_size, const std::string& path) {
  MT_ASSERT(static_cast<int64_t>(rows.ids.size()) == rows.rows * rows.cols);
  for (size_t i = 0; i < rows.ids.size(); ++i) {
    const int64_t id = rows.ids[i];
    MT_CHECK(id >= 0 && id < vocab_size,
             "'{}': line {}, id {}: token id {} is out of range for vocab size {}", path,
             static_cast<int64_t>(i) / rows.cols + 1, static_cast<int64_t>(i) % rows.cols + 1, id,
             vocab_size);
  }
}

// ---- DataLoader ----

DataLoader::DataLoader(TokenStream tokens, int64_t batch, int64_t seq, int rank, int world, int64_t accum)
    : tokens_(std::move(tokens)), batch_(batch), seq_(seq), rank_(rank), world_(world), accum_(accum) {
  MT_CHECK(batch > 0 && seq > 0, "DataLoader: batch ({}) and sequence length ({}) must be positive", batch,
           seq);
  MT_CHECK(accum > 0, "DataLoader: accum ({}) must be positive", accum);
  MT_CHECK(world >= 1 && rank >= 0 && rank < world, "DataLoader: rank {} is not in [0, world {})", rank,
           world);
  // accum*W*B*T + 1 must not overflow: a huge batch would otherwise wrap to a window that "fits".
  int64_t window = 0;
  MT_CHECK(checked_mul(world, batch, &window) && checked_mul(window, seq, &window) &&
               checked_mul(window, accum, &window) && checked_add(window, 1, &window),
           "DataLoader: a window of accum {} x world {} x batch {} x seq {} tokens overflows int64 (the corpus has {} "
           "tokens)", accum, world, batch, seq, num_tokens());
  MT_CHECK(num_tokens() >= tokens_per_step() + 1,
           "DataLoader: the corpus has {} tokens, fewer than one global window of {}world {} x batch {} x "
           "seq {} + 1 = {} tokens",
           num_tokens(), accum > 1 ? fmt::format("accum {} x ", accum) : "", world, batch, seq,
           tokens_per_step() + 1);
}

void DataLoader::set_position(int64_t pos) {
  // num_tokens() >= tokens_per_step() + 1 (constructor), so the bounds below cannot overflow.
  MT_CHECK(pos >= 0 && pos <= num_tokens() - tokens_per_micro() - 1,
           "DataLoader::set_position: position {} leaves no room for a window of {} tokens in a corpus of {}",
           pos, tokens_per_micro() + 1, num_tokens());
  // A position where a micro-batch fits but not a whole step (saved before the wrap was decided per
  // step) is where the step rule wraps: the start.
  pos_ = pos + tokens_per_step() + 1 > num_tokens() ? 0 : pos;
  micro_ = 0;
}

TokenBatch DataLoader::next() {
  // x: [B, T], y: [B, T]; this rank's rows start at global row rank * B.
  // This rank's rows are one run of B*T + 1 tokens (each row's targets end where the next row's
  // inputs begin).
  const int64_t n = batch_ * seq_;
  std::vector<int64_t> run(static_cast<size_t>(n + 1));
  tokens_.copy(pos_ + static_cast<int64_t>(rank_) * n, n + 1, run.data());
  std::vector<int64_t> x(run.begin(), run.end() - 1), y(run.begin() + 1, run.end());
  pos_ += tokens_per_micro();
  if (++micro_ == accum_) {  // the step's last micro-batch: wrap when the next step does not fit
    micro_ = 0;
    if (pos_ + tokens_per_step() + 1 > num_tokens()) pos_ = 0;
  }
  return {from_vector<int64_t>(x, Shape{batch_, seq_}), from_vector<int64_t>(y, Shape{batch_, seq_})};
}

}  // namespace mt
