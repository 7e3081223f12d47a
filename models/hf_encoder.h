// Text to token ids with a Hugging Face tokenizer.json, as the tokenizers library's
// `Tokenizer.encode(text, add_special_tokens)` computes them, for the BPE tokenizers of the
// Llama family (docs/generate.md, "Tokenizers"):
//   added tokens: found first, in the raw text (leftmost, longest; `lstrip`/`rstrip` take the
//     whitespace beside them), each one id; the text between them is encoded as below;
//   normalizer: none, Prepend, Replace (a string pattern), or a Sequence of them (Llama 2);
//   pre-tokenizer: none, ByteLevel (GPT-2, its regex or not), Split (a string or a regex pattern,
//     Isolated or Removed; Llama 3's regex), Metaspace (Mistral, Mixtral), or a Sequence of them;
//   model: BPE (merges by rank; ignore_merges; byte_fallback to <0xNN> tokens; unk_token,
//     fuse_unk);
//   post-processor: none, ByteLevel (ids unchanged), TemplateProcessing (its `single` template:
//     the BOS of Llama 2 and 3), or a Sequence of them.
// Anything else (WordPiece or Unigram models, other normalizers such as NFKC, single_word added
// tokens, added tokens matched after a normalizer (`normalized`), a regex construct that needs backtracking beyond `\s+(?!\S)`) is refused when the file
// is read, with an error naming the file and the field, never encoded differently.
//
// Regexes run on RE2, with the Unicode meaning the library's Oniguruma gives `\s` (White_Space)
// and `\S`; a trailing `(?!\S)` of an alternative (GPT-2's and Llama 3's `\s+(?!\S)`) is
// evaluated by trying the alternative's shorter matches, as a backtracking engine would.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace mt {

class HfTokenEncoder {
 public:
  // DIR/tokenizer.json, or nullopt when the directory has none.
  static std::optional<HfTokenEncoder> from_dir(const std::string& dir);
  static HfTokenEncoder from_file(const std::string& path);

  // The ids of `text` (UTF-8; invalid bytes are an error). With add_special_tokens the
  // post-processor's template adds its tokens (Llama's BOS), as `tokenizer(text)` does.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;

  // Whether `id` is a token of the file (its vocabulary or an added token).
  bool defines(int64_t id) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace mt
