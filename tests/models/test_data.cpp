// Tests for the embedded corpus, the byte tokenizer, llm.c token shards, text token files and
// the DataLoader. Files live in a unique temp directory removed at the end of each test.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "models/corpus.h"
#include "models/data.h"
#include "models/tokenizer.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using mt::testing::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

void put_le(std::string& out, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// An llm.c shard built byte by byte: 256 little-endian int32 header, then the tokens.
std::string llmc_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<uint32_t>& tokens,
                       int width) {
  std::string b;
  put_le(b, static_cast<uint32_t>(magic), 4);
  put_le(b, static_cast<uint32_t>(version), 4);
  put_le(b, static_cast<uint32_t>(count), 4);
  for (int i = 3; i < 256; ++i) put_le(b, 0, 4);
  for (uint32_t t : tokens) put_le(b, t, width);
  return b;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

int32_t header_int(const std::string& bytes, int index) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + 4 * index;
  return static_cast<int32_t>(p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

std::vector<int32_t> iota_tokens(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  return t;
}

// Naive reference: row b of the window at pos, shifted by `shift` (0 inputs, 1 targets).
std::vector<int64_t> window_rows(const std::vector<int32_t>& tokens, int64_t pos, int64_t first_row,
                                 int64_t rows, int64_t seq, int64_t shift) {
  std::vector<int64_t> out;
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t t = 0; t < seq; ++t) out.push_back(tokens[static_cast<size_t>(pos + (first_row + b) * seq + t + shift)]);
  return out;
}

}  // namespace

// ---- corpus and tokenizer ----

TEST_CASE("embedded corpus: size, ASCII only, byte tokens", "[cpu]") {
  const std::string_view text = embedded_corpus();
  REQUIRE(text.size() >= 60000);
  REQUIRE(text.size() <= 80000);
  size_t bad = text.size();  // first byte that is not printable ASCII or a newline
  for (size_t i = 0; i < text.size() && bad == text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c != '\n' && (c < 0x20 || c >= 0x7F)) bad = i;
  }
  INFO("first non-ASCII byte at " << bad);
  REQUIRE(bad == text.size());
  REQUIRE(text.find("\n\n") != std::string_view::npos);  // paragraphs
  const auto tokens = embedded_corpus_tokens();
  REQUIRE(tokens.size() == text.size());
  for (size_t i = 0; i < 100; ++i) REQUIRE(tokens[i] == static_cast<unsigned char>(text[i]));
  // English bytes: well below uniform over 256 (5.55 nats) and well above zero.
  const double h = unigram_entropy(tokens);
  REQUIRE(h > 2.0);
  REQUIRE(h < 3.5);
}

TEST_CASE("ByteTokenizer round trip and bad ids", "[cpu]") {
  ByteTokenizer tok;
  REQUIRE(tok.vocab_size() == 256);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto ids = tok.encode(all);
  REQUIRE(ids.size() == 256);
  for (int b = 0; b < 256; ++b) REQUIRE(ids[static_cast<size_t>(b)] == b);
  REQUIRE(tok.decode(ids) == all);
  const std::string text = "Hello, world.\nA second line.";
  REQUIRE(tok.decode(tok.encode(text)) == text);
  REQUIRE(tok.encode("").empty());
  REQUIRE_THROWS_WITH(tok.decode({72, 256}), Contains("token 256 at position 1") && Contains("[0, 256)"));
  REQUIRE_THROWS_WITH(tok.decode({-1}), Contains("token -1 at position 0"));
}

TEST_CASE("unigram_entropy of known distributions", "[cpu]") {
  REQUIRE(unigram_entropy({7, 7, 7}) == 0.0);
  REQUIRE(std::abs(unigram_entropy({0, 1, 0, 1}) - std::log(2.0)) < 1e-12);
  REQUIRE(std::abs(unigram_entropy(iota_tokens(8)) - std::log(8.0)) < 1e-12);
  const double expected = -(0.75 * std::log(0.75) + 0.25 * std::log(0.25));
  REQUIRE(std::abs(unigram_entropy({5, 9, 5, 5}) - expected) < 1e-12);
  // Ids need not be small.
  REQUIRE(std::abs(unigram_entropy({100000, 3, 100000, 3}) - std::log(2.0)) < 1e-12);
  REQUIRE_THROWS_WITH(unigram_entropy({}), Contains("empty"));
}

