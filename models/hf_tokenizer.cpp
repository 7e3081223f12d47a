// tokenizer.json decoding: the tokenizers library's decoder steps (ByteLevel, Replace,
// ByteFallback, Fuse, Strip, Metaspace), applied to the list of tokens in order.
#include "models/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/json_io.h"
#include "models/utf8.h"
#include "runtime/error.h"

namespace mt {
namespace {

using nlohmann::json;
using utf8::byte_of_code_point;
using utf8::byte_token;
using utf8::code_points;
using utf8::replace_all;
using utf8::utf8_of;
using utf8::utf8_sequence;

constexpr const char* kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = utf8_sequence(s, i);
    if (n < 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

// `bytes` as UTF-8, with U+FFFD for each maximal invalid subpart.
std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int n = utf8_sequence(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      out += kReplacementChar;
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

constexpr const char* kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

}  // namespace


std::optional<HfTokenDecoder> HfTokenDecoder::from_dir(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / "tokenizer.json";
  if (!std::filesystem::exists(p)) return std::nullopt;
  return from_file(p.string());
}

HfTokenDecoder::Step HfTokenDecoder::parse_step(const json& s, const std::string& path, const std::string& prefix) {
  const JsonFields f(s, path, prefix);
  const std::string type = f.get_string("type", "");
  Step step;
  if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Step::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Step::Kind::kFuse;
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    const JsonFields pattern(f.at("pattern"), path, prefix + "pattern.");
    if (pattern.has("Regex"))
      MT_FAIL("{}: field '{}pattern' is a regex; meshtrain decodes Replace steps of a string pattern only", path,
              prefix);
    step.from = pattern.string_at("String");
    MT_CHECK(!step.from.empty(), "{}: field '{}pattern.String' is empty", path, prefix);
    step.to = f.string_at("content");
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    const std::vector<uint32_t> c = code_points(f.get_string("content", " "));
    MT_CHECK(c.size() == 1, "{}: field '{}content' must be one character", path, prefix);
    step.strip = c[0];
    step.start = f.get_int("start", 0);
    step.stop = f.get_int("stop", 0);
    MT_CHECK(step.start >= 0 && step.stop >= 0, "{}: fields '{}start' and '{}stop' must not be negative", path, prefix,
             prefix);
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    const std::vector<uint32_t> c = code_points(f.get_string("replacement", kSpaceMark));
    MT_CHECK(c.size() == 1, "{}: field '{}replacement' must be one character", path, prefix);
    step.from = utf8_of(c[0]);
    // prepend_scheme (tokenizers >= 0.15) or the older add_prefix_space; both absent is "always",
    // the library's default.
    // add_prefix_space false means "never" and contradicts another scheme, as the library reads it.
    const std::string scheme = f.get_string("prepend_scheme", "always");
    MT_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
             "{}: field '{}prepend_scheme' must be always, first or never, got '{}'", path, prefix, scheme.substr(0, 80));
    const bool prefix_space = f.get_bool("add_prefix_space", true);
    MT_CHECK(prefix_space || !f.has("prepend_scheme") || scheme == "never",
             "{}: fields '{}add_prefix_space' (false) and '{}prepend_scheme' ('{}') disagree", path, prefix, prefix,
             scheme);
    step.drop_first = prefix_space && scheme != "never";
  } else {
    MT_FAIL("{}: decoder type '{}' ({}type) is not supported (meshtrain decodes ByteLevel, Metaspace, and Sequences "
            "of Replace, ByteFallback, Fuse, Strip, Metaspace and ByteLevel)",
            path, type.empty() ? std::string("(none)") : type.substr(0, 80), prefix);
  }
  return step;
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
      MT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: model.vocab['{}'] is not a token id", path,
               tok.substr(0, 80));
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
      d.tokens_[id] = a["content"].get<std::string>();  // an added token wins over the vocabulary's
      if (JsonFields(a, path, "added_tokens[].").get_bool("special", false)) d.special_.insert(id);
    }
  }
  // The decoder: one step, or a Sequence of steps (nested Sequences flattened, 8 levels at most).
  // No decoder at all joins the tokens with spaces, as the tokenizers library does.
  const json dec = j.value("decoder", json());
  if (dec.is_null()) return d;
  d.has_decoder_ = true;
  for_each_sequence_step(dec, path, "decoder.", "decoder", "decoders", [&](const json& s, const std::string& prefix) {
    d.steps_.push_back(parse_step(s, path, prefix));
  });
  return d;
}

bool HfTokenDecoder::byte_level() const {
  return steps_.size() == 1 && steps_[0].kind == Step::Kind::kByteLevel;
}

std::vector<std::string> HfTokenDecoder::run(const Step& step, std::vector<std::string> tokens) {
  static const std::unordered_map<uint32_t, uint8_t> bytes = byte_of_code_point();
  switch (step.kind) {
    case Step::Kind::kByteLevel: {
      // Each token's characters to bytes; a token with a character outside the table is its own
      // UTF-8. One string: a character may span tokens.
      std::string raw;
      for (const std::string& t : tokens) {
        std::string b;
        for (uint32_t cp : code_points(t)) {
          auto it = bytes.find(cp);
          if (it == bytes.end()) {
            b = t;
            break;
          }
          b.push_back(static_cast<char>(it->second));
        }
        raw += b;
      }
      return {utf8_lossy(raw)};
    }
    case Step::Kind::kReplace:
      for (std::string& t : tokens) t = replace_all(t, step.from, step.to);
      return tokens;
    case Step::Kind::kByteFallback: {
      // A run of <0xNN> tokens becomes its text when it is valid UTF-8, else one U+FFFD per byte.
      std::vector<std::string> out;
      std::string run;
      auto flush = [&] {
        if (run.empty()) return;
        if (valid_utf8(run)) {
          out.push_back(run);
        } else {
          for (size_t k = 0; k < run.size(); ++k) out.emplace_back(kReplacementChar);
        }
        run.clear();
      };
      for (std::string& t : tokens) {
        const int b = byte_token(t);
        if (b >= 0) {
          run.push_back(static_cast<char>(b));
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      return out;
    }
    case Step::Kind::kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      return {all};
    }
    case Step::Kind::kStrip:
      for (std::string& t : tokens) {
        const std::vector<uint32_t> cps = code_points(t);
        size_t begin = 0, end = cps.size();
        while (begin < end && begin < static_cast<size_t>(step.start) && cps[begin] == step.strip) ++begin;
        for (int64_t k = 0; k < step.stop && end > begin && cps[end - 1] == step.strip; ++k) --end;
        std::string s;
        for (size_t k = begin; k < end; ++k) s += utf8_of(cps[k]);
        t = std::move(s);
      }
      return tokens;
    case Step::Kind::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = replace_all(tokens[i], step.from, i == 0 && step.drop_first ? "" : " ");
      return tokens;
  }
  return tokens;
}

std::string HfTokenDecoder::decode(const std::vector<int64_t>& ids, int64_t* unknown) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  if (unknown) *unknown = 0;
  for (int64_t id : ids) {
    auto it = tokens_.find(id);
    if (it == tokens_.end()) {  // left out, as the tokenizers library does (a padded vocabulary)
      if (unknown) ++*unknown;
      continue;
    }
    if (!special_.count(id)) tokens.push_back(it->second);
  }
  if (!has_decoder_) {  // no decoder: the tokens joined with spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const Step& step : steps_) tokens = run(step, std::move(tokens));
  std::string out;
  for (const std::string& t : tokens) out += t;
  return utf8_lossy(out);  // valid already, unless a Replace step split a character
}

}  // namespace mt
