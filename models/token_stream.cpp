// Token streams over memory or memory-mapped llm.c shards (token_stream.h).
#include "models/token_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "models/data.h"
#include "runtime/error.h"

namespace mt {

namespace {

int64_t token_at(const unsigned char* p, int width, int64_t i) {
  const unsigned char* q = p + i * width;
  if (width == 2) return static_cast<int64_t>(q[0]) | (static_cast<int64_t>(q[1]) << 8);
  return static_cast<int64_t>(q[0]) | (static_cast<int64_t>(q[1]) << 8) | (static_cast<int64_t>(q[2]) << 16) |
         (static_cast<int64_t>(q[3]) << 24);
}

}  // namespace

TokenStream::TokenStream(std::vector<int32_t> tokens) {
  auto held = std::make_shared<std::vector<int32_t>>(std::move(tokens));
  Shard s;
  s.count = static_cast<int64_t>(held->size());
  s.in_memory = true;
  s.data = std::shared_ptr<const unsigned char>(held, reinterpret_cast<const unsigned char*>(held->data()));
  size_ = s.count;
  shards_.push_back(std::move(s));
}

TokenStream TokenStream::map_files(const std::vector<std::string>& paths) {
  MT_CHECK(!paths.empty(), "TokenStream: no token files given");
  TokenStream out;
  for (const std::string& path : paths) {
    const TokenFileLayout layout = read_token_file_header(path);
    Shard s;
    s.path = path;
    s.width = layout.width;
    s.begin = out.size_;
    s.count = layout.count;
    const auto bytes = static_cast<size_t>(kTokenFileHeaderBytes + layout.count * layout.width);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MT_CHECK(fd >= 0, "read_token_file: cannot open '{}': {}", path, std::strerror(errno));
    // The size again, on the descriptor mapped: pages past the end of a file that shrank since its
    // header was checked would fault (SIGBUS) when read.
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
      ::close(fd);
      MT_FAIL("read_token_file '{}': the file changed size while it was opened ({} bytes expected)", path, bytes);
    }
    void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);  // the mapping keeps the file
    MT_CHECK(map != MAP_FAILED, "read_token_file '{}': cannot map its {} bytes: {}", path, bytes,
             std::strerror(map_errno));
    ::madvise(map, bytes, MADV_SEQUENTIAL);  // windows are read in order; a hint only
    const auto* base = static_cast<const unsigned char*>(map);
    std::shared_ptr<const unsigned char> whole(base, [bytes](const unsigned char* p) {
      ::munmap(const_cast<unsigned char*>(p), bytes);
    });
    s.data = std::shared_ptr<const unsigned char>(whole, base + kTokenFileHeaderBytes);
    out.size_ += s.count;
    out.shards_.push_back(std::move(s));
  }
  return out;
}

size_t TokenStream::shard_at(int64_t pos) const {
  // The last shard that begins at or before pos: an empty shard at pos comes before the one that
  // holds it, so this is the one that holds it (when pos < size()).
  auto it = std::upper_bound(shards_.begin(), shards_.end(), pos,
                             [](int64_t p, const Shard& s) { return p < s.begin; });
  MT_ASSERT(it != shards_.begin(), "TokenStream: position {} before the first shard", pos);
  return static_cast<size_t>(std::prev(it) - shards_.begin());
}

void TokenStream::copy(int64_t pos, int64_t n, int64_t* out) const {
  MT_CHECK(pos >= 0 && n >= 0 && pos <= size_ - n, "TokenStream: tokens [{}, {}) lie outside the {} tokens", pos,
           pos + n, size_);
  if (n == 0) return;
  for (auto it = shards_.begin() + static_cast<std::ptrdiff_t>(shard_at(pos)); n > 0; ++it) {
    const int64_t from = pos - it->begin, take = std::min(n, it->count - from);
    if (take <= 0) continue;  // an empty shard at this position
    if (it->in_memory) {
      const auto* v = reinterpret_cast<const int32_t*>(it->data.get());
      std::copy(v + from, v + from + take, out);
    } else {
      for (int64_t i = 0; i < take; ++i) out[i] = token_at(it->data.get(), it->width, from + i);
    }
    out += take;
    pos += take;
    n -= take;
  }
}

int64_t TokenStream::find_outside(int64_t vocab, int64_t from) const {
  for (const Shard& s : shards_) {
    if (s.begin + s.count <= from) continue;
    for (int64_t i = std::max<int64_t>(0, from - s.begin); i < s.count; ++i) {
      const int64_t t = s.in_memory ? reinterpret_cast<const int32_t*>(s.data.get())[i]
                                    : token_at(s.data.get(), s.width, i);
      if (t < 0 || t >= vocab) return s.begin + i;
    }
  }
  return -1;
}

std::string TokenStream::where(int64_t pos) const {
  if (shards_.empty() || pos < 0 || pos >= size_) return fmt::format("position {}", pos);
  const Shard& s = shards_[shard_at(pos)];
  return s.in_memory ? fmt::format("position {}", pos) : fmt::format("{} position {}", s.path, pos - s.begin);
}

std::vector<std::string> TokenStream::paths() const {
  std::vector<std::string> out;
  for (const Shard& s : shards_)
    if (!s.in_memory) out.push_back(s.path);
  return out;
}

TokenStream::IdCounts TokenStream::count_ids(int64_t vocab) const {
  MT_CHECK(vocab > 0, "count_ids: the vocabulary size must be positive, got {}", vocab);
  IdCounts r;
  r.counts.assign(static_cast<size_t>(vocab), 0);
  std::vector<int64_t> buf(size_t{1} << 16);
  for (int64_t pos = 0; pos < size_;) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(buf.size()), size_ - pos);
    copy(pos, n, buf.data());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = buf[static_cast<size_t>(i)];
      if (t < 0 || t >= vocab) {
        r.outside = pos + i;
        return r;
      }
      ++r.counts[static_cast<size_t>(t)];
    }
    pos += n;
  }
  return r;
}

double TokenStream::IdCounts::entropy() const {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  MT_CHECK(n > 0, "unigram_entropy: the token stream is empty");
  const double total = static_cast<double>(n);
  double h = 0.0;
  for (int64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / total;
    h -= p * std::log(p);
  }
  return h;
}

double TokenStream::unigram_entropy(int64_t vocab) const {
  const IdCounts c = count_ids(vocab);
  if (c.outside >= 0) {
    int64_t t = 0;
    copy(c.outside, 1, &t);
    MT_FAIL("unigram_entropy: token {} at {} is outside [0, {})", t, where(c.outside), vocab);
  }
  return c.entropy();
}

}  // namespace mt
