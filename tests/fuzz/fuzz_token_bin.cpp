// Fuzzes read_token_file (models/data.h): llm.c .bin shards, a 256-int32 header (magic, version,
// token count) then uint16 or uint32 tokens. Why: shards are large files produced by other tools;
// a wrong count or width must be refused before anything is read past the end. Tokens that read
// are fed to a DataLoader with a batch and sequence length taken from the input's last bytes, and
// must survive a write/read round trip unchanged. The same file mapped (TokenStream::map_files,
// alone and twice in a row) must be refused exactly when read_token_file refuses it, and read the
// same tokens.
#include "models/data.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string path = fuzz::write_input("tokens.bin", data, size);
  std::vector<int32_t> tokens;
  const bool read = fuzz::expect_ok_or_user_error([&] { tokens = read_token_file(path); });
  TokenStream mapped;
  const bool maps = fuzz::expect_ok_or_user_error([&] { mapped = TokenStream::map_files({path, path}); });
  // read_token_file also refuses a uint32 token above int32 (the mapped stream leaves ids to the
  // vocabulary check): then mapping may succeed.
  if (maps != read && !(maps && !read && tokens.empty() && mapped.find_outside(int64_t{1} << 31) >= 0))
    fuzz::finding("TokenStream", read ? "a file read_token_file reads is refused when mapped"
                                      : "a file read_token_file refuses is mapped");
  if (!read) return 0;
  if (maps) {
    std::vector<int64_t> got(static_cast<size_t>(mapped.size()));
    mapped.copy(0, mapped.size(), got.data());
    bool same = mapped.size() == 2 * static_cast<int64_t>(tokens.size());
    for (size_t i = 0; same && i < got.size(); ++i) same = got[i] == tokens[i % tokens.size()];
    if (!same) fuzz::finding("TokenStream", "the mapped tokens differ from read_token_file's");
  }

  const std::string out = (fuzz::scratch_dir() / "out.bin").string();
  std::vector<int32_t> back;
  if (!fuzz::expect_ok_or_user_error([&] {
        write_token_file(out, tokens);
        back = read_token_file(out);
      }))
    fuzz::finding("round trip", "tokens that read could not be written and read back");
  if (back != tokens) fuzz::finding("round trip", "tokens changed");

  const int64_t batch = size > 0 ? data[size - 1] % 5 : 1;        // 0 is refused, 1..4 run
  const int64_t seq = size > 1 ? data[size - 2] % 9 : 1;          // 0 is refused, 1..8 run
  const int world = size > 2 ? 1 + data[size - 3] % 3 : 1;
  fuzz::expect_ok_or_user_error([&] {
    for (int rank = 0; rank < world; ++rank) {
      DataLoader loader(tokens, batch, seq, rank, world);
      for (int step = 0; step < 3; ++step) {
        TokenBatch b = loader.next();
        if (b.inputs.shape() != Shape{batch, seq} || b.targets.shape() != Shape{batch, seq})
          fuzz::finding("DataLoader", "batch has the wrong shape");
      }
      loader.set_position(0);
    }
  });
  return 0;
}
