// tokenizer.json encoding: added tokens, normalizer, pre-tokenizer, BPE, post-processor, in the
// tokenizers library's order (models/hf_encoder.h).
#include "models/hf_encoder.h"

#include <re2/re2.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <queue>
#include <nlohmann/json.hpp>

#include "models/json_io.h"
#include "models/utf8.h"
#include "runtime/error.h"

namespace mt {
namespace {

using nlohmann::json;
using utf8::replace_all;

// Oniguruma's Unicode `\s`: White_Space (U+0009-000D, U+0020, U+0085, U+00A0, U+1680,
// U+2000-200A, U+2028, U+2029, U+202F, U+205F, U+3000), as RE2 class members.
constexpr const char* kSpaceMembers =
    "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point at s[i] (valid UTF-8) and its length.
uint32_t code_point_at(std::string_view s, size_t i, size_t* len) {
  const int n = std::max(utf8::utf8_sequence(s, i), 1);
  *len = static_cast<size_t>(n);
  return utf8::code_points(s.substr(i, static_cast<size_t>(n)))[0];
}

}  // namespace

// Named, not anonymous: HfTokenEncoder::Impl holds Patterns, and a class's members should have
// types with linkage (GCC's -Wsubobject-linkage, which a unity build turns on for this file).
namespace hf_pretok {

// One alternative of a pattern, compiled; `not_before_nonspace`: it ended in `(?!\S)`.
struct Alt {
  std::unique_ptr<RE2> re;
  bool not_before_nonspace = false;
};

// A Split or ByteLevel pattern: a literal string, or a regex as its top-level alternatives.
struct Pattern {
  bool regex = false;
  std::string literal;
  std::vector<Alt> alts;

  // The non-overlapping matches in `s`, left to right: at each position the first alternative
  // that matches (a non-empty match) wins, as in a backtracking engine's leftmost-first search.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    if (!regex) {
      for (size_t i = 0; (i = s.find(literal, i)) != std::string_view::npos; i += literal.size())
        out.emplace_back(i, i + literal.size());
      return out;
    }
    const re2::StringPiece text(s.data(), s.size());
    for (size_t p = 0; p < s.size();) {
      size_t len = 0;
      for (const Alt& a : alts) {
        re2::StringPiece m;
        if (!a.re->Match(text, p, s.size(), RE2::ANCHOR_START, &m, 1) || m.empty()) continue;
        size_t end = p + m.size();
        if (a.not_before_nonspace) {
          // (?!\S): the end must be the text's end or a space; else the longest shorter match of
          // the alternative that ends so (the backtracking a Perl-style engine does).
          const auto ok_at = [&](size_t e) {
            size_t l = 0;
            return e == s.size() || is_space(code_point_at(s, e, &l));
          };
          size_t e = end;
          while (e > p && !(ok_at(e) && (e == end || a.re->Match(text, p, e, RE2::ANCHOR_BOTH, nullptr, 0)))) {
            --e;
            while (e > p && (static_cast<unsigned char>(s[e]) & 0xC0) == 0x80) --e;  // a character back
          }
          if (e == p) continue;
          end = e;
        }
        len = end - p;
        break;
      }
      if (len == 0) {
        size_t l = 0;
        code_point_at(s, p, &l);
        p += l;
        continue;
      }
      out.emplace_back(p, p + len);
      p += len;
    }
    return out;
  }
};

}  // namespace hf_pretok

