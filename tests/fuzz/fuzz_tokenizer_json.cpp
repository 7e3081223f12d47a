// Fuzzes HfTokenDecoder (models/hf_tokenizer.h) and HfTokenEncoder (models/hf_encoder.h): the
// input is a tokenizer.json. Why: it comes
// with a downloaded checkpoint, `generate` and `train --sample-every` read it, and its tokens are
// arbitrary strings turned into bytes (UTF-8 decoding, GPT-2's byte table, <0xNN> tokens); the
// encoder compiles its regexes and runs its merges. A file that loads must decode any id and encode
// any text, or refuse with mt::Error.
#include "models/hf_encoder.h"
#include "models/hf_tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string path = fuzz::write_input("tokenizer.json", data, size);
  std::optional<HfTokenEncoder> e;
  if (fuzz::expect_ok_or_user_error([&] { e = HfTokenEncoder::from_file(path); }))
    for (const char* text : {"", "Hello world", "  a\n\n b  ", "don't 123 \xC3\xA9\xE2\x96\x81 <s>x</s>", "\xff"})
      fuzz::expect_ok_or_user_error([&] { (void)e->encode(text); });
  std::optional<HfTokenDecoder> d;
  if (!fuzz::expect_ok_or_user_error([&] { d = HfTokenDecoder::from_file(path); })) return 0;
  for (int64_t id = -1; id < 40; ++id) fuzz::expect_ok_or_user_error([&] { (void)d->decode({id}); });
  fuzz::expect_ok_or_user_error([&] { (void)d->decode({0, 1, 2, 3, 4, 5, 6, 7}); });
  return 0;
}
