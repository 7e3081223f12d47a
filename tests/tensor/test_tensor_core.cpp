// Tensor core: dtypes (16-bit conversions, casts, promotion), factories, views, copies, casts,
// printing, errors.
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/error.h"
#include "testing.h"

using namespace mt;
using mt::testing::allclose;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t bf16_bits(float f) { return BFloat16(f).bits; }
uint16_t f16_bits(float f) { return Float16(f).bits; }
float from_bf16(uint16_t b) {
  BFloat16 h;
  h.bits = b;
  return h;
}
float from_f16(uint16_t b) {
  Float16 h;
  h.bits = b;
  return h;
}

// Naive row-major element offset for multi-index `idx` in t.
template <class T>
T at(const Tensor& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0;
  int d = 0;
  for (int64_t i : idx) off += i * t.stride(d++);
  return static_cast<T*>(t.data_ptr())[off];
}

}  // namespace

// ---- dtypes -------------------------------------------------------------------------------------

TEST_CASE("dtype names, sizes and classes", "[cpu]") {
  REQUIRE(std::string(dtype_name(DType::kBF16)) == "bf16");
  REQUIRE(std::string(dtype_name(DType::kBool)) == "bool");
  REQUIRE(dtype_size(DType::kF64) == 8);
  REQUIRE(dtype_size(DType::kF16) == 2);
  REQUIRE(dtype_size(DType::kI32) == 4);
  REQUIRE(dtype_size(DType::kU8) == 1);
  REQUIRE(is_floating(DType::kF16));
  REQUIRE(is_floating(DType::kBF16));
  REQUIRE_FALSE(is_floating(DType::kI64));
  REQUIRE(is_integral(DType::kBool));
  REQUIRE(is_integral(DType::kU8));
  REQUIRE(fmt::format("{}", DType::kI32) == "i32");
}

TEST_CASE("sizes that overflow int64 are refused, never wrapped to a small count", "[cpu]") {
  using Catch::Contains;
  const int64_t big = int64_t{1} << 62;
  REQUIRE_THROWS_WITH((Shape{big, 4}.numel()), Contains("[4611686018427387904, 4] has more elements than an int64"));
  REQUIRE_THROWS_WITH((Shape{int64_t{1} << 32, int64_t{1} << 32}.numel()), Contains("overflows"));
  REQUIRE((Shape{big, 0, 4}.numel()) == 0);  // a zero size: empty, whatever the others are
  REQUIRE((Shape{big, 1}.numel()) == big);
  int64_t out = 0;
  REQUIRE(!checked_mul(big, 2, &out));
  REQUIRE(checked_mul(big, 1, &out));
  REQUIRE(!checked_add(std::numeric_limits<int64_t>::max(), 1, &out));
  // The bytes of a storage overflow before its elements do: [2^61, 2] f32 is 2^64 bytes.
  REQUIRE_THROWS_WITH(empty({int64_t{1} << 61, 2}), Contains("empty: a f32 tensor of shape") &&
                                                        Contains("more than 2^63 bytes"));
  REQUIRE_THROWS_WITH(empty({big, 4}, TensorOptions().with_device(Device::meta())), Contains("more than 2^63 bytes"));
  REQUIRE(empty({big, 0}).numel() == 0);
}

TEST_CASE("bf16 conversion: round to nearest even, ties, specials", "[cpu]") {
  REQUIRE(bf16_bits(1.0f) == 0x3f80);
  REQUIRE(bf16_bits(-2.0f) == 0xc000);
  REQUIRE(bf16_bits(0.0f) == 0x0000);
  REQUIRE(bf16_bits(-0.0f) == 0x8000);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (down).
  REQUIRE(bf16_bits(f32_from_bits(0x3f808000)) == 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): up.
  REQUIRE(bf16_bits(f32_from_bits(0x3f818000)) == 0x3f82);
  // Just above / below the tie.
  REQUIRE(bf16_bits(f32_from_bits(0x3f808001)) == 0x3f81);
  REQUIRE(bf16_bits(f32_from_bits(0x3f807fff)) == 0x3f80);
  // Infinity and overflow: FLT_MAX rounds up to inf, the largest bf16 stays.
  REQUIRE(bf16_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  REQUIRE(bf16_bits(-std::numeric_limits<float>::infinity()) == 0xff80);
  REQUIRE(bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);
  REQUIRE(bf16_bits(f32_from_bits(0x7f7f0000)) == 0x7f7f);
  // NaN stays NaN (quiet), including a signaling NaN whose payload sits in the low bits.
  uint16_t n = bf16_bits(f32_from_bits(0x7f800001));
  REQUIRE((n & 0x7f80) == 0x7f80);
  REQUIRE((n & 0x7f) != 0);
  REQUIRE(std::isnan(from_bf16(n)));
  REQUIRE(std::isnan(from_bf16(bf16_bits(std::nanf("")))));
  // Subnormals: float subnormal 2^-130 = 0x00080000 is exactly a bf16 subnormal.
  REQUIRE(bf16_bits(f32_from_bits(0x00080000)) == 0x0008);
  REQUIRE(from_bf16(0x0001) == f32_from_bits(0x00010000));
  // Round trip of every finite bf16 pattern.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = from_bf16(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    REQUIRE(bf16_bits(f) == b);
  }
}