// ---- llm.c token shards ----

TEST_CASE("token file round trip, uint16 layout", "[cpu]") {
  TempDir tmp;
  const std::string path = tmp.file("train.bin");
  const std::vector<int32_t> tokens = {0, 1, 50256, 65535, 42, 7};
  write_token_file(path, tokens);
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() == 1024 + 2 * tokens.size());
  REQUIRE(header_int(bytes, 0) == 20240520);
  REQUIRE(header_int(bytes, 1) == 1);
  REQUIRE(header_int(bytes, 2) == 6);
  for (int i = 3; i < 256; ++i) REQUIRE(header_int(bytes, i) == 0);
  REQUIRE(read_token_file(path) == tokens);
  REQUIRE(tmp.listing() == std::vector<std::string>{"train.bin"});  // no temp file left

  // Overwrite in place with an empty stream.
  write_token_file(path, {});
  REQUIRE(read_token_file(path).empty());
  REQUIRE(read_bytes(path).size() == 1024);
}

TEST_CASE("token file round trip, uint32 layout", "[cpu]") {
  TempDir tmp;
  const std::string path = tmp.file("llama.bin");
  const std::vector<int32_t> tokens = {128000, 0, 65535, 65536, 2147483647, 9};
  write_token_file(path, tokens);
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() == 1024 + 4 * tokens.size());
  REQUIRE(header_int(bytes, 0) == 20240801);
  REQUIRE(header_int(bytes, 1) == kTokenFileVersionU32);
  REQUIRE(header_int(bytes, 2) == 6);
  REQUIRE(read_token_file(path) == tokens);
  REQUIRE(tmp.listing() == std::vector<std::string>{"llama.bin"});
  REQUIRE_THROWS_WITH(write_token_file(tmp.file("neg.bin"), {1, -3}),
                      Contains("neg.bin") && Contains("token -3 at position 1"));
  REQUIRE(tmp.listing() == std::vector<std::string>{"llama.bin"});
}

TEST_CASE("token files written by hand in the llm.c layout", "[cpu]") {
  TempDir tmp;
  // GPT-2 style: uint16.
  write_text(tmp.file("gpt2.bin"), llmc_bytes(20240520, 1, 4, {50256, 15496, 11, 995}, 2));
  REQUIRE(read_token_file(tmp.file("gpt2.bin")) == std::vector<int32_t>{50256, 15496, 11, 995});
  // llama-3 style: uint32, version 7 (llm.c's writer) and version 2.
  write_text(tmp.file("l3v7.bin"), llmc_bytes(20240801, 7, 3, {128000, 9906, 1917}, 4));
  REQUIRE(read_token_file(tmp.file("l3v7.bin")) == std::vector<int32_t>{128000, 9906, 1917});
  write_text(tmp.file("l3v2.bin"), llmc_bytes(20240801, 2, 2, {70000, 1}, 4));
  REQUIRE(read_token_file(tmp.file("l3v2.bin")) == std::vector<int32_t>{70000, 1});
}

