// Matmul GFLOP/s through mt::matmul (validation, output allocation, dispatch, Eigen kernel)
// against Eigen called directly on the same data, in one run. Goal: the API within 5% at 1024^3.
// This tool is the one place outside kernels/cpu that includes Eigen: it is the baseline.
#include <Eigen/Dense>
#include <chrono>
#include <functional>

#include "tensor/ops.h"

namespace {
double seconds_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  using namespace mt;
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  manual_seed(0);
  Tensor a = uniform({n, n}), b = uniform({n, n});
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const Mat> ea(a.data<float>(), n, n), eb(b.data<float>(), n, n);
  Mat ec(n, n);
  ec.noalias() = ea * eb;  // warm up both paths
  Tensor c = matmul(a, b);
  // Interleave the two so that both see the same machine state; keep the best of each.
  double t_eigen = 1e30, t_api = 1e30;
  for (int r = 0; r < reps; ++r) {
    t_eigen = std::min(t_eigen, seconds_of([&] { ec.noalias() = ea * eb; }));
    t_api = std::min(t_api, seconds_of([&] { c = matmul(a, b); }));
  }
  double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  double g_eigen = flops / t_eigen * 1e-9, g_api = flops / t_api * 1e-9;
  fmt::print("matmul f32 {}^3: eigen {:.1f} GFLOP/s, mt::matmul {:.1f} GFLOP/s, ratio {:.3f} (goal >= 0.95): {}\n",
             n, g_eigen, g_api, g_api / g_eigen, g_api / g_eigen >= 0.95 ? "met" : "NOT met");
  return 0;
}
