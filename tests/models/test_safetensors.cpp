// safetensors: bit-exact round trips for every dtype and layout, deterministic bytes, files
// written by hand from the format's spec (compatibility with other writers), and one test per
// kind of bad input checking that the error names the file, the tensor and the problem.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <unistd.h>

#include "models/safetensors.h"
#include "testing.h"

using namespace mt;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
using mt::testing::TempDir;

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<uint8_t> b(static_cast<size_t>(c.numel() * dtype_size(c.dtype())));
  if (!b.empty()) std::memcpy(b.data(), c.data_ptr(), b.size());
  return b;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A safetensors file assembled by hand: 8-byte little-endian length, header text, data.
std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data,
                              int64_t len_override = -1) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  uint64_t n = len_override >= 0 ? static_cast<uint64_t>(len_override) : header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<int64_t>(header.size()));
  return out;
}

template <class T>
std::vector<uint8_t> le_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void require_same(const Tensor& got, const Tensor& want) {
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.shape() == want.shape());
  // (Tensor::is_contiguous() says false for some empty shapes such as [2, 0, 5]; nothing to check.)
  if (got.numel() > 0) REQUIRE(got.is_contiguous());
  REQUIRE(bytes_of(got) == bytes_of(want));
}

}  // namespace

TEST_CASE("safetensors: crc32 matches the standard check value", "[cpu]") {
  const char* s = "123456789";
  REQUIRE(crc32_update(0, s, 9) == 0xCBF43926u);
  REQUIRE(crc32_update(crc32_update(0, s, 4), s + 4, 5) == 0xCBF43926u);  // incremental
  REQUIRE(crc32_update(0, s, 0) == 0u);
  // crc32_combine: the CRC of A then B from the two CRCs and B's length, at every split point,
  // and for a long B (its length has many bits set).
  for (size_t k = 0; k <= 9; ++k)
    CHECK(crc32_combine(crc32_update(0, s, k), crc32_update(0, s + k, 9 - k), 9 - k) == 0xCBF43926u);
  std::vector<uint8_t> big(100003);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  const uint32_t whole = crc32_update(0, big.data(), big.size());
  CHECK(crc32_combine(crc32_update(0, big.data(), 777), crc32_update(0, big.data() + 777, big.size() - 777),
                      big.size() - 777) == whole);
}

TEST_CASE("safetensors: every dtype round-trips bit-exactly", "[cpu]") {
  TempDir dir;
  // f32 with the values a lossy path would change: NaN payload, -0, infinities, subnormals.
  std::vector<float> special = {from_bits(0x7fc01234u), -0.0f, std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(), from_bits(0x00000001u),
                                std::numeric_limits<float>::max(), 1.0f / 3.0f};
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"f32", testing::rand({3, 5, 7}, DType::kF32, 1)},
      {"f32_special", from_vector<float>(special)},
      {"bf16", testing::rand({4, 9}, DType::kBF16, 2)},
      {"f16", testing::rand({11}, DType::kF16, 3)},
      {"f64", testing::rand({2, 3, 2, 3}, DType::kF64, 4)},
      {"i64", from_vector<int64_t>({std::numeric_limits<int64_t>::min(), -1, 0, 1,
                                    std::numeric_limits<int64_t>::max(), 42}, {2, 3})},
      {"i32", from_vector<int32_t>({-7, 0, 123456789}, {3})},
      {"u8", from_vector<uint8_t>({0, 1, 127, 255}, {2, 2})},
      {"bool", from_vector<uint8_t>({1, 0, 0, 1, 1}, {5}, DType::kBool)},
  };
  const std::string path = dir.file("all.safetensors");
  write_safetensors(path, ts, {{"format", "pt"}, {"note", "hello"}});
  SafetensorsFile f = read_safetensors(path);
  REQUIRE(f.tensors.size() == ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    INFO(ts[i].first);
    REQUIRE(f.tensors[i].first == ts[i].first);
    require_same(f.tensors[i].second, ts[i].second);
  }
  REQUIRE(f.metadata.at("format") == "pt");
  REQUIRE(f.metadata.at("note") == "hello");
  REQUIRE(f.metadata.at("mt.crc32").size() == 8);
  REQUIRE(dir.listing() == std::vector<std::string>{"all.safetensors"});  // no temporary left
}

