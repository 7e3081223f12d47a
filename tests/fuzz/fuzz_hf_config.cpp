// Fuzzes load_hf_config (models/hf_config.h): the input is a config.json. Why: config.json is the
// first file a user hands meshtrain, every size in it multiplies into allocations (issue 10 item 1),
// and its fields come with defaults, aliases and nulls that are easy to mis-type. A config that
// loads must also be written back and load again to the same bytes (save/load is a fixed point).
#include "models/hf_config.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string path = fuzz::write_input("config.json", data, size);
  ModelConfig config;
  if (!fuzz::expect_ok_or_user_error([&] { config = load_hf_config(path); })) return 0;

  const std::string a = (fuzz::scratch_dir() / "a.json").string();
  const std::string b = (fuzz::scratch_dir() / "b.json").string();
  const bool ok = fuzz::expect_ok_or_user_error([&] {
    save_hf_config(config, a);
    save_hf_config(load_hf_config(a), b);
  });
  if (!ok) fuzz::finding("round trip", "a config that loads could not be saved and loaded again");
  if (fuzz::read_bytes(a) != fuzz::read_bytes(b)) fuzz::finding("round trip", "save(load(save(c))) != save(c)");
  return 0;
}
