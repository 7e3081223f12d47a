// The fused residual gradient sum of rms_norm's backward (tensor/autograd.h,
// grad_accumulation_target), checked on any device: in loss = sum(c * (a + 3 rms_norm(a, w))) with
// a = 2x, the engine holds the skip connection's gradient of `a` when rms_norm's backward runs,
// and the kernel adds its input gradient into it. A backward that records a graph never fuses, so
// it gives the unfused bits and one add more; a hook that keeps h's gradient (the same tensor as
// the skip gradient) stops the fusion and must find that tensor unchanged.
#pragma once

#include "runtime/profiler.h"
#include "testing.h"

namespace mt::testing {

struct ResidualNormGrads {
  Tensor gx, gw, gh;
  int binary_ops = 0;  // forward and backward (the engine's sums run outside any node)
};

inline ResidualNormGrads residual_norm_grads(const Tensor& x0, const Tensor& w0, const Tensor& c, bool create_graph,
                                             bool keep_h_grad) {
  Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  Tensor a = mul(x, 2.0);
  Tensor h = add(a, mul(rms_norm(a, w), 3.0));
  ResidualNormGrads r;
  if (keep_h_grad)
    h.register_hook([&r](const Tensor& g) {
      r.gh = g;  // the engine's own tensor: the skip connection's gradient of `a` too
      return Tensor();
    });
  Profiler prof;
  sum(mul(c, h)).backward(Tensor(), false, create_graph);
  prof.stop();
  for (const ProfileEvent& e : prof.events()) r.binary_ops += e.kind == ProfileEvent::Kind::kOp && e.name == "binary";
  r.gx = x.grad().detach();
  r.gw = w.grad().detach();
  return r;
}

inline void check_residual_norm_fusion(const Tensor& x0, const Tensor& w0, const Tensor& c) {
  const ResidualNormGrads fused = residual_norm_grads(x0, w0, c, false, false);
  const ResidualNormGrads unfused = residual_norm_grads(x0, w0, c, true, false);
  const ResidualNormGrads held = residual_norm_grads(x0, w0, c, false, true);
  CHECK(same_bits(fused.gx, unfused.gx));
  CHECK(same_bits(fused.gw, unfused.gw));
  CHECK(fused.binary_ops + 1 == unfused.binary_ops);
  CHECK(same_bits(held.gx, unfused.gx));
  CHECK(held.binary_ops == unfused.binary_ops);
  CHECK(same_bits(held.gh, c));  // the kept gradient is c (d loss / dh), untouched by the sum
}

}  // namespace mt::testing