TEST_CASE("safetensors: non-contiguous, empty and 0-d tensors", "[cpu]") {
  TempDir dir;
  Tensor base = testing::rand({6, 4}, DType::kF32, 5);
  Tensor nc = testing::noncontig(base);
  Tensor tr = base.t();  // [4, 6] transposed view
  Tensor sliced = testing::rand({5, 8}, DType::kBF16, 6).slice(1, 1, 8, 3);
  REQUIRE(!nc.is_contiguous());
  REQUIRE(!tr.is_contiguous());
  REQUIRE(!sliced.is_contiguous());
  Tensor expanded = from_vector<int64_t>({1, 2, 3}).unsqueeze(0).expand({4, 3});  // stride 0
  Tensor empty2 = zeros({0, 3});
  Tensor empty_i = empty({2, 0, 5}, DType::kI64);
  Tensor scalar = scalar_tensor(2.5, DType::kF64);
  std::vector<std::pair<std::string, Tensor>> ts = {{"nc", nc},          {"tr", tr},         {"sliced", sliced},
                                                    {"expanded", expanded}, {"empty2", empty2}, {"scalar", scalar},
                                                    {"empty_i", empty_i}};
  const std::string path = dir.file("views.safetensors");
  write_safetensors(path, ts);
  SafetensorsFile f = read_safetensors(path);
  REQUIRE(f.tensors.size() == ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    INFO(ts[i].first);
    REQUIRE(f.tensors[i].first == ts[i].first);
    require_same(f.tensors[i].second, ts[i].second.contiguous());
  }
  REQUIRE(f.tensors[5].second.dim() == 0);
  REQUIRE(f.tensors[5].second.item() == 2.5);
  REQUIRE(f.tensors[4].second.shape() == Shape{0, 3});
  REQUIRE(f.tensors[1].second.to_vector<float>() == base.t().contiguous().to_vector<float>());
}

TEST_CASE("safetensors: an empty file list and metadata-only files", "[cpu]") {
  TempDir dir;
  const std::string path = dir.file("none.safetensors");
  write_safetensors(path, {}, {{"k", "v"}});
  SafetensorsFile f = read_safetensors(path);
  REQUIRE(f.tensors.empty());
  REQUIRE(f.metadata.at("k") == "v");
}

TEST_CASE("safetensors: identical input gives byte-identical files in the given order", "[cpu]") {
  TempDir dir;
  Tensor a = testing::rand({3, 4}, DType::kF32, 7);
  Tensor b = testing::rand({5}, DType::kBF16, 8);
  write_safetensors(dir.file("1.safetensors"), {{"z.weight", a}, {"a.bias", b}}, {{"m", "1"}});
  write_safetensors(dir.file("2.safetensors"), {{"z.weight", testing::noncontig(a)}, {"a.bias", b.clone()}},
                    {{"m", "1"}});
  auto b1 = file_bytes(dir.file("1.safetensors"));
  REQUIRE(b1 == file_bytes(dir.file("2.safetensors")));
  // The data buffer starts 8-byte aligned and the header is padded with spaces.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b1[i];
  REQUIRE((8 + n) % 8 == 0);
  REQUIRE(b1.size() == 8 + n + 3 * 4 * 4 + 5 * 2);
  std::string header(b1.begin() + 8, b1.begin() + 8 + static_cast<int64_t>(n));
  REQUIRE(header.find("\"z.weight\"") < header.find("\"a.bias\""));
  REQUIRE(header.rfind("{\"__metadata__\":{\"m\":\"1\",\"mt.crc32\":\"", 0) == 0);
  // Names come back in the order they were written (not sorted).
  auto f = read_safetensors(dir.file("1.safetensors"));
  REQUIRE(f.tensors[0].first == "z.weight");
  REQUIRE(f.tensors[1].first == "a.bias");
  // Writing over an existing file replaces it.
  write_safetensors(dir.file("1.safetensors"), {{"only", a}});
  REQUIRE(read_safetensors(dir.file("1.safetensors")).tensors.size() == 1);
}

