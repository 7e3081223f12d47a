// Framework overhead per op on tiny tensors: time through the public API (validation, dtype
// promotion, output allocation, dispatch) minus the time of the bare kernel on preallocated
// buffers, both measured here in the same run. Goal: under 500 ns per op.
#include <functional>

#include "kernels/registry.h"
#include "tensor/ops.h"
#include "tools/bench/bench_timing.h"

int main() {
  using namespace mt;
  const int64_t iters = 200000;
  Tensor a = ones({8}), b = ones({8}), m = ones({4, 4});
  Tensor out = empty({8}), out_s = empty({}), out_m = empty({4, 4});
  const KernelTable& k = kernels(DeviceType::kCPU);

  struct Row {
    const char* name;
    std::function<void()> api, bare;
  };
  BinaryParams bp{BinaryOp::kAdd, a.view_info(), b.view_info(), out.view_info()};
  BinaryParams mp{BinaryOp::kMul, a.view_info(), b.view_info(), out.view_info()};
  UnaryParams up{UnaryOp::kExp, a.view_info(), out.view_info(), 0, 0};
  ReduceParams rp{ReduceOp::kSum, a.view_info(), out_s.view_info(), 1, 1};
  MatmulParams gp{m.view_info(), m.view_info(), out_m.view_info(), 1, 0};
  Row rows[] = {
      {"add [8]", [&] { Tensor c = add(a, b); }, [&] { k.binary(bp); }},
      {"mul [8]", [&] { Tensor c = mul(a, b); }, [&] { k.binary(mp); }},
      {"exp [8]", [&] { Tensor c = exp(a); }, [&] { k.unary(up); }},
      {"sum [8]", [&] { Tensor c = sum(a); }, [&] { k.reduce(rp); }},
      {"matmul [4x4]", [&] { Tensor c = matmul(m, m); }, [&] { k.matmul(gp); }},
  };
  fmt::print("{:<14} {:>10} {:>10} {:>12}\n", "op", "api ns", "kernel ns", "overhead ns");
  double worst = 0;
  for (auto& r : rows) {
    double api = bench::best_ns_per_iter(r.api, iters), bare = bench::best_ns_per_iter(r.bare, iters);
    worst = std::max(worst, api - bare);
    fmt::print("{:<14} {:>10.1f} {:>10.1f} {:>12.1f}\n", r.name, api, bare, api - bare);
  }
  fmt::print("worst overhead: {:.1f} ns per op (goal < 500 ns): {}\n", worst, worst < 500 ? "met" : "NOT met");
  return 0;
}
