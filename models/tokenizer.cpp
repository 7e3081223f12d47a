// Byte tokenizer: a byte is its own token.
#include "models/tokenizer.h"

#include <filesystem>

#include "runtime/error.h"

namespace mt {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size());
  for (char c : text) tokens.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  return tokens;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    MT_CHECK(tokens[i] >= 0 && tokens[i] < kVocabSize,
             "ByteTokenizer::decode: token {} at position {} is outside the byte vocabulary [0, {})",
             tokens[i], i, kVocabSize);
    text.push_back(static_cast<char>(static_cast<unsigned char>(tokens[i])));
  }
  return text;
}

bool ByteTokenizer::is_byte_vocabulary(int64_t vocab_size, const std::string& hf_dir) {
  std::error_code ec;
  return vocab_size == kVocabSize &&
         (hf_dir.empty() || !std::filesystem::exists(std::filesystem::path(hf_dir) / "tokenizer.json", ec));
}

}  // namespace mt
