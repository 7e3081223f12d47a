// Fuzzes read_token_file (models/data.h): llm.c .bin shards, a 256-int32 header (magic, version,
// token count) then uint16 or uint32 tokens. Why: shards are large files produced by other tools;
// a wrong count or width must be refused before anything is read past the end. Tokens that read
// are fed to a DataLoader with a batch and sequence length taken from the input's last bytes, and
// must survive a write/read round trip unchanged.
#include "models/data.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string path = fuzz::write_input("tokens.bin", data, size);
  std::vector<int32_t> tokens;
  if (!fuzz::expect_ok_or_user_error([&] { tokens = read_token_file(path); })) return 0;

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
