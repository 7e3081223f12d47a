// Tensor core: factories, views, copies, casts, printing, errors.
#include "testing.h"

using namespace mt;
using mt::testing::allclose;

TEST_CASE("factories and metadata", "[cpu]") {
  Tensor t = zeros({2, 3});
  REQUIRE(t.dim() == 2);
  REQUIRE(t.numel() == 6);
  REQUIRE(t.dtype() == DType::kF32);
  REQUIRE(t.is_contiguous());
  REQUIRE(t.strides() == Shape{3, 1});
  Tensor a = arange(6);
  REQUIRE(a.dtype() == DType::kI64);
  REQUIRE(a.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  Tensor f = full({2}, 2.5, DType::kF64);
  REQUIRE(f.to_vector<double>() == std::vector<double>{2.5, 2.5});
}
