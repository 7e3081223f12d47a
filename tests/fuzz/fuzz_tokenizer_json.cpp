// Fuzzes HfTokenDecoder (models/hf_tokenizer.h): the input is a tokenizer.json. Why: it comes
// with a downloaded checkpoint, `generate` and `train --sample-every` read it, and its tokens are
// arbitrary strings turned into bytes (UTF-8 decoding, GPT-2's byte table, <0xNN> tokens). A file
// that loads must decode any id to bytes or refuse it with mt::Error.
#include "models/hf_tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string path = fuzz::write_input("tokenizer.json", data, size);
  std::optional<HfTokenDecoder> d;
  if (!fuzz::expect_ok_or_user_error([&] { d = HfTokenDecoder::from_file(path); })) return 0;
  for (int64_t id = -1; id < 40; ++id) fuzz::expect_ok_or_user_error([&] { (void)d->decode({id}); });
  fuzz::expect_ok_or_user_error([&] { (void)d->decode({0, 1, 2, 3, 4, 5, 6, 7}); });
  return 0;
}