namespace {

// The regex's top-level alternatives, each rewritten for RE2: `\s` and `\S` with Oniguruma's
// Unicode meaning; constructs whose meaning differs in RE2 (`\w`, `\d`, `\b`) or that RE2 lacks
// (lookaround other than a trailing `(?!\S)`, backreferences) refused.
std::shared_ptr<hf_pretok::Pattern> compile_regex(const std::string& src, const std::string& where) {
  auto pat = std::make_shared<hf_pretok::Pattern>();
  pat->regex = true;
  std::vector<std::string> alts(1);
  int depth = 0;
  bool in_class = false;
  for (size_t i = 0; i < src.size(); ++i) {
    const char c = src[i];
    std::string& cur = alts.back();
    if (c == '\\' && i + 1 < src.size()) {
      const char e = src[i + 1];
      ++i;
      if (e == 's') {
        if (!in_class) cur += '[';
        cur += kSpaceMembers;
        if (!in_class) cur += ']';
      } else if (e == 'S') {
        MT_CHECK(!in_class, "{}: the regex '{}' uses \\S inside a character class, which meshtrain cannot translate",
                 where, src.substr(0, 200));
        cur += "[^";
        cur += kSpaceMembers;
        cur += ']';
      } else if (std::string_view("wWdDbBkgG").find(e) != std::string_view::npos || (e >= '1' && e <= '9')) {
        MT_FAIL("{}: the regex '{}' uses \\{}, whose meaning meshtrain does not reproduce (Unicode \\w, \\d, \\b and "
                "backreferences are not supported)",
                where, src.substr(0, 200), e);
      } else {
        cur += c;
        cur += e;
      }
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      cur += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      cur += c;
      if (i + 1 < src.size() && src[i + 1] == '^') cur += src[++i];
      if (i + 1 < src.size() && src[i + 1] == ']') cur += src[++i];  // a leading ']' is a member
      continue;
    }
    if (c == '(' && i + 2 < src.size() && src[i + 1] == '?') {
      // A bare flag group, `(?i)`: in Oniguruma it applies to the rest of the pattern, across its
      // `|` (so to every later alternative), where RE2 scopes it to the alternative meshtrain
      // compiles it in. Refused rather than encoded otherwise; `(?i:...)` says its scope.
      size_t j = i + 2;
      while (j < src.size() && std::string_view("imsxU-").find(src[j]) != std::string_view::npos) ++j;
      MT_CHECK(!(j > i + 2 && j < src.size() && src[j] == ')'),
               "{}: the regex '{}' has the flag group '{}', which applies to the rest of the pattern across its "
               "alternatives; meshtrain cannot reproduce that (write the flags over what they cover, e.g. "
               "'(?i:...)')",
               where, src.substr(0, 200), src.substr(i, j + 1 - i));
    }
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == '|' && depth == 0) {
      alts.emplace_back();
      continue;
    }
    cur += c;
  }
  for (std::string& a : alts) {
    hf_pretok::Alt alt;
    const std::string tail = "(?![^" + std::string(kSpaceMembers) + "])";  // `(?!\S)` after the rewrite
    if (a.size() > tail.size() && a.compare(a.size() - tail.size(), tail.size(), tail) == 0) {
      a.resize(a.size() - tail.size());
      alt.not_before_nonspace = true;
    }
    RE2::Options opts;
    opts.set_log_errors(false);
    alt.re = std::make_unique<RE2>("(?:" + a + ")", opts);
    MT_CHECK(alt.re->ok(),
             "{}: the regex '{}' cannot be evaluated by meshtrain ({}: lookarounds other than a trailing (?!\\S) "
             "are not supported)",
             where, src.substr(0, 200), alt.re->error());
    pat->alts.push_back(std::move(alt));
  }
  return pat;
}

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex).
constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

struct HfTokenEncoder::Impl {
  struct Norm {
    bool prepend = false;  // else Replace
    std::string from, to;
  };
  struct PreTok {
    enum class Kind { kByteLevel, kSplit, kMetaspace } kind = Kind::kByteLevel;
    bool add_prefix_space = false;  // ByteLevel
    std::shared_ptr<hf_pretok::Pattern> pattern;  // ByteLevel with use_regex, Split
    bool removed = false;           // Split: behavior Removed (else Isolated)
    std::string replacement;        // Metaspace
    std::string scheme = "always";  // Metaspace: always, first, never
    bool split = true;              // Metaspace
  };
  struct Added {
    std::string content;
    int64_t id = 0;
    bool lstrip = false, rstrip = false;
  };
  struct Piece {
    std::string text;
    bool at_start = false;  // begins at the start of the input (Metaspace's "first")
  };