TEST_CASE("bad token files name the file and the problem", "[cpu]") {
  TempDir tmp;
  const std::string missing = tmp.file("missing.bin");
  REQUIRE_THROWS_WITH(read_token_file(missing), Contains(missing) && Contains("does not exist"));

  const std::string shorty = tmp.file("short.bin");
  write_text(shorty, std::string(100, '\0'));
  REQUIRE_THROWS_WITH(read_token_file(shorty),
                      Contains(shorty) && Contains("100 bytes") && Contains("too short for the 1024-byte header"));

  const std::string magic = tmp.file("magic.bin");
  write_text(magic, llmc_bytes(12345, 1, 1, {3}, 2));
  REQUIRE_THROWS_WITH(read_token_file(magic), Contains(magic) && Contains("bad magic 12345") &&
                                                  Contains("20240520") && Contains("20240801"));

  const std::string version = tmp.file("version.bin");
  write_text(version, llmc_bytes(20240520, 3, 1, {3}, 2));
  REQUIRE_THROWS_WITH(read_token_file(version),
                      Contains(version) && Contains("unsupported version 3") && Contains("expected version 1"));
  write_text(version, llmc_bytes(20240801, 1, 1, {3}, 4));
  REQUIRE_THROWS_WITH(read_token_file(version), Contains("unsupported version 1 for magic 20240801"));

  const std::string truncated = tmp.file("truncated.bin");
  write_text(truncated, llmc_bytes(20240520, 1, 10, {1, 2, 3, 4, 5, 6, 7, 8, 9}, 2));
  REQUIRE_THROWS_WITH(read_token_file(truncated), Contains(truncated) && Contains("header says 10 tokens") &&
                                                      Contains("20 bytes of uint16") && Contains("18 bytes"));
  // Too many bytes is as wrong as too few.
  write_text(truncated, llmc_bytes(20240801, 7, 1, {1, 2}, 4));
  REQUIRE_THROWS_WITH(read_token_file(truncated),
                      Contains("header says 1 tokens (4 bytes of uint32)") && Contains("8 bytes"));

  REQUIRE_THROWS_WITH(read_token_file(tmp.path.string()), Contains("is a directory"));

  // The largest count the int32 header field holds, on a short file: refused from the header alone.
  const std::string huge = tmp.file("huge.bin");
  write_text(huge, llmc_bytes(20240801, 7, 2147483647, {1, 2, 3}, 4));
  REQUIRE_THROWS_WITH(read_token_file(huge), Contains(huge) && Contains("header says 2147483647 tokens") &&
                                                 Contains("8589934588 bytes of uint32") && Contains("12 bytes"));
  write_text(huge, llmc_bytes(20240520, 1, -1, {1}, 2));
  REQUIRE_THROWS_WITH(read_token_file(huge), Contains("negative token count -1"));
}

// ---- text token files ----

