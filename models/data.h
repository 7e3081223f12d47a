// Training and evaluation data: llm.c token shards (.bin), text token files (one sequence of
// comma-separated ids per line, for eval / grad tools), and a deterministic DataLoader that cuts
// [B, T] input/target batches from a token stream, with an exact resume position and a
// rank/world split whose union is the single-process batch. See docs/data.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/token_stream.h"
#include "tensor/tensor.h"

namespace mt {

// ---- llm.c token shards ----
// Header: 256 little-endian int32 = [magic, version, num_tokens, 0...], then the tokens.
//   magic 20240520, version 1: uint16 tokens (GPT-2 style).
//   magic 20240801, version 7: uint32 tokens (llama-3 style; the version llm.c's
//   dev/data/data_common.py writes). Version 2 is also read for this magic.
constexpr int32_t kTokenFileMagicU16 = 20240520;
constexpr int32_t kTokenFileVersionU16 = 1;
constexpr int32_t kTokenFileMagicU32 = 20240801;
constexpr int32_t kTokenFileVersionU32 = 7;
constexpr int64_t kTokenFileHeaderInts = 256;
constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

// Writes uint16 tokens (magic 20240520) when every token is < 65536, else uint32 (magic
// 20240801). Tokens must be >= 0. Atomic: writes "<path>.tmp.<pid>" and renames it.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens);
// Reads either layout. Throws naming the file when it is missing, shorter than the header, has
// a bad magic or an unsupported version, or a size that does not match the token count.
std::vector<int32_t> read_token_file(const std::string& path);
// The same checks on the header and the file's size alone: bytes per token (2 or 4) and the count.
struct TokenFileLayout {
  int width = 0;
  int64_t count = 0;
};
TokenFileLayout read_token_file_header(const std::string& path);

// ---- text token files ----
// One sequence per line, ids separated by commas (spaces around ids allowed); every line has
// the same number of ids; trailing blank lines are ignored. ids is row-major [rows, cols].
struct TokenRows {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<int64_t> ids;
};
// Throws naming the file, the 1-based line and the problem (non-integer or negative id, ragged
// line, empty file).
TokenRows read_token_lines(const std::string& path);
// Throws naming the file, the line, the id and the vocab size when an id is >= vocab_size.
void check_token_range(const TokenRows& rows, int64_t vocab_size, const std::string& path);

// ---- DataLoader ----
struct TokenBatch {
  Tensor inputs;   // [B, T] i64
  Tensor targets;  // [B, T] i64: inputs shifted left by one token
};

// Consecutive windows over a token stream. With W = world, a micro-batch (a call of next())
// consumes a global window of W*B*T + 1 tokens starting at position(): global row g
// (0 <= g < W*B) has inputs tokens[pos + g*T, pos + g*T + T) and targets one token later. Rank r
// returns global rows [r*B, (r+1)*B), so the ranks' batches stacked in rank order equal the batch a
// world-1 loader with batch W*B returns. After each micro-batch, pos += W*B*T. An optimizer step
// is `accum` micro-batches, and the wrap is decided per step: after a step's last micro-batch,
// when the next step's window (accum*W*B*T + 1 tokens) would run past the end, pos wraps to 0. So
// accum micro-batches of B rows draw exactly the rows one batch of accum*B rows would, wrap
// included. The final partial window is skipped, never padded.
class DataLoader {
 public:
  // `tokens`: a TokenStream (mapped shards) or a std::vector<int32_t> (in memory).
  DataLoader(TokenStream tokens, int64_t batch, int64_t seq, int rank = 0, int world = 1, int64_t accum = 1);

  TokenBatch next();
  // Start of the next global window (the same on every rank). Save it, between optimizer steps, to
  // resume exactly.
  int64_t position() const { return pos_; }
  // Throws unless 0 <= pos and a whole step's window fits from pos. The next call of next() is a
  // step's first micro-batch.
  void set_position(int64_t pos);

  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  int64_t num_tokens() const { return tokens_.size(); }
  int64_t accum() const { return accum_; }
  // Tokens consumed per optimizer step by all ranks together: accum*W*B*T.
  int64_t tokens_per_step() const { return accum_ * tokens_per_micro(); }
  // Tokens consumed per micro-batch (a call of next()) by all ranks together: W*B*T.
  int64_t tokens_per_micro() const { return static_cast<int64_t>(world_) * batch_ * seq_; }
  // Steps in one pass over the tokens before wrapping.
  int64_t steps_per_epoch() const { return (num_tokens() - 1) / tokens_per_step(); }

 private:
  TokenStream tokens_;
  int64_t batch_;
  int64_t seq_;
  int rank_;
  int world_;
  int64_t accum_;
  int64_t pos_ = 0;
  int64_t micro_ = 0;  // micro-batches of the current step drawn so far
};

}  // namespace mt
