// Autograd engine: accumulation, retain_graph, no_grad, detach, hooks and their order.
#include "testing.h"

using namespace mt;
using mt::testing::gradcheck;
using mt::testing::noncontig;
using mt::testing::rand;

TEST_CASE("gradcheck of a composite expression over broadcast and non-contiguous inputs", "[cpu]") {
  Tensor a = noncontig(rand({3, 4})).requires_grad_();
  Tensor b = rand({4}, DType::kF64, 2).requires_grad_();
  REQUIRE_GRADCHECK([](const std::vector<Tensor>& in) { return exp(in[0]) * in[1] - tanh(in[0] / (in[1] * in[1] + 1.0)); }, {a, b});
}

TEST_CASE("gradients accumulate across backward calls", "[cpu]") {
  Tensor w = ones({2}, DType::kF64).requires_grad_();
  sum(w * 3.0).backward();
  sum(w * 3.0).backward();
  REQUIRE(w.grad().to_vector<double>() == std::vector<double>{6, 6});
}