TEST_CASE("read_token_lines: good file", "[cpu]") {
  TempDir tmp;
  const std::string path = tmp.file("eval.txt");
  write_text(path, "1,2,3\n 4 , 5,6\r\n7,8 ,  9\n\n");
  const TokenRows r = read_token_lines(path);
  REQUIRE(r.rows == 3);
  REQUIRE(r.cols == 3);
  REQUIRE(r.ids == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  check_token_range(r, 10, path);

  write_text(path, "42");  // one id, no newline
  const TokenRows one = read_token_lines(path);
  REQUIRE(one.rows == 1);
  REQUIRE(one.cols == 1);
  REQUIRE(one.ids == std::vector<int64_t>{42});
}

TEST_CASE("read_token_lines: bad files name file, line and problem", "[cpu]") {
  TempDir tmp;
  const std::string path = tmp.file("bad.txt");

  write_text(path, "1,2,3,4,5,6\n1,2,3,4,5,6\n1,2,3,4,5\n");
  REQUIRE_THROWS_WITH(read_token_lines(path), Contains(path) && Contains("line 3 has 5 ids, line 1 has 6"));

  write_text(path, "1,2,3\n4,x5,6\n");
  REQUIRE_THROWS_WITH(read_token_lines(path),
                      Contains(path) && Contains("line 2, id 2") && Contains("'x5' is not an integer"));
  write_text(path, "1,2.5,3\n");
  REQUIRE_THROWS_WITH(read_token_lines(path), Contains("line 1, id 2") && Contains("'2.5' is not an integer"));
  write_text(path, "1 2,3\n");
  REQUIRE_THROWS_WITH(read_token_lines(path), Contains("'1 2' is not an integer"));

  write_text(path, "1,2\n3,-4\n");
  REQUIRE_THROWS_WITH(read_token_lines(path),
                      Contains(path) && Contains("line 2, id 2") && Contains("token id -4 is negative"));

  write_text(path, "1,2,\n");
  REQUIRE_THROWS_WITH(read_token_lines(path), Contains("line 1, id 3 is empty"));

  write_text(path, "1,2\n\n3,4\n");
  REQUIRE_THROWS_WITH(read_token_lines(path), Contains("line 2 is blank"));

  write_text(path, "99999999999999999999\n");
  REQUIRE_THROWS_WITH(read_token_lines(path), Contains("out of the int64 range"));

  write_text(path, std::string("1,2\n\x88\xd8" "4\0\x01", 8));  // a binary shard's bytes
  REQUIRE_THROWS_WITH(read_token_lines(path), Contains(path) && Contains("byte 7 is a NUL: the file is not text"));

  write_text(path, "");
  REQUIRE_THROWS_WITH(read_token_lines(path), Contains(path) && Contains("no token lines"));
  write_text(path, "\n  \n");
  REQUIRE_THROWS_WITH(read_token_lines(path), Contains("no token lines"));

  REQUIRE_THROWS_WITH(read_token_lines(tmp.file("nope.txt")), Contains("nope.txt") && Contains("does not exist"));
}

TEST_CASE("check_token_range names file, line, id and vocab size", "[cpu]") {
  TempDir tmp;
  const std::string path = tmp.file("range.txt");
  write_text(path, "1,2,3\n4,256,6\n");
  const TokenRows r = read_token_lines(path);
  check_token_range(r, 257, path);
  REQUIRE_THROWS_WITH(check_token_range(r, 256, path),
                      Contains(path) && Contains("line 2, id 2") && Contains("token id 256") &&
                          Contains("vocab size 256"));
}

// ---- DataLoader ----

TEST_CASE("DataLoader with accum: the micro-batches of a step are one big batch's rows, wrap included", "[cpu]") {
  // 40 tokens, rows of 3: a step of 2 micro-batches of 2 rows is 12 tokens (+1), as one batch of 4
  // rows. Three steps fit (0, 12, 24); the fourth starts over at 0. Deciding the wrap per
  // micro-batch made the third step's second half the corpus's start, and every later step half a
  // batch off the big batch's.
  const auto tokens = iota_tokens(40);
  DataLoader big(tokens, 4, 3), acc(tokens, 2, 3, 0, 1, 2);
  REQUIRE(acc.tokens_per_step() == 12);
  REQUIRE(acc.tokens_per_micro() == 6);
  REQUIRE(acc.steps_per_epoch() == big.steps_per_epoch());
  for (int step = 0; step < 7; ++step) {
    INFO("step " << step);
    REQUIRE(acc.position() == big.position());
    const std::vector<int64_t> want = big.next().inputs.to_vector<int64_t>();
    std::vector<int64_t> got = acc.next().inputs.to_vector<int64_t>();
    const std::vector<int64_t> second = acc.next().inputs.to_vector<int64_t>();
    got.insert(got.end(), second.begin(), second.end());
    CHECK(got == want);
  }
  // A saved position where one micro-batch fits but not a whole step is the start.
  acc.set_position(30);
  CHECK(acc.position() == 0);
  CHECK_THROWS_WITH(acc.set_position(34), Contains("position 34 leaves no room"));
  CHECK_THROWS_WITH(DataLoader(iota_tokens(12), 2, 3, 0, 1, 2), Contains("accum 2 x world 1 x batch 2 x seq 3"));
}

TEST_CASE("DataLoader windows, wrap-around and steps", "[cpu]") {
  const auto tokens = iota_tokens(20);
  DataLoader dl(tokens, 2, 3);
  REQUIRE(dl.tokens_per_step() == 6);
  REQUIRE(dl.steps_per_epoch() == 3);
  const std::vector<int64_t> expected_pos = {0, 6, 12, 0, 6, 12, 0};
  for (size_t step = 0; step + 1 < expected_pos.size(); ++step) {
    REQUIRE(dl.position() == expected_pos[step]);
    const int64_t pos = dl.position();
    const TokenBatch b = dl.next();
    REQUIRE(b.inputs.shape() == Shape{2, 3});
    REQUIRE(b.targets.shape() == Shape{2, 3});
    REQUIRE(b.inputs.dtype() == DType::kI64);
    REQUIRE(b.targets.dtype() == DType::kI64);
    REQUIRE(b.inputs.to_vector<int64_t>() == window_rows(tokens, pos, 0, 2, 3, 0));
    REQUIRE(b.targets.to_vector<int64_t>() == window_rows(tokens, pos, 0, 2, 3, 1));
  }
  // Written out for the first step: rows [0,1,2], [3,4,5]; targets one later.
  DataLoader fresh(tokens, 2, 3);
  const TokenBatch b0 = fresh.next();
  REQUIRE(b0.inputs.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  REQUIRE(b0.targets.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 5, 6});

  // Exactly one window: every step is the same window.
  DataLoader exact(iota_tokens(7), 2, 3);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(exact.next().targets.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
    REQUIRE(exact.position() == 0);
  }
}

TEST_CASE("DataLoader position/set_position resume equals an uninterrupted run", "[cpu]") {
  std::mt19937 gen(3);
  std::vector<int32_t> tokens(1000);
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % 256);
  DataLoader full(tokens, 3, 16);
  std::vector<TokenBatch> ref;
  for (int i = 0; i < 50; ++i) ref.push_back(full.next());  // wraps (20 steps per epoch)

  DataLoader first(tokens, 3, 16);
  for (int i = 0; i < 27; ++i) first.next();
  const int64_t saved = first.position();
  DataLoader resumed(tokens, 3, 16);
  resumed.set_position(saved);
  for (int i = 27; i < 50; ++i) {
    const TokenBatch b = resumed.next();
    REQUIRE(b.inputs.to_vector<int64_t>() == ref[static_cast<size_t>(i)].inputs.to_vector<int64_t>());
    REQUIRE(b.targets.to_vector<int64_t>() == ref[static_cast<size_t>(i)].targets.to_vector<int64_t>());
  }
  REQUIRE(resumed.position() == full.position());

  REQUIRE_THROWS_WITH(resumed.set_position(-1), Contains("position -1"));
  REQUIRE_THROWS_WITH(resumed.set_position(1000 - 48), Contains("no room for a window of 49 tokens"));
  resumed.set_position(1000 - 49);  // the last window that fits
}

