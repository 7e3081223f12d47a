// Matmul GFLOP/s through mt::matmul (validation, output allocation, dispatch, Eigen kernel)
// against Eigen called directly on the same data, in one run. Goal: the API within 5% of Eigen.
//   bench_matmul [N [REPS]]      one N^3 product (default 1024)
//   bench_matmul models [REPS]   every linear layer of llama-tiny, llama-30m and llama-100m at 256
//                                and 1024 tokens, in the three products a training step makes of
//                                it: y = x W^T, dx = dy W, dW = dy^T x (transposed operands are
//                                views, as the autograd formulas pass them)
// This tool is the one place outside kernels/cpu that includes Eigen: it is the baseline.
#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace {

using namespace mt;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<const RowMat>;

double seconds_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Result {
  double eigen_gflops, api_gflops;
};

// Best of reps for each path, the two interleaved so that both see the same machine state; and
// more reps, up to 2000, until each path has run 50 ms: a product of 20 us timed 10 times on a
// shared machine gave a best call 2-3x slower than its best of 50 (llama-tiny's layers at two
// threads, either path).
Result race(double flops, int reps, const std::function<void()>& eigen, const std::function<void()>& api) {
  eigen();  // warm up both paths
  api();
  double t_eigen = 1e30, t_api = 1e30, spent_eigen = 0, spent_api = 0;
  for (int r = 0; r < reps || (r < 2000 && std::min(spent_eigen, spent_api) < 0.05); ++r) {
    const double te = seconds_of(eigen), ta = seconds_of(api);
    t_eigen = std::min(t_eigen, te);
    t_api = std::min(t_api, ta);
    spent_eigen += te;
    spent_api += ta;
  }
  return {flops / t_eigen * 1e-9, flops / t_api * 1e-9};
}

const char* verdict(double ratio) { return ratio >= 0.95 ? "met" : "NOT met"; }

int cube(int64_t n, int reps) {
  Tensor a = uniform({n, n}), b = uniform({n, n});
  Map ea(a.data<float>(), n, n), eb(b.data<float>(), n, n);
  RowMat ec(n, n);
  Tensor c;
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  const Result r = race(flops, reps, [&] { ec.noalias() = ea * eb; }, [&] { c = matmul(a, b); });
  const double ratio = r.api_gflops / r.eigen_gflops;
  fmt::print("matmul f32 {}^3: eigen {:.1f} GFLOP/s, mt::matmul {:.1f} GFLOP/s, ratio {:.3f} (goal >= 0.95): {}\n",
             n, r.eigen_gflops, r.api_gflops, ratio, verdict(ratio));
  return 0;
}

struct Linear {
  const char* model;
  const char* name;
  int64_t in, out;
};

int models(int reps) {
  // [in, out] of each distinct linear layer (models/config.cpp, plans/models/*.json).
  const std::vector<Linear> layers = {
      {"llama-tiny", "q/o proj", 128, 128},      {"llama-tiny", "k/v proj", 128, 64},
      {"llama-tiny", "gate/up", 128, 344},        {"llama-tiny", "down", 344, 128},
      {"llama-tiny", "lm_head", 128, 256},        {"llama-30m", "q/k/v/o proj", 512, 512},
      {"llama-30m", "gate/up", 512, 1376},        {"llama-30m", "down", 1376, 512},
      {"llama-30m", "lm_head", 512, 4096},        {"llama-100m", "q/k/v/o proj", 768, 768},
      {"llama-100m", "gate/up", 768, 2048},       {"llama-100m", "down", 2048, 768},
      {"llama-100m", "lm_head", 768, 8192},
  };
  int met = 0, total = 0;
  double worst = 1e30;
  std::string worst_name;
  for (const int64_t m : {int64_t{256}, int64_t{1024}})
    for (const Linear& l : layers) {
      Tensor x = uniform({m, l.in}), w = uniform({l.out, l.in}), dy = uniform({m, l.out});
      Map ex(x.data<float>(), m, l.in), ew(w.data<float>(), l.out, l.in), edy(dy.data<float>(), m, l.out);
      RowMat ey(m, l.out), edx(m, l.in), edw(l.out, l.in);
      Tensor y, dx, dw;
      const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(l.in) * static_cast<double>(l.out);
      const Result r[3] = {
          race(flops, reps, [&] { ey.noalias() = ex * ew.transpose(); }, [&] { y = matmul(x, w.transpose(0, 1)); }),
          race(flops, reps, [&] { edx.noalias() = edy * ew; }, [&] { dx = matmul(dy, w); }),
          race(flops, reps, [&] { edw.noalias() = edy.transpose() * ex; }, [&] { dw = matmul(dy.transpose(0, 1), x); }),
      };
      const char* kinds[3] = {"y = x W^T", "dx = dy W", "dW = dy^T x"};
      for (int k = 0; k < 3; ++k) {
        const double ratio = r[k].api_gflops / r[k].eigen_gflops;
        const std::string what = fmt::format("{} {} [{} tokens, {} -> {}] {}", l.model, l.name, m, l.in, l.out, kinds[k]);
        fmt::print("{:<64} eigen {:6.1f} GFLOP/s, mt::matmul {:6.1f}, ratio {:.3f}: {}\n", what, r[k].eigen_gflops,
                   r[k].api_gflops, ratio, verdict(ratio));
        ++total;
        met += ratio >= 0.95;
        if (ratio < worst) {
          worst = ratio;
          worst_name = what;
        }
      }
    }
  fmt::print("model shapes: {} of {} at >= 0.95 of Eigen; lowest {:.3f} ({})\n", met, total, worst, worst_name);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  manual_seed(0);
  const std::string first = argc > 1 ? argv[1] : "";
  if (first == "models") return models(argc > 2 ? std::max(1, std::atoi(argv[2])) : 10);
  return cube(argc > 1 ? std::atoll(argv[1]) : 1024, argc > 2 ? std::max(1, std::atoi(argv[2])) : 10);
}
