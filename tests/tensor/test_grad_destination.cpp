// Zero-copy gradient destinations (tensor/grad_destination.h) without FSDP: a weight that views a
// registered buffer gets its gradient written into that buffer's destination; a weight used twice
// gets the second gradient added into the destination in place when the destination's storage is
// an accumulator, out of place otherwise, and either way the leaf's .grad has the bits of the
// plain engine's sum.

#include "tensor/grad_destination.h"
#include "testing.h"

using namespace mt;
using mt::testing::same_bits;
using mt::testing::rand;

namespace {

// d/dw of sum(x1 w^T) + 2 sum(x2 w^T): two uses of w, each a linear backward that asks for w's
// destination.
void two_uses(const Tensor& w, const Tensor& x1, const Tensor& x2) {
  add(sum(linear(x1, w)), mul(sum(linear(x2, w)), 2.0)).backward();
}

}  // namespace

TEST_CASE("grad destination: a weight used twice sums in its destination", "[cpu]") {
  const Tensor full = rand({4, 3}, DType::kF32);  // the "gathered buffer" the weight views
  const Tensor x1 = rand({5, 3}, DType::kF32), x2 = rand({2, 3}, DType::kF32);
  // The plain engine: two fresh gradients, added out of place.
  Tensor ref = full.clone().requires_grad_();
  two_uses(ref, x1, x2);

  for (bool accumulate : {true, false}) {
    INFO("accumulator registered: " << accumulate);
    Tensor grad_full = zeros_like(full);
    int handed = 0;  // once per backward, as FSDP hands them out
    set_grad_destination(full.impl()->storage.get(), [&](const Tensor&) {
      return handed++ == 0 ? grad_full : Tensor();
    });
    set_grad_accumulator(grad_full.impl()->storage.get(), accumulate);
    Tensor w = full.detach().requires_grad_();  // a view of the registered storage
    two_uses(w, x1, x2);
    set_grad_destination(full.impl()->storage.get(), nullptr);
    set_grad_accumulator(grad_full.impl()->storage.get(), false);
    CHECK(handed == 2);  // asked by both uses, given to the first
    CHECK(same_bits(w.grad(), ref.grad()));
    // In place: the destination holds the sum. Otherwise it holds the first use's term only.
    CHECK(same_bits(grad_full, ref.grad()) == accumulate);
  }
}

TEST_CASE("grad destination: in-place sums only into accumulators, never while recording", "[cpu]") {
  NoGradGuard backward_mode;  // as in a backward pass without create_graph
  Tensor acc = zeros({2, 3});
  const Tensor g = rand({2, 3}, DType::kF32);
  CHECK_FALSE(accumulate_grad_in_place(acc, g));  // not registered
  set_grad_accumulator(acc.impl()->storage.get(), true);
  CHECK_FALSE(accumulate_grad_in_place(acc, rand({3, 2}, DType::kF32)));     // another shape
  CHECK_FALSE(accumulate_grad_in_place(acc, g.to(DType::kF64)));             // another dtype
  CHECK_FALSE(accumulate_grad_in_place(acc, acc.narrow(0, 0, 2)));           // overlaps it
  CHECK_FALSE(accumulate_grad_in_place(acc.t(), rand({3, 2}, DType::kF32)));  // not contiguous
  {
    GradModeGuard recording(true);  // create_graph: the sum must stay differentiable
    CHECK_FALSE(accumulate_grad_in_place(acc, g));
  }
  const Tensor before = acc.clone();
  CHECK(accumulate_grad_in_place(acc, g));
  CHECK(same_bits(acc, add(before, g)));
  set_grad_accumulator(acc.impl()->storage.get(), false);
  CHECK_FALSE(accumulate_grad_in_place(acc, g));
}