  std::string path;
  std::vector<Norm> norms;
  std::vector<PreTok> pretoks;
  std::vector<Added> added;  // longest first
  std::unordered_map<std::string, int64_t> vocab;
  std::unordered_map<std::string, int64_t> merge_rank;  // key(a, b) -> rank
  bool ignore_merges = false, byte_fallback = false, fuse_unk = false;
  std::optional<int64_t> unk;
  std::vector<std::vector<int64_t>> template_single;  // each item: ids; empty: the sequence
  bool has_template = false;
  std::unordered_map<uint8_t, uint32_t> byte_cp = utf8::code_point_of_byte();

  static std::string key(const std::string& a, const std::string& b) {
    return std::to_string(a.size()) + ':' + a + b;
  }

  std::vector<Piece> pre_tokenize(std::vector<Piece> pieces) const {
    for (const PreTok& t : pretoks) {
      std::vector<Piece> next;
      for (Piece& p : pieces) {
        std::vector<Piece> parts;
        if (t.kind == PreTok::Kind::kMetaspace) {
          std::string s = replace_all(p.text, " ", t.replacement);
          const bool starts = s.compare(0, t.replacement.size(), t.replacement) == 0;
          if (!starts && (t.scheme == "always" || (t.scheme == "first" && p.at_start))) s = t.replacement + s;
          if (!t.split) {
            parts.push_back({s, p.at_start});
          } else {  // MergedWithNext: each replacement starts a piece
            size_t b = 0;
            for (size_t k = s.find(t.replacement, 1); k != std::string::npos; k = s.find(t.replacement, k + 1)) {
              parts.push_back({s.substr(b, k - b), p.at_start && b == 0});
              b = k;
            }
            parts.push_back({s.substr(b), p.at_start && b == 0});
          }
        } else {
          std::string s = p.text;
          if (t.kind == PreTok::Kind::kByteLevel && t.add_prefix_space && s.compare(0, 1, " ") != 0) s = " " + s;
          if (!t.pattern) {
            parts.push_back({s, p.at_start});
          } else {
            size_t b = 0;
            for (const auto& [m0, m1] : t.pattern->find_all(s)) {
              if (m0 > b) parts.push_back({s.substr(b, m0 - b), p.at_start && b == 0});
              if (!t.removed) parts.push_back({s.substr(m0, m1 - m0), p.at_start && m0 == 0});
              b = m1;
            }
            if (b < s.size()) parts.push_back({s.substr(b), p.at_start && b == 0});
          }
          if (t.kind == PreTok::Kind::kByteLevel)
            for (Piece& q : parts) {
              std::string m;
              for (unsigned char c : q.text) m += utf8::utf8_of(byte_cp.at(c));
              q.text = std::move(m);
            }
        }
        for (Piece& q : parts)
          if (!q.text.empty()) next.push_back(std::move(q));
      }
      pieces = std::move(next);
    }
    return pieces;
  }

