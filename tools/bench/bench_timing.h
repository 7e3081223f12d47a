// Timing helper of the single-process benchmarks: the best of 5 repetitions of `iters` calls, in
// nanoseconds per call (the best, not the mean: a benchmark reports what the code can do, and
// the slower repetitions measure the machine's other load).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>

namespace mt::bench {

inline double best_ns_per_iter(const std::function<void()>& body, int64_t iters) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) body();
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, ns / static_cast<double>(iters));
  }
  return best;
}

}  // namespace mt::bench