TEST_CASE("DataLoader rank split: union over ranks equals the world-1 batch", "[cpu]") {
  const auto tokens = iota_tokens(500);
  const int world = 3;
  const int64_t batch = 2, seq = 5;
  DataLoader single(tokens, world * batch, seq);
  std::vector<DataLoader> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(tokens, batch, seq, r, world);
  for (int step = 0; step < 40; ++step) {  // 16 steps per epoch: wraps twice
    const int64_t pos = single.position();
    const TokenBatch whole = single.next();
    std::vector<int64_t> x, y;
    for (int r = 0; r < world; ++r) {
      REQUIRE(ranks[static_cast<size_t>(r)].position() == pos);
      const TokenBatch part = ranks[static_cast<size_t>(r)].next();
      REQUIRE(part.inputs.shape() == Shape{batch, seq});
      REQUIRE(part.inputs.to_vector<int64_t>() == window_rows(tokens, pos, r * batch, batch, seq, 0));
      const auto px = part.inputs.to_vector<int64_t>();
      const auto py = part.targets.to_vector<int64_t>();
      x.insert(x.end(), px.begin(), px.end());
      y.insert(y.end(), py.begin(), py.end());
    }
    REQUIRE(x == whole.inputs.to_vector<int64_t>());
    REQUIRE(y == whole.targets.to_vector<int64_t>());
  }
}

TEST_CASE("DataLoader rejects bad arguments", "[cpu]") {
  REQUIRE_THROWS_WITH(DataLoader(iota_tokens(6), 2, 3),
                      Contains("6 tokens") && Contains("2 x seq 3 + 1 = 7 tokens"));
  REQUIRE_THROWS_WITH(DataLoader(iota_tokens(12), 2, 3, 0, 2),
                      Contains("world 2 x batch 2 x seq 3 + 1 = 13 tokens"));
  REQUIRE_THROWS_WITH(DataLoader(iota_tokens(100), 2, 3, 2, 2), Contains("rank 2 is not in [0, world 2)"));
  REQUIRE_THROWS_WITH(DataLoader(iota_tokens(100), 0, 3), Contains("must be positive"));
  // A window that overflows int64 must not wrap around to one that "fits" the corpus.
  REQUIRE_THROWS_WITH(DataLoader(iota_tokens(100), int64_t{1} << 62, 4),
                      Contains("batch 4611686018427387904 x seq 4 tokens overflows int64"));
  REQUIRE_THROWS_WITH(DataLoader(iota_tokens(100), int64_t{1} << 32, int64_t{1} << 32, 0, 2),
                      Contains("world 2 x batch 4294967296 x seq 4294967296"));
}

TEST_CASE("DataLoader over the embedded corpus", "[cpu]") {
  DataLoader dl(embedded_corpus_tokens(), 4, 64);
  const TokenBatch b = dl.next();
  const auto x = b.inputs.to_vector<int64_t>();
  const std::string_view text = embedded_corpus();
  for (size_t i = 0; i < 64; ++i) REQUIRE(x[i] == static_cast<unsigned char>(text[i]));
}

// ---- several shards, mapped ----