  // BPE: the piece's characters (or their <0xNN> bytes, or the unknown token), then the
  // lowest-ranked adjacent pair merged, leftmost first, until no pair has a merge.
  void bpe(const std::string& piece, std::vector<int64_t>& out) const {
    if (ignore_merges)
      if (auto it = vocab.find(piece); it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    std::vector<std::string> sym;
    std::vector<char> is_unk;
    for (size_t i = 0; i < piece.size();) {
      size_t l = 0;
      code_point_at(piece, i, &l);
      const std::string ch = piece.substr(i, l);
      i += l;
      if (vocab.count(ch)) {
        sym.push_back(ch);
        is_unk.push_back(0);
        continue;
      }
      if (byte_fallback) {
        std::vector<std::string> bytes;
        for (unsigned char b : ch) {
          std::string t = fmt::format("<0x{:02X}>", b);
          if (!vocab.count(t)) break;
          bytes.push_back(std::move(t));
        }
        if (bytes.size() == ch.size()) {
          for (std::string& b : bytes) {
            sym.push_back(std::move(b));
            is_unk.push_back(0);
          }
          continue;
        }
      }
      if (!unk) continue;  // no unknown token: the character is dropped, as the library does
      if (fuse_unk && !is_unk.empty() && is_unk.back()) continue;
      sym.push_back("");
      is_unk.push_back(1);
    }
    // Merges in rank order, leftmost first among equal ranks (a heap of candidate pairs; a pair
    // whose symbols changed since it was pushed is stale and skipped): O(n log n), as a piece can be
    // a whole document when there is no pre-tokenizer (Llama 2).
    const size_t n = sym.size();
    std::vector<int64_t> prev(n), next(n);
    std::vector<uint32_t> version(n, 0);
    std::vector<char> alive(n, 1);
    for (size_t i = 0; i < n; ++i) {
      prev[i] = static_cast<int64_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<int64_t>(i) + 1 : -1;
    }
    struct Cand {
      int64_t rank, left, right;
      uint32_t vl, vr;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    const auto push = [&](int64_t l, int64_t r) {
      if (l < 0 || r < 0 || is_unk[static_cast<size_t>(l)] || is_unk[static_cast<size_t>(r)]) return;
      auto it = merge_rank.find(key(sym[static_cast<size_t>(l)], sym[static_cast<size_t>(r)]));
      if (it != merge_rank.end())
        heap.push({it->second, l, r, version[static_cast<size_t>(l)], version[static_cast<size_t>(r)]});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i), static_cast<int64_t>(i) + 1);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const auto l = static_cast<size_t>(c.left), r = static_cast<size_t>(c.right);
      if (!alive[l] || !alive[r] || next[l] != c.right || version[l] != c.vl || version[r] != c.vr) continue;
      sym[l] += sym[r];
      alive[r] = 0;
      ++version[l];
      next[l] = next[r];
      if (next[r] >= 0) prev[static_cast<size_t>(next[r])] = c.left;
      push(prev[l], c.left);
      push(c.left, next[l]);
    }
    for (size_t i = 0; i < n; ++i) {
      if (!alive[i]) continue;
      if (is_unk[i]) {
        out.push_back(*unk);
        continue;
      }
      auto it = vocab.find(sym[i]);
      MT_CHECK(it != vocab.end(), "{}: the merge giving '{}' has no vocabulary entry", path, sym[i].substr(0, 80));
      out.push_back(it->second);
    }
  }

  void encode_segment(const std::string& seg, bool at_start, std::vector<int64_t>& out) const {
    std::string s = seg;
    for (const Norm& n : norms) {
      if (n.prepend) {
        if (!s.empty()) s = n.to + s;
      } else {
        s = replace_all(s, n.from, n.to);
      }
    }
    if (s.empty()) return;
    for (const Piece& p : pre_tokenize({{s, at_start}})) bpe(p.text, out);
  }
};

std::optional<HfTokenEncoder> HfTokenEncoder::from_dir(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / "tokenizer.json";
  if (!std::filesystem::exists(p)) return std::nullopt;
  return from_file(p.string());
}

