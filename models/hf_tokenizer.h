// Token ids to text with a Hugging Face tokenizer.json (decoding only): the vocabulary of its
// model plus its added tokens, and one of the two decoders Llama-family checkpoints use:
//   byte-level (GPT-2, Llama 3): each character of a token stands for one byte (GPT-2's table of
//     printable stand-ins for the 256 byte values);
//   SentencePiece style (Llama 2, Mistral, Mixtral): U+2581 for a space, <0xNN> byte tokens, and
//     the space the tokenizer put before the first word removed.
// Encoding text is not implemented (a BPE encoder must reproduce the tokenizer's pre-tokenizer
// exactly); prompts for such models are token ids (docs/generate.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace mt {

class HfTokenDecoder {
 public:
  // DIR/tokenizer.json, or nullopt when the directory has none. A file that is not valid JSON, has
  // no vocabulary, or has a decoder of another kind is an error naming the file and what is wrong.
  static std::optional<HfTokenDecoder> from_dir(const std::string& dir);
  static HfTokenDecoder from_file(const std::string& path);

  // The text of `ids`; special added tokens (<|begin_of_text|>, <s>, ...) are left out. An id the
  // file does not define is an error naming it and its position.
  std::string decode(const std::vector<int64_t>& ids) const;
  bool byte_level() const { return style_ == Style::kByteLevel; }

 private:
  enum class Style { kByteLevel, kSentencePiece };
  std::string path_;
  Style style_ = Style::kByteLevel;
  bool strip_first_space_ = false;
  std::unordered_map<int64_t, std::string> tokens_;
  std::unordered_set<int64_t> literal_;  // added tokens: their content is the text itself
  std::unordered_set<int64_t> special_;
};

}  // namespace mt
