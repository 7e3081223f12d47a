// UTF-8 and byte-level helpers shared by the tokenizer.json decoder and encoder.
#include "models/utf8.h"

#include <algorithm>

namespace mt::utf8 {

// GPT-2's byte-level stand-ins: printable bytes stand for themselves, the other 68 byte values
// for the code points 256, 257, ... in byte order. Returns code point -> byte.
std::unordered_map<uint32_t, uint8_t> byte_of_code_point() {
  std::unordered_map<uint32_t, uint8_t> m;
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) m[printable(b) ? static_cast<uint32_t>(b) : next++] = static_cast<uint8_t>(b);
  return m;
}

// The length of the valid UTF-8 sequence at s[i], or, when there is none, minus the length of the
// maximal invalid subpart there (Unicode's "U+FFFD substitution of maximal subparts", which
// Rust's String::from_utf8_lossy follows): its lead byte and the continuation bytes that could
// still have completed a sequence.
int utf8_sequence(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  int n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k < n; ++k) {
    const size_t j = i + static_cast<size_t>(k);
    const auto d = j < s.size() ? static_cast<unsigned char>(s[j]) : 0;
    const bool ok = k == 1 ? d >= lo && d <= hi : d >= 0x80 && d <= 0xBF;
    if (j >= s.size() || !ok) return -k;
  }
  return n;
}

// The code points of valid UTF-8 text (tokens come from a parsed JSON file, which is valid UTF-8).
std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const int n = std::max(utf8_sequence(s, i), 1);
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// "<0xNN>" -> NN, else -1.
int byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = t[static_cast<size_t>(i)];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

std::unordered_map<uint8_t, uint32_t> code_point_of_byte() {
  std::unordered_map<uint8_t, uint32_t> m;
  for (const auto& [cp, b] : byte_of_code_point()) m[b] = cp;
  return m;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  for (size_t i = 0;;) {
    const size_t k = s.find(from, i);
    if (k == std::string::npos) return out.append(s, i, std::string::npos);
    out.append(s, i, k - i).append(to);
    i = k + from.size();
  }
}

}  // namespace mt::utf8