HfTokenEncoder HfTokenEncoder::from_file(const std::string& path) {
  const json j = read_json_file(path, "tokenizer.json");
  MT_CHECK(j.is_object(), "{}: not a JSON object (a Hugging Face tokenizer.json)", path);
  auto impl = std::make_shared<Impl>();
  Impl& d = *impl;
  d.path = path;
  const JsonFields top(j, path);
  // The model.
  const JsonFields model(top.at("model"), path, "model.");
  const std::string type = model.get_string("type", "BPE");
  MT_CHECK(type == "BPE", "{}: model.type is '{}'; meshtrain encodes with BPE models only", path, type.substr(0, 80));
  MT_CHECK(!model.has("dropout") || model.get_double("dropout", 0) == 0,
           "{}: field 'model.dropout' is set; meshtrain encodes deterministically (no BPE dropout)", path);
  MT_CHECK(model.get_string("continuing_subword_prefix", "").empty() && model.get_string("end_of_word_suffix", "").empty(),
           "{}: fields 'model.continuing_subword_prefix' / 'model.end_of_word_suffix' are not supported", path);
  d.ignore_merges = model.get_bool("ignore_merges", false);
  d.byte_fallback = model.get_bool("byte_fallback", false);
  d.fuse_unk = model.get_bool("fuse_unk", false);
  const json& vocab = model.at("vocab");
  MT_CHECK(vocab.is_object(), "{}: field 'model.vocab' must be an object (token -> id)", path);
  for (const auto& [tok, id] : vocab.items()) {
    MT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: model.vocab['{}'] is not a token id", path,
             tok.substr(0, 80));
    d.vocab[tok] = id.get<int64_t>();
  }
  if (model.has("unk_token")) {
    const std::string u = model.string_at("unk_token");
    auto it = d.vocab.find(u);
    MT_CHECK(it != d.vocab.end(), "{}: model.unk_token '{}' is not in the vocabulary", path, u.substr(0, 80));
    d.unk = it->second;
  }
  const json& merges = model.at("merges");
  MT_CHECK(merges.is_array(), "{}: field 'model.merges' must be a list", path);
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    std::string a, b;
    if (m.is_string()) {  // "a b" (older files)
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      MT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
               "{}: model.merges[{}] '{}' is not two tokens separated by one space", path, r, s.substr(0, 80));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      MT_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
               "{}: model.merges[{}] is neither \"a b\" nor [a, b]", path, r);
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    d.merge_rank.emplace(Impl::key(a, b), static_cast<int64_t>(r));  // a repeated pair keeps its first rank
  }
  // Added tokens.
  std::vector<std::string> normalized_added;
  if (top.has("added_tokens")) {
    const json& added = top.at("added_tokens");
    MT_CHECK(added.is_array(), "{}: field 'added_tokens' must be a list", path);
    for (size_t i = 0; i < added.size(); ++i) {
      const JsonFields a(added[i], path, fmt::format("added_tokens[{}].", i));
      Impl::Added t{a.string_at("content"), a.int_at("id", 0), a.get_bool("lstrip", false), a.get_bool("rstrip", false)};
      MT_CHECK(!a.get_bool("single_word", false),
               "{}: added token '{}' is single_word, which meshtrain does not encode (added_tokens[{}])", path,
               t.content.substr(0, 80), i);
      // A `normalized` token (the default for non-special ones) is matched in the normalized text by
      // the library; meshtrain matches added tokens in the raw text, which is the same only without
      // a normalizer (checked below, once the normalizer is read).
      if (a.get_bool("normalized", !a.get_bool("special", false))) normalized_added.push_back(t.content);
      if (!t.content.empty()) d.added.push_back(std::move(t));
    }
    std::stable_sort(d.added.begin(), d.added.end(),
                     [](const Impl::Added& x, const Impl::Added& y) { return x.content.size() > y.content.size(); });
  }
  // Normalizer.
  auto norm = [&](const json& n, const std::string& prefix) {
    if (n.is_null()) return;
    const JsonFields f(n, path, prefix);
    const std::string t = f.get_string("type", "");
    if (t == "Prepend") {
      d.norms.push_back({true, "", f.string_at("prepend")});
    } else if (t == "Replace") {
      const JsonFields pattern(f.at("pattern"), path, prefix + "pattern.");
      MT_CHECK(!pattern.has("Regex"), "{}: field '{}pattern' is a regex; meshtrain encodes Replace of a string only",
               path, prefix);
      Impl::Norm r{false, pattern.string_at("String"), f.string_at("content")};
      MT_CHECK(!r.from.empty(), "{}: field '{}pattern.String' is empty", path, prefix);
      d.norms.push_back(std::move(r));
    } else {
      MT_FAIL("{}: normalizer type '{}' ({}type) is not supported (meshtrain encodes with Prepend, Replace and "
              "Sequences of them)",
              path, t.empty() ? std::string("(none)") : t.substr(0, 80), prefix);
    }
  };
  if (top.has("normalizer"))
    for_each_sequence_step(top.at("normalizer"), path, "normalizer.", "normalizer", "normalizers", norm);
  MT_CHECK(d.norms.empty() || normalized_added.empty(),
           "{}: added token '{}' is 'normalized' (matched after the normalizer), which meshtrain does not encode with "
           "a normalizer present; set its \"normalized\" to false if it should match the raw text",
           path, normalized_added.empty() ? std::string() : normalized_added.front().substr(0, 80));
  // Pre-tokenizer.
  auto pre = [&](const json& n, const std::string& prefix) {
    if (n.is_null()) return;
    const JsonFields f(n, path, prefix);
    const std::string t = f.get_string("type", "");
    Impl::PreTok p;
    if (t == "ByteLevel") {
      p.kind = Impl::PreTok::Kind::kByteLevel;
      p.add_prefix_space = f.get_bool("add_prefix_space", true);
      if (f.get_bool("use_regex", true)) p.pattern = compile_regex(kGpt2Regex, path + ": GPT-2's pre-tokenizer");
    } else if (t == "Split") {
      p.kind = Impl::PreTok::Kind::kSplit;
      const JsonFields pattern(f.at("pattern"), path, prefix + "pattern.");
      if (pattern.has("Regex")) {
        p.pattern = compile_regex(pattern.string_at("Regex"), path + ": field '" + prefix + "pattern.Regex'");
      } else {
        p.pattern = std::make_shared<hf_pretok::Pattern>();
        p.pattern->literal = pattern.string_at("String");
        MT_CHECK(!p.pattern->literal.empty(), "{}: field '{}pattern.String' is empty", path, prefix);
      }
      const std::string behavior = f.get_string("behavior", "Isolated");
      MT_CHECK(behavior == "Isolated" || behavior == "Removed",
               "{}: field '{}behavior' is '{}'; meshtrain splits Isolated or Removed only", path, prefix,
               behavior.substr(0, 80));
      p.removed = behavior == "Removed";
      MT_CHECK(!f.get_bool("invert", false), "{}: field '{}invert' is true, which meshtrain does not encode", path,
               prefix);
    } else if (t == "Metaspace") {
      p.kind = Impl::PreTok::Kind::kMetaspace;
      p.replacement = f.get_string("replacement", "\xE2\x96\x81");
      MT_CHECK(utf8::code_points(p.replacement).size() == 1, "{}: field '{}replacement' must be one character", path,
               prefix);
      p.scheme = f.get_string("prepend_scheme", f.get_bool("add_prefix_space", true) ? "always" : "never");
      MT_CHECK(p.scheme == "always" || p.scheme == "first" || p.scheme == "never",
               "{}: field '{}prepend_scheme' must be always, first or never, got '{}'", path, prefix,
               p.scheme.substr(0, 80));
      p.split = f.get_bool("split", true);
    } else {
      MT_FAIL("{}: pre-tokenizer type '{}' ({}type) is not supported (meshtrain encodes with ByteLevel, Split, "
              "Metaspace and Sequences of them)",
              path, t.empty() ? std::string("(none)") : t.substr(0, 80), prefix);
    }
    d.pretoks.push_back(std::move(p));
  };
  if (top.has("pre_tokenizer"))
    for_each_sequence_step(top.at("pre_tokenizer"), path, "pre_tokenizer.", "pre-tokenizer", "pretokenizers", pre);
  // Post-processor.
  auto post = [&](const json& n, const std::string& prefix) {
    if (n.is_null()) return;
    const JsonFields f(n, path, prefix);
    const std::string t = f.get_string("type", "");
    if (t == "ByteLevel") {
      // offsets only: the ids are unchanged
    } else if (t == "TemplateProcessing") {
      MT_CHECK(!d.has_template, "{}: two TemplateProcessing post-processors", path);
      d.has_template = true;
      const json& single = f.at("single");
      MT_CHECK(single.is_array(), "{}: field '{}single' must be a list", path, prefix);
      const json& specials = f.at("special_tokens");
      bool has_sequence = false;
      for (const json& item : single) {
        const JsonFields it(item, path, prefix + "single[].");
        if (it.has("Sequence")) {
          d.template_single.emplace_back();
          has_sequence = true;
          continue;
        }
        const std::string name = JsonFields(it.at("SpecialToken"), path, prefix + "single[].SpecialToken.").string_at("id");
        MT_CHECK(specials.is_object() && specials.contains(name),
                 "{}: the template's special token '{}' is not in '{}special_tokens'", path, name.substr(0, 80), prefix);
        const JsonFields sp(specials[name], path, prefix + "special_tokens." + name + ".");
        const json& ids = sp.at("ids");
        MT_CHECK(ids.is_array(), "{}: field '{}special_tokens.{}.ids' must be a list", path, prefix, name);
        std::vector<int64_t> v;
        for (const json& id : ids) {
          MT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: '{}special_tokens.{}.ids' holds a non-id",
                   path, prefix, name);
          v.push_back(id.get<int64_t>());
        }
        MT_CHECK(!v.empty(), "{}: '{}special_tokens.{}.ids' is empty", path, prefix, name);
        d.template_single.push_back(std::move(v));
      }
      MT_CHECK(has_sequence, "{}: field '{}single' has no Sequence item", path, prefix);
    } else {
      MT_FAIL("{}: post-processor type '{}' ({}type) is not supported (meshtrain encodes with TemplateProcessing, "
              "ByteLevel and Sequences of them)",
              path, t.empty() ? std::string("(none)") : t.substr(0, 80), prefix);
    }
  };
  if (top.has("post_processor"))
    for_each_sequence_step(top.at("post_processor"), path, "post_processor.", "post-processor", "processors", post);
  HfTokenEncoder e;
  e.impl_ = std::move(impl);
  return e;
}

