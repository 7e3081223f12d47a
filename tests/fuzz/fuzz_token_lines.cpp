// Fuzzes read_token_lines and check_token_range (models/data.h): text token files, one sequence of
// comma-separated ids per line, as eval and grad read them. Why: hand-edited text is the input
// most likely to be ragged, blank, signed, huge or not numbers at all, and each of those must be
// an error naming the file, the line and the id.
#include "models/data.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string path = fuzz::write_input("tokens.txt", data, size);
  TokenRows rows;
  if (!fuzz::expect_ok_or_user_error([&] { rows = read_token_lines(path); })) return 0;
  if (rows.rows <= 0 || rows.cols <= 0 || static_cast<int64_t>(rows.ids.size()) != rows.rows * rows.cols)
    fuzz::finding("read_token_lines", "rows x cols does not match the ids read");
  for (int64_t vocab : {int64_t{1}, int64_t{256}, int64_t{1} << 40})
    fuzz::expect_ok_or_user_error([&] { check_token_range(rows, vocab, path); });
  return 0;
}