TEST_CASE("safetensors: reads a file written by hand from the spec", "[cpu]") {
  TempDir dir;
  // Two tensors listed in the header in the opposite order of their data, pretty-printed JSON,
  // no __metadata__, header padded with spaces to 8-byte alignment.
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 1e-30f};
  std::vector<int64_t> ids = {7, -3, 1LL << 40};
  std::string header = "{\n  \"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [24, 48]},\n"
                       "  \"ids\": {\"dtype\": \"I64\", \"shape\": [3], \"data_offsets\": [0, 24]}\n}";
  header.append((8 - header.size() % 8) % 8, ' ');
  auto data = le_bytes(ids);
  auto wb = le_bytes(w);
  data.insert(data.end(), wb.begin(), wb.end());
  const std::string path = dir.file("hand.safetensors");
  write_bytes(path, raw_file(header, data));
  SafetensorsFile f = read_safetensors(path);
  REQUIRE(f.metadata.empty());
  REQUIRE(f.tensors.size() == 2);
  REQUIRE(f.tensors[0].first == "ids");  // data-buffer order
  REQUIRE(f.tensors[0].second.dtype() == DType::kI64);
  REQUIRE(f.tensors[0].second.to_vector<int64_t>() == ids);
  REQUIRE(f.tensors[1].first == "w");
  REQUIRE(f.tensors[1].second.shape() == Shape{2, 3});
  REQUIRE(f.tensors[1].second.to_vector<float>() == w);

  // bf16 and f16 bit patterns as another writer would store them; metadata without a checksum.
  std::vector<uint16_t> bf = {0x3f80, 0xc000, 0x7f80};  // 1, -2, inf
  std::vector<uint16_t> hf = {0x3c00, 0x3555};          // 1, 0.333251953125
  std::string h2 = R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
                   R"("h":{"dtype":"F16","shape":[2],"data_offsets":[6,10]},"e":{"dtype":"F32","shape":[0],)"
                   R"("data_offsets":[10,10]}})";
  auto d2 = le_bytes(bf);
  auto hb = le_bytes(hf);
  d2.insert(d2.end(), hb.begin(), hb.end());
  write_bytes(dir.file("h2.safetensors"), raw_file(h2, d2));  // unpadded header is fine too
  f = read_safetensors(dir.file("h2.safetensors"));
  REQUIRE(f.metadata.at("format") == "pt");
  REQUIRE(f.tensors.size() == 3);
  REQUIRE(f.tensors[0].second.to_vector<float>() ==
          std::vector<float>{1.0f, -2.0f, std::numeric_limits<float>::infinity()});
  REQUIRE(f.tensors[1].second.to_vector<float>() == std::vector<float>{1.0f, 0.333251953125f});
  REQUIRE(f.tensors[2].second.numel() == 0);
}

// ---- bad input ------------------------------------------------------------------------------

namespace {
const std::string kGoodHeader = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
std::vector<uint8_t> data24() { return std::vector<uint8_t>(24, 0); }
}  // namespace

TEST_CASE("safetensors: missing, short and truncated files", "[cpu]") {
  TempDir dir;
  const std::string missing = dir.file("missing.safetensors");
  REQUIRE_THROWS_WITH(read_safetensors(missing), Contains(missing) && Contains("does not exist"));
  REQUIRE_THROWS_WITH(read_safetensors(dir.path.string()), Contains("not a regular file"));

  const std::string tiny = dir.file("tiny.safetensors");
  write_bytes(tiny, {1, 0, 0});
  REQUIRE_THROWS_WITH(read_safetensors(tiny), Contains(tiny) && Contains("too short"));

  // A valid file cut short inside the data buffer.
  const std::string good = dir.file("good.safetensors");
  write_safetensors(good, {{"x", testing::rand({4, 4}, DType::kF32, 1)}, {"y", testing::rand({8}, DType::kF32, 2)}});
  auto bytes = file_bytes(good);
  bytes.resize(bytes.size() - 10);
  const std::string cut = dir.file("cut.safetensors");
  write_bytes(cut, bytes);
  REQUIRE_THROWS_WITH(read_safetensors(cut), Contains(cut) && Contains("tensor 'y'") && Contains("outside"));

  // Cut inside the header.
  bytes.resize(20);
  write_bytes(cut, bytes);
  REQUIRE_THROWS_WITH(read_safetensors(cut), Contains(cut) && Contains("header length") && Contains("exceeds"));
}

TEST_CASE("safetensors: header length larger than the file or absurdly large", "[cpu]") {
  TempDir dir;
  const std::string p = dir.file("len.safetensors");
  write_bytes(p, raw_file(kGoodHeader, data24(), 5000));
  REQUIRE_THROWS_WITH(read_safetensors(p), Contains(p) && Contains("header length 5000 exceeds"));
  write_bytes(p, raw_file(kGoodHeader, data24(), std::numeric_limits<int64_t>::max()));
  REQUIRE_THROWS_WITH(read_safetensors(p), Contains(p) && Contains("exceeds"));
}

