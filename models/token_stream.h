// A token stream for the DataLoader (models/data.h): tokens in memory, or one or more llm.c token
// shards memory-mapped and read in place, concatenated in the order given. A mapped corpus costs
// no memory up front and its pages are shared by every rank of a node through the page cache:
// before, each rank held the whole shard twice as int32 (8 ranks x a 2-billion-token shard held
// 128 GB). Copies of a TokenStream share the tokens. docs/data.md, "Several shards".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt {

class TokenStream {
 public:
  TokenStream() = default;
  // Tokens held in memory (the embedded corpus, tests); implicit, so that a vector still makes a
  // DataLoader.
  TokenStream(std::vector<int32_t> tokens);  // NOLINT(google-explicit-constructor)
  // Each file checked as read_token_file checks it (magic, version, size against the header's
  // count), then mapped; throws naming the file. At least one file.
  static TokenStream map_files(const std::vector<std::string>& paths);

  int64_t size() const { return size_; }
  // Tokens [pos, pos + n) as int64, across shard boundaries; pos and n must lie in [0, size()].
  void copy(int64_t pos, int64_t n, int64_t* out) const;
  // The first token at or after `from` outside [0, vocab), or -1 when there is none: scans the
  // tokens (a mapped corpus is read once, at the disk's speed).
  int64_t find_outside(int64_t vocab, int64_t from = 0) const;
  // Where token `pos` lies, for messages: "FILE position P" (or "position P" in memory).
  std::string where(int64_t pos) const;
  // The files, in order (empty in memory).
  std::vector<std::string> paths() const;
  // One pass over the tokens: how often each id of [0, vocab) occurs, or, where an id lies outside
  // [0, vocab), its position in `outside` (the counts then stop there). The start-up check of
  // `train` and its entropy line share the pass.
  struct IdCounts {
    std::vector<int64_t> counts;  // vocab entries
    int64_t outside = -1;         // the first position of an id outside [0, vocab), or -1
    // unigram_entropy (models/corpus.h) of the counted ids: the same sum in id order.
    double entropy() const;
  };
  IdCounts count_ids(int64_t vocab) const;
  // count_ids(vocab).entropy() of a stream whose ids must all lie in [0, vocab).
  double unigram_entropy(int64_t vocab) const;

 private:
  struct Shard {
    std::string path;
    std::shared_ptr<const unsigned char> data;  // the tokens (after the header), or the vector's
    bool in_memory = false;                     // int32 tokens of a vector; else a mapped file's
    int width = 4;                              // a file's bytes per token: 2 or 4 (little-endian)
    int64_t begin = 0, count = 0;               // position in the stream, tokens
  };
  size_t shard_at(int64_t pos) const;  // the index of the shard holding token `pos`
  std::vector<Shard> shards_;
  int64_t size_ = 0;
};

}  // namespace mt