TEST_CASE("TokenStream: mapped shards of both widths read as their concatenation", "[cpu]") {
  TempDir tmp;
  // 700 tokens over four shards: uint16, an empty one, uint32 (ids past 65535), uint16.
  std::vector<int32_t> all;
  for (int i = 0; i < 700; ++i) all.push_back(i < 300 || i >= 500 ? (i * 37) % 60000 : 70000 + i);
  const std::vector<std::pair<int, int>> cuts = {{0, 300}, {300, 300}, {300, 500}, {500, 700}};
  std::vector<std::string> paths;
  for (size_t k = 0; k < cuts.size(); ++k) {
    paths.push_back(tmp.file("shard_" + std::to_string(k) + ".bin"));
    write_token_file(paths.back(), std::vector<int32_t>(all.begin() + cuts[k].first, all.begin() + cuts[k].second));
  }
  REQUIRE(header_int(read_bytes(paths[2]), 0) == kTokenFileMagicU32);
  REQUIRE(header_int(read_bytes(paths[3]), 0) == kTokenFileMagicU16);
  const TokenStream s = TokenStream::map_files(paths);
  REQUIRE(s.size() == 700);
  CHECK(s.paths() == paths);
  std::vector<int64_t> got(700);
  s.copy(0, 700, got.data());
  CHECK(std::equal(got.begin(), got.end(), all.begin()));
  // Windows across every boundary, from every start.
  for (int64_t pos = 0; pos < 700; pos += 7) {
    const int64_t n = std::min<int64_t>(123, 700 - pos);
    std::vector<int64_t> w(static_cast<size_t>(n));
    s.copy(pos, n, w.data());
    REQUIRE(std::equal(w.begin(), w.end(), all.begin() + pos));
  }
  CHECK(s.where(299) == paths[0] + " position 299");
  CHECK(s.where(300) == paths[2] + " position 0");
  CHECK(s.where(650) == paths[3] + " position 150");
  CHECK_THROWS_WITH(s.copy(650, 51, got.data()), Contains("tokens [650, 701) lie outside the 700 tokens"));
  // The range scan finds the first id outside the vocabulary, wherever it lies.
  CHECK(s.find_outside(100000) == -1);
  CHECK(s.find_outside(65536) == 300);
  CHECK(s.find_outside(65536, 500) == -1);
  // The entropy is the vector version's, bit for bit.
  CHECK(s.unigram_entropy(100000) == unigram_entropy(all));
  CHECK(TokenStream(all).unigram_entropy(100000) == unigram_entropy(all));
  CHECK_THROWS_WITH(s.unigram_entropy(65536), Contains("token " + std::to_string(all[300]) + " at " + paths[2] +
                                                        " position 0 is outside [0, 65536)"));
  // One pass both checks and counts (train's start-up): the counts of the ids, or the first
  // position outside the vocabulary.
  const TokenStream::IdCounts counted = s.count_ids(100000);
  CHECK(counted.outside == -1);
  std::vector<int64_t> expect(100000, 0);
  for (int32_t t : all) ++expect[static_cast<size_t>(t)];
  CHECK(counted.counts == expect);
  CHECK(counted.entropy() == unigram_entropy(all));
  CHECK(s.count_ids(65536).outside == 300);
  CHECK(TokenStream(std::vector<int32_t>{3, 1, 3}).count_ids(3).outside == 0);
  CHECK_THROWS_WITH(TokenStream().count_ids(4).entropy(), Contains("empty"));
  // A DataLoader over the shards draws the batches of one over the whole vector, rank split and
  // accumulation included (windows cross the shard boundaries).
  DataLoader a(s, 2, 9, 1, 2, 3), b(all, 2, 9, 1, 2, 3);
  for (int i = 0; i < 40; ++i) {
    const TokenBatch x = a.next(), y = b.next();
    REQUIRE(x.inputs.to_vector<int64_t>() == y.inputs.to_vector<int64_t>());
    REQUIRE(x.targets.to_vector<int64_t>() == y.targets.to_vector<int64_t>());
  }
  // A shard that is not one is refused naming it, as read_token_file does.
  write_text(tmp.file("bad.bin"), "not a shard");
  CHECK_THROWS_WITH(TokenStream::map_files({paths[0], tmp.file("bad.bin")}),
                    Contains(tmp.file("bad.bin")) && Contains("too short for the 1024-byte header"));
  CHECK_THROWS_WITH(TokenStream::map_files({}), Contains("no token files"));
}