TEST_CASE("safetensors: malformed headers", "[cpu]") {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  auto check = [&](const std::string& header, const std::vector<uint8_t>& data, const std::string& what) {
    write_bytes(p, raw_file(header, data));
    REQUIRE_THROWS_WITH(read_safetensors(p), Contains(p) && Contains(what));
  };
  check(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})", data24(), "not valid JSON");
  check("[1, 2]", {}, "must be a JSON object");
  check(R"({"a":{"dtype":"F33","shape":[2,3],"data_offsets":[0,24]}})", data24(), "unknown dtype 'F33'");
  check(R"({"a":{"dtype":"I8","shape":[24],"data_offsets":[0,24]}})", data24(), "unsupported dtype 'I8'");
  check(R"({"a":{"dtype":"F32","shape":[2,3]}})", data24(), "tensor 'a': header entry has no 'data_offsets'");
  check(R"({"a":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,24]}})", data24(), "tensor 'a': shape must hold");
  check(R"({"a":{"dtype":"F32","shape":"2x3","data_offsets":[0,24]}})", data24(), "tensor 'a': shape must be");
  check(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0]}})", data24(), "must be [begin, end]");
  check(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[24,0]}})", data24(), "end before begin");
  check(R"({"__metadata__":{"n":1},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", data24(),
        "__metadata__ value of 'n' must be a string");
  check(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"a":{"dtype":"F32","shape":[2,3],)"
        R"("data_offsets":[0,24]}})", data24(), "tensor 'a' appears twice");
  check(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,24]}})", data24(),
        "tensor 'a': shape");
}

TEST_CASE("safetensors: shape and offsets that disagree or leave the buffer", "[cpu]") {
  TempDir dir;
  const std::string p = dir.file("off.safetensors");
  auto check = [&](const std::string& header, size_t data_bytes, const std::string& what) {
    write_bytes(p, raw_file(header, std::vector<uint8_t>(data_bytes, 0)));
    REQUIRE_THROWS_WITH(read_safetensors(p), Contains(p) && Contains(what));
  };
  // shape x dtype size != span
  check(R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[0,24]}})", 24,
        "tensor 'w': shape [2, 4] of F32 needs 32 bytes but data_offsets [0, 24] span 24 (8 elements of 4 bytes each)");
  // [2^40, 3]: a clear byte count, not "0 bytes".
  check(R"({"w":{"dtype":"F32","shape":[1099511627776,3],"data_offsets":[0,24]}})", 24,
        "shape [1099511627776, 3] of F32 needs 13194139533312 bytes but data_offsets [0, 24] span 24 "
        "(3298534883328 elements");
  // [2^62, 4] has 2^64 elements, which wrap to 0 in 64 bits: refused as too large, never "needs 0 bytes".
  check(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]},)"
        R"("v":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", 24,
        "tensor 'w': shape [4611686018427387904, 4] of F32 is too large: its size in bytes overflows");
  check(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]},)"
        R"("v":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", 24, "tensor 'w': shape [4294967296, 4294967296]");
  // A zero dim makes any other dim harmless: an empty tensor.
  write_bytes(p, raw_file(R"({"e":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]},)"
                          R"("v":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", std::vector<uint8_t>(24, 0)));
  auto f = read_safetensors(p);
  REQUIRE(f.tensors.size() == 2);
  REQUIRE(f.tensors[0].second.numel() == 0);
  // ... but an empty tensor still has strides, which must fit (the error used to name no file).
  check(R"({"e":{"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],"data_offsets":[0,0]},)"
        R"("v":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", 24,
        "tensor 'e': shape [0, 4611686018427387904, 4611686018427387904] of F32 is too large: its strides overflow");
  // beyond the buffer
  check(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}})", 24, "tensor 'w': data_offsets [8, 32] lie outside");
  // overlap
  check(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],)"
        R"("data_offsets":[8,24]}})", 24, "tensor 'b': data_offsets [8, 24] overlap tensor 'a'");
  // hole before a tensor
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],)"
        R"("data_offsets":[16,24]}})", 24, "tensor 'b': data_offsets [16, 24] leave a hole");
  // trailing bytes no tensor covers
  check(kGoodHeader, 32, "the data buffer has 32 bytes but the tensors cover only 24");
}

