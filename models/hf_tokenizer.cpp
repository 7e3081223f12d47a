// tokenizer.json decoding: byte-level and SentencePiece-style decoders.
#include "models/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/json_io.h"
#include "runtime/error.h"

namespace mt {
namespace {

using nlohmann::json;

// GPT-2's byte-level stand-ins: printable bytes stand for themselves, the other 68 byte values
// for the code points 256, 257, ... in byte order. Returns code point -> byte.
std::unordered_map<uint32_t, uint8_t> byte_of_code_point() {
  std::unordered_map<uint32_t, uint8_t> m;
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) m[printable(b) ? static_cast<uint32_t>(b) : next++] = static_cast<uint8_t>(b);
  return m;
}

// The code points of UTF-8 text; an invalid sequence is an error naming the token.
std::vector<uint32_t> code_points(const std::string& s, int64_t id, const std::string& path) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    MT_CHECK(n > 0 && i + static_cast<size_t>(n) <= s.size(), "{}: token {} is not valid UTF-8", path, id);
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      MT_CHECK((d >> 6) == 0x2, "{}: token {} is not valid UTF-8", path, id);
      cp = (cp << 6) | (d & 0x3F);
    }
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
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

constexpr const char* kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

}  // namespace

std::optional<HfTokenDecoder> HfTokenDecoder::from_dir(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / "tokenizer.json";
  if (!std::filesystem::exists(p)) return std::nullopt;
  return from_file(p.string());
}

HfTokenDecoder HfTokenDecoder::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "{}: cannot open the tokenizer file", path);
  json j = json::parse(in, nullptr, false);
  MT_CHECK(!j.is_discarded() && j.is_object(), "{}: not a JSON object (a Hugging Face tokenizer.json)", path);
  HfTokenDecoder d;
  d.path_ = path;
  MT_CHECK(j.contains("model") && j["model"].is_object() && j["model"].contains("vocab"),
           "{}: no model.vocab (a tokenizer.json has the model's vocabulary there)", path);
  const json& vocab = j["model"]["vocab"];
  if (vocab.is_object()) {  // BPE / WordPiece: token -> id
    for (const auto& [tok, id] : vocab.items()) {
      MT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: model.vocab['{}'] is not a token id", path, tok);
      d.tokens_[id.get<int64_t>()] = tok;
    }
  } else if (vocab.is_array()) {  // Unigram: [[token, score], ...], the id is the index
    for (size_t i = 0; i < vocab.size(); ++i) {
      MT_CHECK(vocab[i].is_array() && !vocab[i].empty() && vocab[i][0].is_string(),
               "{}: model.vocab[{}] is not [token, score]", path, i);
      d.tokens_[static_cast<int64_t>(i)] = vocab[i][0].get<std::string>();
    }
  } else {
    MT_FAIL("{}: model.vocab is neither an object nor a list", path);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      MT_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                   a["content"].is_string(),
               "{}: an added_tokens entry lacks an integer id or a content string", path);
      const int64_t id = a["id"].get<int64_t>();
      d.tokens_[id] = a["content"].get<std::string>();
      d.literal_.insert(id);
      if (JsonFields(a, path, "added_tokens[].").get_bool("special", false)) d.special_.insert(id);
    }
  }
  // The decoder: ByteLevel, or SentencePiece-style (Metaspace, or a Sequence of Replace U+2581,
  // ByteFallback, Fuse, Strip).
  const json dec = j.value("decoder", json());
  const JsonFields decf(dec, path, "decoder.");
  const std::string type = decf.get_string("type", "");
  if (type == "ByteLevel") {
    d.style_ = Style::kByteLevel;
  } else if (type == "Metaspace") {
    d.style_ = Style::kSentencePiece;
    const std::string scheme = decf.get_string("prepend_scheme", "");
    d.strip_first_space_ = decf.get_bool("add_prefix_space", false) || scheme == "first" || scheme == "always";
  } else if (type == "Sequence" && dec.contains("decoders") && dec["decoders"].is_array()) {
    bool space = false;
    for (const json& s : dec["decoders"]) {
      const JsonFields step(s, path, "decoder.decoders[].");
      const std::string t = step.get_string("type", "");
      if (t == "Replace" && s.contains("pattern") && s["pattern"].is_object() &&
          JsonFields(s["pattern"], path, "decoder.decoders[].pattern.").get_string("String", "") == kSpaceMark)
        space = true;
      if (t == "ByteLevel") MT_FAIL("{}: a ByteLevel decoder inside a Sequence is not supported", path);
      if (t == "Strip" && step.get_int("start", 0) > 0) d.strip_first_space_ = true;
    }
    MT_CHECK(space, "{}: a Sequence decoder without Replace of U+2581 by a space is not a SentencePiece-style decoder "
             "meshtrain knows", path);
    d.style_ = Style::kSentencePiece;
  } else {
    MT_FAIL("{}: decoder type '{}' is not supported (meshtrain decodes ByteLevel and SentencePiece-style "
            "tokenizers)", path, type.empty() ? std::string("(none)") : type);
  }
  return d;
}

std::string HfTokenDecoder::decode(const std::vector<int64_t>& ids) const {
  static const std::unordered_map<uint32_t, uint8_t> bytes = byte_of_code_point();
  std::string out;
  bool first = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    auto it = tokens_.find(id);
    MT_CHECK(it != tokens_.end(), "{}: token id {} (position {}) is not in the vocabulary", path_, id, i);
    if (special_.count(id)) continue;
    const std::string& tok = it->second;
    if (literal_.count(id)) {
      out += tok;
    } else if (style_ == Style::kByteLevel) {
      for (uint32_t cp : code_points(tok, id, path_)) {
        auto b = bytes.find(cp);
        MT_CHECK(b != bytes.end(), "{}: token {} ('{}') has a character that stands for no byte", path_, id, tok);
        out.push_back(static_cast<char>(b->second));
      }
    } else {
      const int b = byte_token(tok);
      if (b >= 0) {
        out.push_back(static_cast<char>(b));
      } else {
        std::string piece;
        for (size_t k = 0; k < tok.size();) {
          if (tok.compare(k, 3, kSpaceMark) == 0) {
            piece.push_back(' ');
            k += 3;
          } else {
            piece.push_back(tok[k++]);
          }
        }
        if (first && strip_first_space_ && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
        out += piece;
      }
    }
    first = false;
  }
  return out;
}

}  // namespace mt
