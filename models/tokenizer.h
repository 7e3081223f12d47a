// Byte-level tokenizer: token id = byte value, vocab 256. It needs no vocabulary file, so the
// embedded corpus and any text can be trained on without downloads; real BPE tokens arrive
// pre-tokenized in llm.c .bin shards (data.h) instead.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

class ByteTokenizer {
 public:
  static constexpr int64_t kVocabSize = 256;

  int64_t vocab_size() const { return kVocabSize; }
  // Every byte becomes one token in [0, 256).
  std::vector<int32_t> encode(std::string_view text) const;
  // Throws naming the position and id when a token is outside [0, 256).
  std::string decode(const std::vector<int32_t>& tokens) const;

  // Whether a model of `vocab_size` tokens whose checkpoint is `hf_dir` ("" for a built-in or
  // --config model) reads and writes bytes: 256 tokens and no tokenizer.json in the directory
  // (a BPE of 256 tokens trained on the data names itself there, and is used).
  static bool is_byte_vocabulary(int64_t vocab_size, const std::string& hf_dir);
};

}  // namespace mt
