// Test helpers shared by every test: reference-free random inputs, non-contiguous copies,
// allclose with a readable report, and the finite-difference gradient check.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace mt::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  // Writes `text` to file(name) and returns that path.
  std::string write(const std::string& name, const std::string& text) const;
  // Names of the entries in the directory, sorted.
  std::vector<std::string> listing() const;
};

// Values uniform in [lo, hi) from std::mt19937_64 (independent of meshtrain's own RNG).
Tensor rand(const Shape& shape, DType dtype = DType::kF64, uint64_t seed = 1, double lo = -1, double hi = 1);
// Same values as t, but laid out non-contiguously (every other element of a wider buffer,
// then transposed back and forth when 2-D or more).
Tensor noncontig(const Tensor& t);

struct CloseReport {
  bool ok = true;
  std::string msg;
};
// |a - b| <= atol + rtol * |b| elementwise (shapes must match; dtypes may differ).
CloseReport allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
CloseReport allclose(const Tensor& a, const std::vector<double>& b, double rtol = 1e-5, double atol = 1e-8);

// Equal shapes, dtypes and bytes (on any device), or both undefined.
bool same_bits(const Tensor& a, const Tensor& b);

// The message of the mt::Error that fn() throws, or "(no error)"; any other exception escapes
// (and fails the test).
std::string error_of(const std::function<void()>& fn);

// Central finite differences in f64 against autograd, for every element of every input that
// requires grad. fn maps inputs to one tensor; the check projects it on fixed random weights.
CloseReport gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                      const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-6,
                      double rtol = 1e-4);

// The stock plans: $MT_PLANS_DIR (meson sets it to the source tree's plans/), else ./plans.
std::string plans_dir();

// Steps of a training comparison: `steps`, at most 5 under the sanitizers (MT_SANITIZER_RUN,
// tests/meson.build). They look for memory errors, which every step's code path shows in its first
// steps, at several times the time per step.
int training_steps(int steps = 20);

}  // namespace mt::testing

#define REQUIRE_CLOSE(...)                         \
  do {                                             \
    auto r_ = ::mt::testing::allclose(__VA_ARGS__); \
    INFO(r_.msg);                                  \
    REQUIRE(r_.ok);                                \
  } while (0)

#define REQUIRE_GRADCHECK(...)                      \
  do {                                              \
    auto r_ = ::mt::testing::gradcheck(__VA_ARGS__); \
    INFO(r_.msg);                                   \
    REQUIRE(r_.ok);                                 \
  } while (0)
