// Token ids to text with a Hugging Face tokenizer.json (decoding only), as the tokenizers library
// decodes: the ids become their tokens (the model's vocabulary, then the added tokens; special
// added tokens are left out), and the tokens go through the file's decoder, step by step. The
// decoders Llama-family checkpoints use are supported:
//   ByteLevel (GPT-2, Llama 3): each character of a token stands for one byte (GPT-2's table of
//     printable stand-ins for the 256 byte values); a token with a character outside the table
//     (an added token with a space) is its own UTF-8 bytes; invalid UTF-8 in the result becomes
//     U+FFFD, one per maximal invalid sequence;
//   Sequence of Replace (a string pattern), ByteFallback (<0xNN> tokens to bytes; a run of them
//     that is not valid UTF-8 becomes one U+FFFD per byte), Fuse, Strip, Metaspace and ByteLevel
//     (Llama 2, Mistral, Mixtral: Replace U+2581 by a space, ByteFallback, Fuse, Strip one
//     leading space);
//   Metaspace alone (U+2581 to a space; every U+2581 of the first token is dropped unless the
//     prepend scheme is "never").
// Encoding text: models/hf_encoder.h.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace mt {

class HfTokenDecoder {
 public:
  // DIR/tokenizer.json, or nullopt when the directory has none. A file that is not valid JSON, has
  // no vocabulary, or has a decoder step of another kind is an error naming the file and the step.
  static std::optional<HfTokenDecoder> from_dir(const std::string& dir);
  static HfTokenDecoder from_file(const std::string& path);

  // The text of `ids`: valid UTF-8. Ids the file does not define (a model's vocabulary padded
  // past the tokenizer's) are left out, as the tokenizers library does; `unknown`, when given,
  // receives how many.
  std::string decode(const std::vector<int64_t>& ids, int64_t* unknown = nullptr) const;
  // Whether the decoder is the byte-level one (GPT-2 / Llama 3 files).
  bool byte_level() const;

 private:
  // One step of the decoder.
  struct Step {
    enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
    Kind kind = Kind::kByteLevel;
    std::string from, to;         // kReplace: the pattern and its replacement
    uint32_t strip = ' ';         // kStrip: the code point stripped
    int64_t start = 0, stop = 0;  // kStrip: at most this many from the start / end
    bool drop_first = true;       // kMetaspace: its prepend scheme is not "never"
  };
  static Step parse_step(const nlohmann::json& step, const std::string& path, const std::string& prefix);
  static std::vector<std::string> run(const Step& step, std::vector<std::string> tokens);

  std::string path_;
  bool has_decoder_ = false;  // false: tokens joined by spaces; true: steps_ (maybe none) in order
  std::vector<Step> steps_;
  std::unordered_map<int64_t, std::string> tokens_;
  std::unordered_set<int64_t> special_;
};

}  // namespace mt
