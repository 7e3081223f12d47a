// Fuzzes read_safetensors (models/safetensors.h): the input is a whole file, 8-byte header
// length + header JSON + data buffer. Why: checkpoints come from anywhere (the Hub, a killed
// save, a full disk); the reader's overflow, range-tiling and dtype checks are what stands between
// a hostile header and an out-of-bounds read or a huge allocation. A file that reads must also
// survive a write/read round trip with the same names, dtypes, shapes and bytes.
#include <cstring>

#include "models/safetensors.h"
#include "runtime/dtype.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string path = fuzz::write_input("in.safetensors", data, size);
  SafetensorsFile f;
  if (!fuzz::expect_ok_or_user_error([&] { f = read_safetensors(path); })) return 0;

  std::map<std::string, std::string> meta = f.metadata;
  meta.erase("mt.crc32");  // the writer adds its own
  const std::string out = (fuzz::scratch_dir() / "out.safetensors").string();
  SafetensorsFile back;
  const bool ok = fuzz::expect_ok_or_user_error([&] {
    write_safetensors(out, f.tensors, meta);
    back = read_safetensors(out);
  });
  if (!ok) fuzz::finding("round trip", "a file that reads could not be written and read back");
  if (back.tensors.size() != f.tensors.size()) fuzz::finding("round trip", "tensor count differs");
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const auto& [name, t] = f.tensors[i];
    const auto& [bname, bt] = back.tensors[i];
    if (name != bname || t.dtype() != bt.dtype() || t.shape() != bt.shape())
      fuzz::finding("round trip", "tensor '" + name + "' changed name, dtype or shape");
    const size_t n = static_cast<size_t>(t.numel()) * static_cast<size_t>(dtype_size(t.dtype()));
    if (n > 0 && std::memcmp(t.data_ptr(), bt.data_ptr(), n) != 0)
      fuzz::finding("round trip", "tensor '" + name + "' changed bytes");
  }
  return 0;
}
