// Helpers for CUDA tests: skip cleanly without a GPU, and compare an op on CPU and CUDA (values
// and gradients) with a tolerance per dtype. Used by test_cuda_core.cpp and test_cuda_nn.cpp.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "runtime/cuda/device.h"
#include "testing.h"

namespace mt::testing {

inline constexpr int kMesonSkip = 77;

// Exits the test binary with 77 (meson: SKIP) and a clear message when no CUDA device is visible.
inline void require_cuda() {
  if (cuda::device_count() > 0) return;
  std::fprintf(stderr, "SKIP: no CUDA device (%s); the CUDA tests need a GPU\n",
               cuda::unavailable_reason().c_str());
  std::exit(kMesonSkip);
}

inline Device gpu() { return Device::cuda(0); }

// |cuda - cpu| <= atol + rtol * |cpu|, per dtype of the compared tensor.
struct Tol {
  double rtol, atol;
};
struct DTypeTols {
  Tol f64{1e-10, 1e-12};
  Tol f32{1e-5, 1e-6};
  Tol bf16{1.6e-2, 1e-2};  // one bf16 ulp is 2^-8 relative: rounding a differently-summed value
  Tol f16{2e-3, 1e-3};
  Tol exact{0, 0};  // integers and bools
  Tol of(DType t) const {
    switch (t) {
      case DType::kF64: return f64;
      case DType::kF32: return f32;
      case DType::kBF16: return bf16;
      case DType::kF16: return f16;
      default: return exact;
    }
  }
};

// `t` on CUDA with the same values and a layout like t's: contiguous inputs stay contiguous,
// non-contiguous ones are laid out as by noncontig(). requires_grad is kept (a fresh leaf).
inline Tensor to_cuda_like(const Tensor& t) {
  Tensor c = t.detach().to(gpu());
  if (!t.is_contiguous() && t.dim() > 0) c = noncontig(c);
  if (t.requires_grad()) c.requires_grad_();
  return c;
}

// A fresh CPU leaf with t's values and layout.
inline Tensor cpu_leaf(const Tensor& t) {
  Tensor c = t.detach().clone();
  if (!t.is_contiguous() && t.dim() > 0) c = noncontig(c);
  if (t.requires_grad()) c.requires_grad_();
  return c;
}

// Runs fn on CPU copies and CUDA copies of `inputs`; compares the outputs and, for inputs that
// require grad, the gradients of sum(out * w) for fixed random weights w.
inline CloseReport compare_cpu_cuda(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                    const std::vector<Tensor>& inputs, const DTypeTols& tols = {}) {
  CloseReport r;
  std::vector<Tensor> xc, xg;
  bool any_grad = false;
  for (const Tensor& t : inputs) {
    xc.push_back(cpu_leaf(t));
    xg.push_back(to_cuda_like(t));
    any_grad = any_grad || t.requires_grad();
  }
  Tensor oc = fn(xc), og = fn(xg);
  if (og.device() != gpu()) {
    r.ok = false;
    r.msg = fmt::format("the CUDA run returned a tensor on {}", og.device());
    return r;
  }
  if (oc.dtype() != og.dtype()) {
    r.ok = false;
    r.msg = fmt::format("dtypes differ: cpu {} vs cuda {}", oc.desc(), og.desc());
    return r;
  }
  const Tol tol = tols.of(oc.dtype());
  CloseReport v = allclose(og.to(Device::cpu()), oc, tol.rtol, tol.atol);
  if (!v.ok) {
    r.ok = false;
    r.msg += "values: " + v.msg + "\n";
  }
  if (!any_grad || !is_floating(oc.dtype())) return r;
  Tensor w = rand(oc.shape(), oc.dtype(), 4242);
  sum(mul(oc, w)).backward();
  sum(mul(og, w.to(gpu()))).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    Tensor gc = xc[i].grad(), gg = xg[i].grad();
    if (gc.defined() != gg.defined()) {
      r.ok = false;
      r.msg += fmt::format("input {}: gradient defined on {} only\n", i, gc.defined() ? "cpu" : "cuda");
      continue;
    }
    if (!gc.defined()) continue;
    const Tol gt = tols.of(gc.dtype());
    CloseReport g = allclose(gg.to(Device::cpu()), gc, gt.rtol, gt.atol);
    if (!g.ok) {
      r.ok = false;
      r.msg += fmt::format("grad of input {} ({}): {}\n", i, inputs[i].desc(), g.msg);
    }
  }
  return r;
}

// same_bits (testing.h) compares tensors on any devices, on the host.

}  // namespace mt::testing

#define REQUIRE_CPU_CUDA(...)                                 \
  do {                                                        \
    auto r_ = ::mt::testing::compare_cpu_cuda(__VA_ARGS__);   \
    INFO(r_.msg);                                             \
    REQUIRE(r_.ok);                                           \
  } while (0)