TEST_CASE("f16 conversion: round to nearest even, ties, subnormals, overflow", "[cpu]") {
  REQUIRE(f16_bits(1.0f) == 0x3c00);
  REQUIRE(f16_bits(-2.0f) == 0xc000);
  REQUIRE(f16_bits(65504.0f) == 0x7bff);
  REQUIRE(f16_bits(0.5f) == 0x3800);
  REQUIRE(f16_bits(-0.0f) == 0x8000);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (down); 1 + 3*2^-11: up.
  REQUIRE(f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  REQUIRE(f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  REQUIRE(f16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)) == 0x3c01);
  // Overflow: 65519 rounds to 65504, 65520 (the tie, odd neighbour) rounds to inf.
  REQUIRE(f16_bits(65519.0f) == 0x7bff);
  REQUIRE(f16_bits(65520.0f) == 0x7c00);
  REQUIRE(f16_bits(1e10f) == 0x7c00);
  REQUIRE(f16_bits(-1e10f) == 0xfc00);
  REQUIRE(f16_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  // NaN.
  uint16_t n = f16_bits(std::nanf(""));
  REQUIRE((n & 0x7c00) == 0x7c00);
  REQUIRE((n & 0x3ff) != 0);
  REQUIRE(std::isnan(from_f16(0x7e00)));
  REQUIRE(std::isinf(from_f16(0x7c00)));
  // Subnormals: smallest 2^-24, largest 0x3ff * 2^-24, smallest normal 2^-14.
  REQUIRE(f16_bits(std::ldexp(1.0f, -24)) == 0x0001);
  REQUIRE(f16_bits(std::ldexp(1023.0f, -24)) == 0x03ff);
  REQUIRE(f16_bits(std::ldexp(1.0f, -14)) == 0x0400);
  REQUIRE(f16_bits(-std::ldexp(1.0f, -24)) == 0x8001);
  REQUIRE(f16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 2^-24: even (0)
  REQUIRE(f16_bits(std::ldexp(3.0f, -25)) == 0x0002);  // tie between 1 and 2 units: even (2)
  REQUIRE(f16_bits(std::ldexp(5.0f, -25)) == 0x0002);  // tie between 2 and 3 units: even (2)
  REQUIRE(f16_bits(std::ldexp(1.5f, -25)) == 0x0001);  // above the tie
  REQUIRE(f16_bits(std::ldexp(1.0f, -26)) == 0x0000);
  REQUIRE(f16_bits(std::ldexp(2047.0f, -25)) == 0x0400);  // largest subnormal + half unit: even (normal)
  REQUIRE(from_f16(0x0001) == std::ldexp(1.0f, -24));
  REQUIRE(from_f16(0x03ff) == std::ldexp(1023.0f, -24));
  REQUIRE(from_f16(0x8200) == -std::ldexp(512.0f, -24));
  // Round trip of every non-NaN f16 pattern.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = from_f16(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    REQUIRE(f16_bits(f) == b);
  }
  // Every float between two neighbouring f16 values rounds to the nearer one (sampled).
  for (uint32_t b = 0x0001; b < 0x7bff; b += 37) {
    float lo = from_f16(static_cast<uint16_t>(b)), hi = from_f16(static_cast<uint16_t>(b + 1));
    float mid = lo + (hi - lo) / 2;
    REQUIRE(f16_bits(std::nextafter(mid, lo)) == b);
    REQUIRE(f16_bits(std::nextafter(mid, hi)) == b + 1);
    REQUIRE(f16_bits(mid) == ((b & 1) ? b + 1 : b));
  }
}

TEST_CASE("f64 to bf16/f16 rounds once (no double rounding through f32)", "[cpu]") {
  // 1 + 2^-8 + 2^-40: just above the bf16 tie; rounding to f32 first lands on the tie, which
  // would then round down to 1.
  double x = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  Tensor t = from_vector<double>({x, -x}, {2}, DType::kBF16);
  REQUIRE(t.to_vector<float>() == std::vector<float>{1.0078125f, -1.0078125f});
  double y = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  Tensor h = from_vector<double>({y}, {1}, DType::kF16);
  REQUIRE(h.to_vector<float>()[0] == 1.0f + std::ldexp(1.0f, -10));
}

TEST_CASE("type promotion table", "[cpu]") {
  using D = DType;
  const D all[] = {D::kF64, D::kF32, D::kBF16, D::kF16, D::kI64, D::kI32, D::kU8, D::kBool};
  for (D a : all) {
    REQUIRE(promote(a, a) == a);
    for (D b : all) REQUIRE(promote(a, b) == promote(b, a));
  }
  REQUIRE(promote(D::kBool, D::kU8) == D::kU8);
  REQUIRE(promote(D::kU8, D::kI32) == D::kI32);
  REQUIRE(promote(D::kI32, D::kI64) == D::kI64);
  REQUIRE(promote(D::kI64, D::kBF16) == D::kBF16);
  REQUIRE(promote(D::kI64, D::kF16) == D::kF16);
  REQUIRE(promote(D::kBF16, D::kF16) == D::kF32);
  REQUIRE(promote(D::kBF16, D::kF32) == D::kF32);
  REQUIRE(promote(D::kF16, D::kF64) == D::kF64);
  REQUIRE(promote(D::kF32, D::kF64) == D::kF64);
  REQUIRE(promote(D::kBool, D::kF32) == D::kF32);
  // The result of a binary op follows the table.
  REQUIRE(add(ones({2}, D::kI32), ones({2}, D::kU8)).dtype() == D::kI32);
  REQUIRE(add(ones({2}, D::kBF16), ones({2}, D::kF16)).dtype() == D::kF32);
  REQUIRE(mul(ones({2}, D::kI64), ones({2}, D::kF16)).dtype() == D::kF16);
}

TEST_CASE("casts between all dtypes", "[cpu]") {
  using D = DType;
  const D all[] = {D::kF64, D::kF32, D::kBF16, D::kF16, D::kI64, D::kI32, D::kU8, D::kBool};
  // Values every dtype can hold exactly.
  std::vector<double> v = {0, 1, 2, 7, 100};
  for (D a : all) {
    Tensor ta = from_vector<double>(a == D::kBool ? std::vector<double>{0, 1, 1, 1, 1} : v, {5}, a);
    for (D b : all) {
      Tensor tb = ta.to(b);
      REQUIRE(tb.dtype() == b);
      std::vector<double> expect = ta.to_vector<double>();
      if (b == D::kBool)
        for (auto& e : expect) e = e != 0;
      INFO(dtype_name(a) << " -> " << dtype_name(b));
      REQUIRE(tb.to_vector<double>() == expect);
      // Non-contiguous source too.
      REQUIRE(noncontig(ta).to(b).to_vector<double>() == expect);
    }
  }
  // float -> int truncates toward zero; -> bool is "nonzero" (NaN counts as true).
  Tensor f = from_vector<double>({-2.7, -0.5, 0.0, 0.5, 2.7, 300.9}, {6});
  REQUIRE(f.to(D::kI64).to_vector<int64_t>() == std::vector<int64_t>{-2, 0, 0, 0, 2, 300});
  REQUIRE(f.to(D::kI32).to_vector<int32_t>() == std::vector<int32_t>{-2, 0, 0, 0, 2, 300});
  REQUIRE(f.to(D::kF32).to(D::kI32).to_vector<int32_t>() == std::vector<int32_t>{-2, 0, 0, 0, 2, 300});
  REQUIRE(f.to(D::kBool).to_vector<uint8_t>() == std::vector<uint8_t>{1, 1, 0, 1, 1, 1});
  Tensor nan = from_vector<double>({std::nan(""), 0.0}, {2});
  REQUIRE(nan.to(D::kBool).to_vector<uint8_t>() == std::vector<uint8_t>{1, 0});
  REQUIRE(from_vector<double>({0.25}, {1}).to(D::kBF16).to(D::kBool).to_vector<uint8_t>()[0] == 1);
  // int -> bf16 rounds to nearest even.
  Tensor big = from_vector<int64_t>({257, 259, 1000001}, {3});
  REQUIRE(big.to(D::kBF16).to_vector<double>() == std::vector<double>{256, 260, 999424});
  REQUIRE(big.to(D::kF16).to_vector<double>() == std::vector<double>{257, 259, std::numeric_limits<double>::infinity()});
  // bool -> numbers gives 0/1.
  REQUIRE(from_vector<uint8_t>({0, 3}, {2}).to(D::kBool).to(D::kF32).to_vector<float>() == std::vector<float>{0, 1});
}

// ---- factories ----------------------------------------------------------------------------------

TEST_CASE("factories and metadata", "[cpu]") {
  Tensor t = zeros({2, 3});
  REQUIRE(t.dim() == 2);
  REQUIRE(t.numel() == 6);
  REQUIRE(t.dtype() == DType::kF32);
  REQUIRE(t.is_contiguous());
  REQUIRE(t.strides() == Shape{3, 1});
  REQUIRE(t.size(-1) == 3);
  REQUIRE(t.stride(0) == 3);
  Tensor a = arange(6);
  REQUIRE(a.dtype() == DType::kI64);
  REQUIRE(a.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  REQUIRE(arange(1.0, 2.0, 0.25, DType::kF64).to_vector<double>() == std::vector<double>{1, 1.25, 1.5, 1.75});
  REQUIRE(arange(5.0, 0.0, -2.0, DType::kI32).to_vector<int32_t>() == std::vector<int32_t>{5, 3, 1});
  REQUIRE(arange(3.0, 1.0, 1.0).numel() == 0);
  REQUIRE_THROWS_WITH(arange(0.0, 1.0, 0.0), Catch::Contains("arange") && Catch::Contains("step"));
  Tensor f = full({2}, 2.5, DType::kF64);
  REQUIRE(f.to_vector<double>() == std::vector<double>{2.5, 2.5});
  REQUIRE(full({3}, -7, DType::kI64).to_vector<int64_t>() == std::vector<int64_t>{-7, -7, -7});
  REQUIRE(full({2}, 2, DType::kBool).to_vector<uint8_t>() == std::vector<uint8_t>{1, 1});
  REQUIRE(ones({2, 2}, DType::kBF16).to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  Tensor s = scalar_tensor(3.5);
  REQUIRE(s.dim() == 0);
  REQUIRE(s.numel() == 1);
  REQUIRE(s.item() == 3.5);
  REQUIRE(scalar_tensor(9, DType::kI64).item_int() == 9);
  Tensor e = empty({0, 4});
  REQUIRE(e.numel() == 0);
  REQUIRE(e.to_vector<float>().empty());
  REQUIRE(zeros_like(f).dtype() == DType::kF64);
  REQUIRE(ones_like(a).to_vector<int64_t>() == std::vector<int64_t>(6, 1));
  Tensor fv = from_vector<float>({1, 2, 3, 4}, {2, 2});
  REQUIRE(fv.shape() == Shape{2, 2});
  REQUIRE(at<float>(fv, {1, 0}) == 3);
  REQUIRE(from_vector<int32_t>({1, 2}, {2}, DType::kF64).dtype() == DType::kF64);
  Tensor g = from_vector<double>({1, 2}, {2}, TensorOptions(DType::kF64).with_grad());
  REQUIRE(g.requires_grad());
  REQUIRE(g.is_leaf());
  REQUIRE(fmt::format("{}", g) == "f64[2] cpu");
  REQUIRE(fmt::format("{}", Tensor()) == "undefined");
}

TEST_CASE("factory and metadata errors", "[cpu]") {
  REQUIRE_THROWS_WITH(from_vector<float>({1, 2, 3}, {2, 2}),
                      Catch::Contains("from_vector") && Catch::Contains("[2, 2]"));
  REQUIRE_THROWS_WITH(empty({2, -1}), Catch::Contains("negative size") && Catch::Contains("[2, -1]"));
  REQUIRE_THROWS_WITH(zeros({2}, TensorOptions(DType::kI64).with_grad()), Catch::Contains("i64"));
  REQUIRE_THROWS_WITH(zeros({2}, DType::kI32).requires_grad_(), Catch::Contains("requires_grad_"));
  REQUIRE_THROWS_WITH(zeros({2, 3}).size(2), Catch::Contains("size") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(zeros({2, 3}).item(), Catch::Contains("item") && Catch::Contains("6 elements"));
  REQUIRE_THROWS_AS(Shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), mt::Error);
  Tensor meta = empty({2, 3}, TensorOptions().with_device(Device::meta()));
  REQUIRE(meta.is_meta());
  REQUIRE(meta.data_ptr() == nullptr);
  REQUIRE_THROWS_WITH(meta.fill_(1), Catch::Contains("meta"));
  REQUIRE_THROWS_WITH(meta.to(Device::cpu()), Catch::Contains("meta"));
}

TEST_CASE("shape helpers", "[cpu]") {
  REQUIRE(broadcast_shapes({3, 1, 5}, {4, 1}, "t") == Shape{3, 4, 5});
  REQUIRE(broadcast_shapes({}, {2, 3}, "t") == Shape{2, 3});
  REQUIRE(broadcast_shapes({0, 1}, {1, 3}, "t") == Shape{0, 3});
  REQUIRE_THROWS_WITH(broadcast_shapes({2, 3}, {4, 3}, "myop"),
                      Catch::Contains("myop") && Catch::Contains("[2, 3]") && Catch::Contains("[4, 3]"));
  REQUIRE(wrap_dim(-1, 3, "t") == 2);
  REQUIRE(wrap_dim(0, 0, "t") == 0);
  REQUIRE(wrap_dim(-1, 0, "t") == 0);
  REQUIRE_THROWS_WITH(wrap_dim(3, 3, "myop"), Catch::Contains("myop") && Catch::Contains("dim 3"));
  REQUIRE_THROWS_AS(wrap_dim(-4, 3, "t"), mt::Error);
  Shape s{2, 3, 4};
  REQUIRE(s.contiguous_strides() == Shape{12, 4, 1});
  REQUIRE(Shape{2, 0, 3}.contiguous_strides() == Shape{3, 3, 1});
  s.insert(1, 7);
  REQUIRE(s == Shape{2, 7, 3, 4});
  s.erase(0);
  REQUIRE(s == Shape{7, 3, 4});
  REQUIRE(s.numel() == 84);
  REQUIRE(Shape{}.numel() == 1);
  REQUIRE(fmt::format("{}", Shape{2, 3}) == "[2, 3]");
}

// ---- views --------------------------------------------------------------------------------------

namespace {
Tensor iota(const Shape& s, DType t = DType::kF64) { return arange(s.numel(), t).view(s); }
std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }
}  // namespace

TEST_CASE("view: -1, shared storage, legal and illegal views of non-contiguous tensors", "[cpu]") {
  Tensor x = iota({2, 3, 4});
  REQUIRE(x.view({-1, 4}).shape() == Shape{6, 4});
  REQUIRE(x.view({4, -1}).shape() == Shape{4, 6});
  REQUIRE(x.view({-1}).shape() == Shape{24});
  REQUIRE(vals(x.view({24})) == vals(arange(24, DType::kF64)));
  REQUIRE(x.view({2, 1, 3, 1, 4}).strides() == Shape{12, 12, 4, 4, 1});
  // Writes through a view are visible in the base (and vice versa).
  Tensor v = x.view({6, 4});
  REQUIRE(v.data_ptr() == x.data_ptr());
  {
    Tensor row = v.select(0, 5);
    row.fill_(-1);
  }
  REQUIRE(at<double>(x, {1, 2, 3}) == -1);
  REQUIRE(at<double>(x, {1, 2, 0}) == -1);
  x.zero_();
  REQUIRE(vals(v) == std::vector<double>(24, 0));
  // Non-contiguous but viewable: a transposed tensor split/merged along its contiguous runs.
  Tensor y = iota({4, 6}).t();  // [6, 4], strides [1, 6]
  REQUIRE_FALSE(y.is_contiguous());
  Tensor ys = y.view({2, 3, 4});  // splitting the stride-1 dim is fine
  REQUIRE(ys.strides() == Shape{3, 1, 6});
  REQUIRE(at<double>(ys, {1, 2, 3}) == at<double>(y, {5, 3}));
  Tensor z = iota({4, 6}).slice(1, 0, 6, 2);  // [4, 3], strides [6, 2]
  REQUIRE(z.view({2, 2, 3}).strides() == Shape{12, 6, 2});
  REQUIRE(z.view({4, 3, 1}).shape() == Shape{4, 3, 1});
  // Illegal: merging dims that are not adjacent in memory.
  REQUIRE_THROWS_WITH(y.view({24}), Catch::Contains("view") && Catch::Contains("reshape"));
  REQUIRE(z.view({12}).strides() == Shape{2});  // stride 2 throughout: still one run
  Tensor z2 = iota({4, 6}).slice(1, 0, 3);     // [4, 3], strides [6, 1]
  REQUIRE(z2.view({2, 2, 3}).strides() == Shape{12, 6, 1});
  REQUIRE_THROWS_WITH(z2.view({12}), Catch::Contains("view") && Catch::Contains("[4, 3]"));
  REQUIRE_THROWS_AS(z2.view({4, 1, 3}).view({2, 6}), mt::Error);
  Tensor e = iota({3, 1}).expand({3, 4});
  REQUIRE_THROWS_AS(e.view({12}), mt::Error);
  // Bad shapes.
  REQUIRE_THROWS_WITH(x.view({5, -1}), Catch::Contains("view") && Catch::Contains("[5, -1]") && Catch::Contains("24"));
  REQUIRE_THROWS_WITH(x.view({-1, -1}), Catch::Contains("only one dim may be -1"));
  REQUIRE_THROWS_WITH(x.view({5, 5}), Catch::Contains("[5, 5]"));
  REQUIRE_THROWS_AS(x.view({-2, 12}), mt::Error);
  // 0-d and empty.
  Tensor s = scalar_tensor(2.0, DType::kF64);
  REQUIRE(s.view({1, 1}).shape() == Shape{1, 1});
  REQUIRE(s.view({1}).view({}).dim() == 0);
  REQUIRE(empty({0, 3}).view({3, 0, 5}).shape() == Shape{3, 0, 5});
  REQUIRE(empty({0, 3}).view({-1, 3}).shape() == Shape{0, 3});
  REQUIRE_THROWS_AS(empty({0, 3}).view({-1, 0}), mt::Error);  // -1 could be anything
}

TEST_CASE("reshape views when it can and copies when it must", "[cpu]") {
  Tensor x = iota({2, 3, 4});
  Tensor r = x.reshape({4, 6});
  REQUIRE(r.data_ptr() == x.data_ptr());
  Tensor y = x.transpose(0, 2);  // [4, 3, 2]
  Tensor c = y.reshape({-1});
  REQUIRE(c.is_contiguous());
  REQUIRE(c.data_ptr() != x.data_ptr());
  std::vector<double> expect;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) expect.push_back(k * 12 + j * 4 + i);
  REQUIRE(vals(c) == expect);
  // Views that stay possible on a non-contiguous tensor do not copy.
  REQUIRE(y.reshape({4, 3, 2, 1}).data_ptr() == x.data_ptr());
  REQUIRE_THROWS_WITH(x.reshape({7, -1}), Catch::Contains("reshape"));
}

TEST_CASE("permute, transpose, t", "[cpu]") {
  Tensor x = iota({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});
  REQUIRE(p.shape() == Shape{4, 2, 3});
  REQUIRE(p.strides() == Shape{1, 12, 4});
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k) REQUIRE(at<double>(p, {i, j, k}) == at<double>(x, {j, k, i}));
  REQUIRE(x.permute({-1, -3, -2}).shape() == Shape{4, 2, 3});
  REQUIRE(x.transpose(-1, 0).shape() == Shape{4, 3, 2});
  REQUIRE(x.transpose(1, 1).strides() == x.strides());
  Tensor m = iota({2, 5});
  REQUIRE(m.t().shape() == Shape{5, 2});
  REQUIRE(at<double>(m.t(), {4, 1}) == 9);
  REQUIRE(iota({3}).t().shape() == Shape{3});
  REQUIRE(scalar_tensor(1.0).t().dim() == 0);
  REQUIRE_THROWS_WITH(x.t(), Catch::Contains("t:"));
  REQUIRE_THROWS_WITH(x.permute({0, 1}), Catch::Contains("permute"));
  REQUIRE_THROWS_WITH(x.permute({0, 1, 1}), Catch::Contains("permute") && Catch::Contains("repeated"));
  REQUIRE_THROWS_WITH(x.permute({0, 1, 3}), Catch::Contains("permute") && Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(x.transpose(0, 3), Catch::Contains("transpose"));
}

TEST_CASE("narrow, slice with step and negative indices, select", "[cpu]") {
  Tensor x = iota({5, 7});
  Tensor n = x.narrow(1, 2, 3);
  REQUIRE(n.shape() == Shape{5, 3});
  REQUIRE(at<double>(n, {4, 0}) == 30);
  REQUIRE(x.narrow(-1, -3, 2).shape() == Shape{5, 2});
  REQUIRE(at<double>(x.narrow(-1, -3, 2), {0, 0}) == 4);
  REQUIRE_THROWS_WITH(x.narrow(1, 5, 3), Catch::Contains("narrow") && Catch::Contains("size 7"));
  REQUIRE_THROWS_WITH(x.narrow(1, 0, -1), Catch::Contains("narrow"));

  Tensor s = x.slice(1, 1, 7, 2);  // columns 1, 3, 5
  REQUIRE(s.shape() == Shape{5, 3});
  REQUIRE(s.strides() == Shape{7, 2});
  REQUIRE(vals(s.select(0, 1)) == std::vector<double>{8, 10, 12});
  REQUIRE(vals(x.slice(1, 0, 7, 3).select(0, 0)) == std::vector<double>{0, 3, 6});
  REQUIRE(vals(x.slice(1, -3, -1).select(0, 0)) == std::vector<double>{4, 5});
  REQUIRE(vals(x.slice(1, -100, 100, 4).select(0, 2)) == std::vector<double>{14, 18});
  REQUIRE(x.slice(1, 5, 2).numel() == 0);
  REQUIRE(x.slice(0, 7, 9).shape() == Shape{0, 7});
  REQUIRE(vals(x.slice(0, 1, 5, 2).slice(1, 1, 7, 3)) == std::vector<double>{8, 11, 22, 25});
  REQUIRE_THROWS_WITH(x.slice(1, 0, 7, 0), Catch::Contains("slice") && Catch::Contains("step"));
  REQUIRE_THROWS_WITH(x.slice(2, 0, 1), Catch::Contains("slice"));

  REQUIRE(vals(x.select(1, -1)) == std::vector<double>{6, 13, 20, 27, 34});
  REQUIRE(x.select(0, 2).shape() == Shape{7});
  REQUIRE(x.select(0, 2).select(0, 3).dim() == 0);
  REQUIRE(x.select(0, 2).select(0, 3).item() == 17);
  REQUIRE_THROWS_WITH(x.select(0, 5), Catch::Contains("select") && Catch::Contains("index 5"));
  REQUIRE_THROWS_WITH(x.select(1, -8), Catch::Contains("select"));
  // Writing into a strided slice is visible in the base.
  x.slice(1, 1, 7, 2).fill_(-1);
  REQUIRE(vals(x.select(0, 0)) == std::vector<double>{0, -1, 2, -1, 4, -1, 6});
}

TEST_CASE("expand, squeeze, unsqueeze, flatten", "[cpu]") {
  Tensor x = iota({3, 1});
  Tensor e = x.expand({2, 3, 4});
  REQUIRE(e.shape() == Shape{2, 3, 4});
  REQUIRE(e.strides() == Shape{0, 1, 0});
  REQUIRE(e.data_ptr() == x.data_ptr());
  REQUIRE(at<double>(e, {1, 2, 3}) == 2);
  REQUIRE(x.expand({-1, 5}).shape() == Shape{3, 5});
  REQUIRE(x.expand({3, 0}).numel() == 0);
  REQUIRE(x.expand({3, 1}).same(x));
  REQUIRE(scalar_tensor(4.0).expand({2, 2}).strides() == Shape{0, 0});
  REQUIRE_THROWS_WITH(x.expand({4, 2}), Catch::Contains("expand") && Catch::Contains("[4, 2]"));
  REQUIRE_THROWS_WITH(x.expand({5}), Catch::Contains("expand") && Catch::Contains("fewer dims"));
  REQUIRE_THROWS_WITH(x.expand({-1, 3, 4}), Catch::Contains("expand"));
  REQUIRE_THROWS_AS(x.expand({3, -2}), mt::Error);

  Tensor y = iota({1, 3, 1, 2});
  REQUIRE(y.squeeze().shape() == Shape{3, 2});
  REQUIRE(y.squeeze(0).shape() == Shape{3, 1, 2});
  REQUIRE(y.squeeze(-2).shape() == Shape{1, 3, 2});
  REQUIRE(y.squeeze(1).shape() == y.shape());
  REQUIRE(iota({1}).squeeze().dim() == 0);
  REQUIRE_THROWS_WITH(y.squeeze(4), Catch::Contains("squeeze"));
  REQUIRE(y.unsqueeze(0).shape() == Shape{1, 1, 3, 1, 2});
  REQUIRE(y.unsqueeze(-1).shape() == Shape{1, 3, 1, 2, 1});
  REQUIRE(y.unsqueeze(4).shape() == Shape{1, 3, 1, 2, 1});
  REQUIRE(scalar_tensor(1.0).unsqueeze(0).shape() == Shape{1});
  REQUIRE_THROWS_WITH(y.unsqueeze(6), Catch::Contains("unsqueeze"));
  // Squeeze/unsqueeze of a non-contiguous tensor stays a view.
  Tensor nt = iota({4, 3}).t();
  REQUIRE(nt.unsqueeze(1).data_ptr() == nt.data_ptr());
  REQUIRE(at<double>(nt.unsqueeze(1), {2, 0, 3}) == at<double>(nt, {2, 3}));
  REQUIRE(nt.unsqueeze(1).squeeze(1).strides() == nt.strides());

  Tensor z = iota({2, 3, 4, 5});
  REQUIRE(z.flatten().shape() == Shape{120});
  REQUIRE(z.flatten(1).shape() == Shape{2, 60});
  REQUIRE(z.flatten(1, 2).shape() == Shape{2, 12, 5});
  REQUIRE(z.flatten(-2, -1).shape() == Shape{2, 3, 20});
  REQUIRE(z.flatten(2, 2).shape() == z.shape());
  REQUIRE(scalar_tensor(1.0).flatten().shape() == Shape{1});
  REQUIRE_THROWS_WITH(z.flatten(2, 1), Catch::Contains("flatten"));
  Tensor zt = z.transpose(1, 2);
  REQUIRE(vals(zt.flatten(1, 2)) == vals(zt.contiguous().view({2, 12, 5})));
}

TEST_CASE("contiguous, clone, copy_, in-place ops", "[cpu]") {
  Tensor x = iota({3, 4});
  REQUIRE(x.contiguous().same(x));
  Tensor t = x.t();
  Tensor c = t.contiguous();
  REQUIRE(c.is_contiguous());
  REQUIRE(c.data_ptr() != x.data_ptr());
  REQUIRE(vals(c) == vals(t));
  Tensor k = x.clone();
  REQUIRE(k.data_ptr() != x.data_ptr());
  k.fill_(0);
  REQUIRE(at<double>(x, {2, 3}) == 11);
  // copy_ broadcasts and converts.
  Tensor d = zeros({2, 3}, DType::kF32);
  d.copy_(from_vector<int64_t>({1, 2, 3}, {3}));
  REQUIRE(d.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
  d.t().copy_(iota({3, 2}));
  REQUIRE(d.to_vector<float>() == std::vector<float>{0, 2, 4, 1, 3, 5});
  REQUIRE_THROWS_WITH(d.copy_(zeros({3, 3})), Catch::Contains("copy_") && Catch::Contains("[3, 3]"));
  REQUIRE_THROWS_WITH(d.copy_(zeros({2, 1, 3})), Catch::Contains("copy_"));
  // add_/mul_ with broadcasting, alpha and dtype conversion.
  Tensor a = ones({2, 3}, DType::kF64);
  a.add_(iota({3}), 2.0);
  REQUIRE(vals(a) == std::vector<double>{1, 3, 5, 1, 3, 5});
  a.mul_(0.5);
  REQUIRE(vals(a) == std::vector<double>{0.5, 1.5, 2.5, 0.5, 1.5, 2.5});
  a.mul_(from_vector<double>({2, 0}, {2, 1}));
  REQUIRE(vals(a) == std::vector<double>{1, 3, 5, 0, 0, 0});
  Tensor ia = full({3}, 10, DType::kI64);
  ia.add_(full({3}, 3, DType::kI64), 2.5);  // 3 * 2.5 = 7.5 -> added in i64 as 7.5 truncated
  REQUIRE(ia.to_vector<int64_t>() == std::vector<int64_t>{17, 17, 17});
  ia.add_(from_vector<float>({0.5f, 1.0f, 2.0f}, {3}));
  REQUIRE(ia.to_vector<int64_t>() == std::vector<int64_t>{17, 18, 19});
  Tensor big = full({1}, 0, DType::kI64);
  big.fill_(0);
  big.add_(from_vector<int64_t>({(int64_t{1} << 60) + 1}, {1}));
  REQUIRE(big.to_vector<int64_t>()[0] == (int64_t{1} << 60) + 1);
  REQUIRE(add(big, 2.0).to_vector<int64_t>()[0] == (int64_t{1} << 60) + 3);
  REQUIRE(mul(big, 1.0).to_vector<int64_t>()[0] == (int64_t{1} << 60) + 1);
  REQUIRE_THROWS_WITH(a.add_(zeros({3, 3})), Catch::Contains("add_"));
  REQUIRE_THROWS_WITH(a.mul_(zeros({4})), Catch::Contains("mul_"));
  // In-place through a strided view bumps the version of the shared storage.
  uint32_t v0 = x.impl()->storage->version;
  x.slice(1, 0, 4, 3).mul_(2.0);
  REQUIRE(x.impl()->storage->version == v0 + 1);
  REQUIRE(vals(x.select(0, 1)) == std::vector<double>{8, 5, 6, 14});
}

TEST_CASE("to_vector, item and 16-bit storage through tensors", "[cpu]") {
  Tensor b = from_vector<float>({1.0f, 1.00390625f, -3.0f, 65504.0f, 70000.0f}, {5}, DType::kF16);
  REQUIRE(b.to_vector<float>() == std::vector<float>{1.0f, 1.00390625f, -3.0f, 65504.0f, std::numeric_limits<float>::infinity()});
  Tensor h = from_vector<float>({1.0f, 1.00390625f, 3.0e38f}, {3}, DType::kBF16);
  REQUIRE(h.to_vector<float>() == std::vector<float>{1.0f, 1.0f, f32_from_bits(0x7f620000)});
  REQUIRE(noncontig(rand({3, 5}, DType::kBF16)).to_vector<float>() == rand({3, 5}, DType::kBF16).to_vector<float>());
  REQUIRE(scalar_tensor(2.5, DType::kBF16).item() == 2.5);
}

// ---- printing -----------------------------------------------------------------------------------

TEST_CASE("printing small, large, 0-d, integral and meta tensors", "[cpu]") {
  REQUIRE(scalar_tensor(1.5).str() == "tensor(1.5000, f32[] cpu)");
  REQUIRE(scalar_tensor(3, DType::kI64).str() == "tensor(3, i64[] cpu)");
  REQUIRE(arange(3).str() == "tensor([0, 1, 2], i64[3] cpu)");
  REQUIRE(iota({2, 2}, DType::kF32).str() == "tensor([[0.0000, 1.0000],\n        [2.0000, 3.0000]], f32[2, 2] cpu)");
  REQUIRE(iota({2, 2}, DType::kF32).t().str() == "tensor([[0.0000, 2.0000],\n        [1.0000, 3.0000]], f32[2, 2] cpu)");
  REQUIRE(arange(10).str() == "tensor([0, 1, 2, ..., 7, 8, 9], i64[10] cpu)");
  std::string big = arange(100).view({10, 10}).str();
  REQUIRE(big.find("[0, 1, 2, ..., 7, 8, 9]") != std::string::npos);
  REQUIRE(big.find("[90, 91, 92, ..., 97, 98, 99]") != std::string::npos);
  REQUIRE(big.find("...,\n") != std::string::npos);
  REQUIRE(big.find("[30,") == std::string::npos);
  REQUIRE(empty({0}).str() == "tensor([], f32[0] cpu)");
  REQUIRE(ones({1}, DType::kF64).requires_grad_().str() == "tensor([1.0000], f64[1] cpu, requires_grad)");
  REQUIRE(empty({2}, TensorOptions().with_device(Device::meta())).str() == "tensor(..., meta, f32[2] meta)");
  REQUIRE(Tensor().str() == "tensor(undefined)");
  REQUIRE(from_vector<double>({std::nan(""), -std::numeric_limits<double>::infinity()}, {2}).str() ==
          "tensor([nan, -inf], f64[2] cpu)");
}

// ---- gradchecks through every view op -------------------------------------------------------------

TEST_CASE("gradcheck through every view op", "[cpu]") {
  using V = std::vector<Tensor>;
  Tensor x = noncontig(rand({4, 6}, DType::kF64, 3)).requires_grad_();
  Tensor x3 = noncontig(rand({2, 3, 4}, DType::kF64, 4)).requires_grad_();
  Tensor col = noncontig(rand({3, 1}, DType::kF64, 5)).requires_grad_();
  REQUIRE_GRADCHECK([](const V& in) { return in[0].view({-1}); }, {x3.contiguous().detach().requires_grad_()});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].view({2, 2, 6}); }, {x});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].reshape({3, 8}); }, {x});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].t().reshape({24}); }, {x});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].permute({2, 0, 1}); }, {x3});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].transpose(0, 2); }, {x3});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].t(); }, {x});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].narrow(1, 1, 3); }, {x});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].slice(1, -5, 6, 2); }, {x});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].slice(0, 1, 4, 2).slice(2, 0, 4, 3); }, {x3});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].select(1, -1); }, {x3});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].expand({2, 3, 5}); }, {col});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].expand({-1, 3}) * in[0].t().expand({3, 3}); }, {col});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].unsqueeze(1).squeeze(); }, {x});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].squeeze(1).unsqueeze(0); }, {col});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].flatten(1); }, {x3});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].contiguous(); }, {x});
  REQUIRE_GRADCHECK([](const V& in) { return in[0].clone(); }, {x});
  // Two overlapping slices of one input accumulate.
  REQUIRE_GRADCHECK([](const V& in) { return in[0].slice(1, 0, 4) * in[0].slice(1, 2, 6); }, {x});
}

TEST_CASE("views of tensors that require grad are differentiable, as_strided is not", "[cpu]") {
  Tensor x = rand({3, 4}).requires_grad_();
  Tensor v = x.view({12});
  REQUIRE(v.requires_grad());
  REQUIRE_FALSE(v.is_leaf());
  REQUIRE(v.grad_fn()->name() == "ViewBackward");
  REQUIRE(x.slice(1, 0, 4, 2).grad_fn()->name() == "SliceBackward");
  REQUIRE_THROWS_WITH(x.as_strided({2}, {1}, 0), Catch::Contains("as_strided"));
  REQUIRE(x.detach().as_strided({2}, {5}, 1).to_vector<double>() ==
          std::vector<double>{x.view({12}).to_vector<double>()[1], x.view({12}).to_vector<double>()[6]});
}

TEST_CASE("empty tensors are contiguous whatever their zero-size dims", "[cpu]") {
  REQUIRE(mt::empty({2, 0, 5}).is_contiguous());
  REQUIRE(mt::zeros({0}).is_contiguous());
  REQUIRE(mt::empty({2, 0, 5}).transpose(0, 2).is_contiguous());
}
