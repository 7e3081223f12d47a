// meshtrain command-line tool. Until the model and training issue lands, the default job is
// `smoke`: it trains a small MLP on a synthetic regression task through the public tensor and
// autograd API and checks that the loss falls, which exercises the whole engine end to end.
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "config.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "tensor/ops.h"

namespace {

struct Args {
  std::string command = "smoke";
  int64_t steps = 300;
  uint64_t seed = 1234;
  double lr = 0.2;
};

int64_t parse_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    int64_t x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  MT_FAIL("{}: expected an integer, got '{}'", flag, v);
}

Args parse(int argc, char** argv) {
  Args a;
  std::vector<std::string> rest(argv + 1, argv + argc);
  size_t i = 0;
  if (i < rest.size() && rest[i].rfind("--", 0) != 0) a.command = rest[i++];
  for (; i < rest.size(); ++i) {
    const std::string& f = rest[i];
    MT_CHECK(i + 1 < rest.size() || f == "--help", "{}: missing value", f);
    if (f == "--steps") a.steps = parse_int(f, rest[++i]);
    else if (f == "--seed") a.seed = static_cast<uint64_t>(parse_int(f, rest[++i]));
    else if (f == "--lr") a.lr = std::stod(rest[++i]);
    else MT_FAIL("unknown flag '{}' (try: meshtrain smoke --steps N --seed S --lr LR)", f);
  }
  return a;
}

// Fits y = sin(3 x . u) with a 2-layer GELU MLP by plain SGD; returns a process exit code.
int smoke(const Args& args) {
  using namespace mt;
  manual_seed(args.seed);
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
  for (int64_t step = 0; step < args.steps; ++step) {
    Tensor pred = linear(gelu(linear(x, w1, b1)), w2, b2);
    Tensor loss = mean(square(sub(pred, y)));
    for (auto& p : params) p.set_grad(Tensor());
    loss.backward();
    {
      NoGradGuard no_grad;
      for (auto& p : params) p.add_(p.grad(), -args.lr);
    }
    last = loss.item();
    if (step == 0) first = last;
    if (step % 20 == 0 || step + 1 == args.steps) fmt::print("step {:4d}  loss {:.6f}\n", step, last);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool ok = last < 0.5 * first;
  fmt::print("smoke: loss {:.6f} -> {:.6f} in {} steps ({:.1f} steps/s): {}\n", first, last, args.steps,
             static_cast<double>(args.steps) / secs, ok ? "ok" : "LOSS DID NOT FALL");
  return ok ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args = parse(argc, argv);
    if (args.command == "smoke") return smoke(args);
    if (args.command == "version") {
      fmt::print("meshtrain {} (cuda {}, mpi {})\n", MT_VERSION, MT_HAVE_CUDA ? "yes" : "no", MT_HAVE_MPI ? "yes" : "no");
      return 0;
    }
    MT_FAIL("unknown command '{}' (available: smoke, version)", args.command);
  } catch (const std::exception& e) {
    MT_LOG_ERROR("{}", e.what());
    return 1;
  }
}