bool HfTokenEncoder::defines(int64_t id) const {
  for (const Impl::Added& a : impl_->added)
    if (a.id == id) return true;
  for (const auto& [tok, v] : impl_->vocab)
    if (v == id) return true;
  return false;
}

std::vector<int64_t> HfTokenEncoder::encode(const std::string& text, bool add_special_tokens) const {
  const Impl& d = *impl_;
  for (size_t i = 0; i < text.size();) {
    const int n = utf8::utf8_sequence(text, i);
    MT_CHECK(n > 0, "{}: the text to encode is not valid UTF-8 (at byte {})", d.path, i);
    i += static_cast<size_t>(n);
  }
  // Added tokens first: at each position the longest that starts there; lstrip / rstrip take the
  // whitespace beside a match out of the text around it.
  std::vector<int64_t> ids;
  size_t seg = 0;  // the start of the text not yet encoded
  const auto flush = [&](size_t end) {
    if (end > seg) d.encode_segment(text.substr(seg, end - seg), seg == 0, ids);
  };
  for (size_t i = 0; i < text.size();) {
    const Impl::Added* hit = nullptr;
    if (!d.added.empty())
      for (const Impl::Added& a : d.added)
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
    if (!hit) {
      size_t l = 0;
      code_point_at(text, i, &l);
      i += l;
      continue;
    }
    size_t b = i, e = i + hit->content.size();
    if (hit->lstrip)
      while (b > seg) {
        size_t k = b - 1, l = 0;
        while (k > seg && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        if (!is_space(code_point_at(text, k, &l))) break;
        b = k;
      }
    if (hit->rstrip)
      while (e < text.size()) {
        size_t l = 0;
        if (!is_space(code_point_at(text, e, &l))) break;
        e += l;
      }
    flush(b);
    ids.push_back(hit->id);
    seg = i = e;
  }
  flush(text.size());
  if (!add_special_tokens || !d.has_template) return ids;
  std::vector<int64_t> out;
  for (const std::vector<int64_t>& item : d.template_single)
    out.insert(out.end(), item.empty() ? ids.begin() : item.begin(), item.empty() ? ids.end() : item.end());
  return out;
}

}  // namespace mt
