// `meshtrain smoke`: trains a small MLP on a synthetic regression task through the public tensor
// and autograd API and checks that the loss falls: a quick end-to-end check of the engine.
#include <chrono>
#include <cmath>
#include <limits>

#include "runtime/error.h"
#include "tensor/ops.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"

namespace mt::cli {

int run_smoke(int argc, char** argv) {
  Args args("smoke", {{"steps", "SGD steps", "300", false}, {"seed", "random seed", "1234", false},
                      {"lr", "learning rate", "0.2", false}},
            argc, argv, 2);
  const int64_t steps = args.integer("steps", 1, int64_t{1} << 40);
  const double lr = args.real("lr");
  MT_CHECK(lr > 0, "meshtrain smoke: --lr {} must be positive", lr);
  manual_seed(static_cast<uint64_t>(args.integer("seed", 0, std::numeric_limits<int64_t>::max())));
  const int64_t n = 256, din = 8, hidden = 64;
  Tensor x = normal({n, din});
  Tensor u = normal({din, 1}, 0, 1.0 / std::sqrt(static_cast<double>(din)));
  Tensor y = sin(mul(matmul(x, u), 3.0));
  Tensor w1 = normal({hidden, din}, 0, 1.0 / std::sqrt(static_cast<double>(din))).requires_grad_();
  Tensor b1 = zeros({hidden}).requires_grad_();
  Tensor w2 = normal({1, hidden}, 0, 1.0 / std::sqrt(static_cast<double>(hidden))).requires_grad_();
  Tensor b2 = zeros({1}).requires_grad_();
  std::vector<Tensor> params = {w1, b1, w2, b2};
  double first = 0, last = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    Tensor pred = linear(gelu(linear(x, w1, b1)), w2, b2);
    Tensor loss = mean(square(sub(pred, y)));
    for (auto& p : params) p.set_grad(Tensor());
    loss.backward();
    {
      NoGradGuard no_grad;
      for (auto& p : params) p.add_(p.grad(), -lr);
    }
    last = loss.item();
    if (step == 0) first = last;
    if (step % 20 == 0 || step + 1 == steps) fmt::print("step {:4d}  loss {:.6f}\n", step, last);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool ok = last < 0.5 * first;
  fmt::print("smoke: loss {:.6f} -> {:.6f} in {} steps ({:.1f} steps/s): {}\n", first, last, steps,
             static_cast<double>(steps) / secs, ok ? "ok" : "not halved");
  // Exit 2 with an error line, as every failed check (a loss that fell by less than half is one:
  // the engine fits this MLP far below that in the default 300 steps).
  if (!ok)
    throw ExitError(fmt::format("meshtrain smoke: the loss fell from {:.6f} to {:.6f} in {} steps, not below half "
                                "of the first step's (raise --steps, or the engine is broken)",
                                first, last, steps),
                    2, false);
  return 0;
}

}  // namespace mt::cli