TEST_CASE("safetensors: a flipped data byte fails the checksum; bad BOOL bytes are refused", "[cpu]") {
  TempDir dir;
  const std::string p = dir.file("crc.safetensors");
  write_safetensors(p, {{"x", testing::rand({16}, DType::kF32, 9)}});
  auto bytes = file_bytes(p);
  bytes[bytes.size() - 5] ^= 0x10;
  write_bytes(p, bytes);
  REQUIRE_THROWS_WITH(read_safetensors(p), Contains(p) && Contains("checksum mismatch"));

  write_bytes(p, raw_file(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", {0, 2, 1}));
  REQUIRE_THROWS_WITH(read_safetensors(p), Contains(p) && Contains("tensor 'm'") && Contains("byte value 2"));
}

// Another tool that rewrites a file keeping its metadata (the safetensors library's save_file with
// metadata=..., which orders tensors its own way) gives another tensor table: the recorded CRC is not
// of that buffer and is not checked. A flip under the table the CRC was computed over still fails,
// and files from before the table's fingerprint are checked as they were.
TEST_CASE("safetensors: the checksum applies to the tensor table it was computed over", "[cpu]") {
  TempDir dir;
  Tensor a = testing::rand({4}, DType::kF32, 10), b = testing::rand({2, 2}, DType::kF32, 11);
  const std::string p = dir.file("mine.safetensors");
  write_safetensors(p, {{"z", a}, {"a", b}}, {{"format", "pt"}});
  const auto meta = read_safetensors(p).metadata;
  REQUIRE(meta.at("mt.crc32_layout").size() == 8);

  // The same tensors in the other order under the same metadata: loads.
  auto a_bytes = le_bytes(a.to_vector<float>()), b_bytes = le_bytes(b.to_vector<float>());
  const std::string meta_json = fmt::format(R"("__metadata__":{{"format":"pt","mt.crc32":"{}","mt.crc32_layout":"{}"}})",
                                            meta.at("mt.crc32"), meta.at("mt.crc32_layout"));
  const std::string resaved = "{" + meta_json + R"(,"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                              R"("z":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})";
  std::vector<uint8_t> data = b_bytes;
  data.insert(data.end(), a_bytes.begin(), a_bytes.end());
  write_bytes(dir.file("resaved.safetensors"), raw_file(resaved, data));
  SafetensorsFile f = read_safetensors(dir.file("resaved.safetensors"));
  REQUIRE(f.tensors[1].second.to_vector<float>() == a.to_vector<float>());

  // Same table, a flipped byte: corrupt.
  auto bytes = file_bytes(p);
  bytes[bytes.size() - 1] ^= 0x01;
  write_bytes(p, bytes);
  REQUIRE_THROWS_WITH(read_safetensors(p), Contains(p) && Contains("checksum mismatch"));
  // A file without the fingerprint (meshtrain before it), reordered: still checked, so refused.
  const std::string old_meta = fmt::format(R"("__metadata__":{{"mt.crc32":"{}"}})", meta.at("mt.crc32"));
  write_bytes(dir.file("old.safetensors"),
              raw_file("{" + old_meta + resaved.substr(resaved.find(",\"a\"")), data));
  REQUIRE_THROWS_WITH(read_safetensors(dir.file("old.safetensors")), Contains("checksum mismatch"));
}

// Empty tensors at one offset are listed in the header in name order whatever order they were
// written in: the table's fingerprint must not depend on it, or the CRC would go unchecked.
TEST_CASE("safetensors: empty tensors written out of name order keep the checksum checked", "[cpu]") {
  TempDir dir;
  const std::string p = dir.file("empties.safetensors");
  const Tensor none = zeros({0, 3}, TensorOptions(DType::kF32));
  write_safetensors(p, {{"y", none}, {"b", none}, {"x", testing::rand({8}, DType::kF32, 3)}, {"a", none}});
  REQUIRE(read_safetensors(p).tensors.size() == 4);
  auto bytes = file_bytes(p);
  bytes[bytes.size() - 3] ^= 0x04;
  write_bytes(p, bytes);
  REQUIRE_THROWS_WITH(read_safetensors(p), Contains(p) && Contains("checksum mismatch"));
}

TEST_CASE("safetensors: unwritable output leaves nothing behind; bad tensors are refused", "[cpu]") {
  TempDir dir;
  Tensor x = testing::rand({3}, DType::kF32, 1);
  // The parent "directory" is a regular file.
  write_bytes(dir.file("plain"), {1});
  const std::string under_file = dir.file("plain") + "/x.safetensors";
  REQUIRE_THROWS_WITH(write_safetensors(under_file, {{"x", x}}), Contains(under_file) && Contains("cannot write"));
  // The parent does not exist.
  const std::string no_parent = dir.file("nope/x.safetensors");
  REQUIRE_THROWS_WITH(write_safetensors(no_parent, {{"x", x}}), Contains(no_parent));
  // The target is a directory: the temporary file is written, the rename fails, it is removed.
  fs::create_directory(dir.path / "adir");
  const std::string adir = dir.file("adir");
  REQUIRE_THROWS_WITH(write_safetensors(adir, {{"x", x}}), Contains(adir) && Contains("cannot write"));
  REQUIRE(dir.listing() == std::vector<std::string>{"adir", "plain"});
  REQUIRE(fs::is_empty(dir.path / "adir"));

  const std::string p = dir.file("t.safetensors");
  REQUIRE_THROWS_WITH(write_safetensors(p, {{"x", x}, {"x", x}}), Contains(p) && Contains("'x' is given twice"));
  REQUIRE_THROWS_WITH(write_safetensors(p, {{"__metadata__", x}}), Contains("invalid tensor name"));
  REQUIRE_THROWS_WITH(write_safetensors(p, {{"u", Tensor()}}), Contains("'u' is undefined"));
  REQUIRE_THROWS_WITH(write_safetensors(p, {{"m", empty({2}, TensorOptions().with_device(Device::meta()))}}),
                      Contains("'m' is on the meta device"));
  REQUIRE(!fs::exists(p));
  REQUIRE(dir.listing() == std::vector<std::string>{"adir", "plain"});
}

TEST_CASE("safetensors: read_block reads exactly the requested box", "[cpu]") {
  TempDir dir;
  const std::string path = dir.file("b.safetensors");
  Tensor a = arange(0.0, 4.0 * 5 * 6, 1.0, DType::kF32).reshape({4, 5, 6});
  Tensor s = scalar_tensor(7.0, DType::kI64);
  write_safetensors(path, {{"a", a}, {"s", s}});
  SafetensorsReader r(path);
  REQUIRE(r.entries().size() == 2);
  struct Box {
    Shape off, size;
  };
  // Whole tensor (one run), trailing dims whole (merged runs), inner boxes (one run per row).
  for (const Box& b : {Box{{0, 0, 0}, {4, 5, 6}}, Box{{1, 0, 0}, {2, 5, 6}}, Box{{1, 2, 0}, {3, 2, 6}},
                       Box{{0, 1, 2}, {4, 3, 3}}, Box{{3, 4, 5}, {1, 1, 1}}, Box{{2, 0, 0}, {0, 5, 6}}}) {
    const uint64_t before = r.bytes_read();
    Tensor got = r.read_block("a", b.off, b.size);
    Tensor want = a.narrow(0, b.off[0], b.size[0]).narrow(1, b.off[1], b.size[1]).narrow(2, b.off[2], b.size[2]);
    CHECK(bytes_of(got) == bytes_of(want));
    CHECK(r.bytes_read() - before == static_cast<uint64_t>(b.size.numel() * 4));  // nothing outside the box
  }
  CHECK(r.read_block("s", Shape{}, Shape{}).item() == 7.0);
  CHECK_THROWS_WITH(r.read_block("a", {0, 0, 4}, {1, 1, 3}), Contains("b.safetensors") && Contains("'a'") &&
                                                                 Contains("leaves it"));
  CHECK_THROWS_WITH(r.read_block("nope", {}, {}), Contains("b.safetensors") && Contains("'nope' is not in the file"));
}

TEST_CASE("safetensors: the streamed writer gives write_safetensors' bytes", "[cpu]") {
  TempDir dir;
  Tensor a = arange(0.0, 12.0, 1.0, DType::kF32).reshape({3, 4});
  Tensor b = arange(0.0, 5.0, 1.0, DType::kBF16);
  write_safetensors(dir.file("x.safetensors"), {{"a", a}, {"b", b}}, {{"format", "pt"}});
  const std::vector<Tensor> ts = {a, b};
  write_safetensors_streamed(dir.file("y.safetensors"), {{"a", DType::kF32, a.shape()}, {"b", DType::kBF16, b.shape()}},
                             [&](size_t i) { return ts[i]; }, {{"format", "pt"}});
  CHECK(file_bytes(dir.file("x.safetensors")) == file_bytes(dir.file("y.safetensors")));
  CHECK(read_safetensors(dir.file("y.safetensors")).tensors.size() == 2);  // CRC checked
}
