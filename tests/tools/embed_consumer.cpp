// A C++ trainer embedding meshtrain through pkg-config: built against an installed copy by
// test_pkgconfig.sh, so the installed headers, library and meshtrain.pc are checked together.
#include "tensor/ops.h"
#include "models/llama.h"
int main() {
  using namespace mt;
  Tensor w = normal({4, 3}).requires_grad_();
  Tensor loss = mean(square(matmul(ones({2, 4}), w)));
  loss.backward();
  auto m = build_causal_lm(builtin_config("llama-tiny"));
  fmt::print("grad {} params {}\n", w.grad().shape(), m->named_parameters().size());
}
