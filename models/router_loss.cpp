// The MoE router losses (router_loss.h).
#include "models/router_loss.h"

#include <algorithm>

#include "runtime/error.h"
#include "tensor/dist_replicate.h"
#include "tensor/ops.h"

namespace mt {

// Both router losses are whole-batch statistics: per-layer sums over the tokens, added over the
// layers, divided by the token count and made whole (dist_replicate: under expert parallelism the
// tokens are split over ranks and the sums are Partial) before anything non-linear is applied.
// No concatenation of the layers' logits, which a split token dim would not allow.

RouterSums add_router_sums(RouterSums sums, const std::vector<Tensor>& router_logits, int64_t num_experts,
                           int64_t top_k, bool balance, bool z) {
  for (size_t i = 0; i < router_logits.size(); ++i) {
    const Tensor& logits = router_logits[i];
    MT_CHECK(logits.dim() == 2 && logits.size(1) == num_experts,
             "router losses: router logits {} must be [tokens, num_experts = {}], got {}", i, num_experts,
             logits.desc());
  }
  MT_CHECK(!balance || (top_k > 0 && top_k <= num_experts),
           "load_balancing_loss: top_k {} must be in [1, num_experts = {}]", top_k, num_experts);
  auto accumulate = [](Tensor& total, const Tensor& t) { total = total.defined() ? add(total, t) : t; };
  for (const Tensor& logits : router_logits) {
    if (balance) {
      // HF: softmax of the (concatenated) logits in their dtype, expert_mask.float(); products
      // with the probabilities promote to the wider type.
      Tensor probs = softmax(logits, -1);
      const DType dt = probs.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
      Tensor selected = topk(probs, top_k, -1).second;                                   // [N, k]
      accumulate(sums.tokens_per_expert, sum(one_hot(selected, num_experts).to(dt), {0}));  // [k, E]
      accumulate(sums.prob_per_expert, sum(probs.to(dt), {0}));                            // [E]
    }
    if (z) {
      const DType dt = logits.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
      Tensor zl = logits.to(dt);
      // logsumexp per token, stably: z_0 - log_softmax(z)_0 (any column gives it).
      Tensor lse = sub(zl.narrow(1, 0, 1), log_softmax(zl, 1).narrow(1, 0, 1));
      accumulate(sums.z, sum(square(lse)));
    }
    sums.tokens += logits.size(0);
  }
  return sums;
}

std::vector<Tensor> router_sums_tensors(const RouterSums& sums, Device device) {
  std::vector<Tensor> out;
  for (const Tensor* t : {&sums.tokens_per_expert, &sums.prob_per_expert, &sums.z})
    if (t->defined()) out.push_back(*t);
  if (!out.empty()) out.push_back(from_vector<int64_t>({sums.tokens}, Shape{1}).to(device));
  return out;
}

RouterSums router_sums_of(const std::vector<Tensor>& tensors) {
  RouterSums s;
  if (tensors.empty()) return s;
  // Told apart by rank: [k, E], [E], the scalar z; the count last.
  for (size_t i = 0; i + 1 < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    Tensor& slot = t.dim() == 2 ? s.tokens_per_expert : t.dim() == 1 ? s.prob_per_expert : s.z;
    MT_CHECK(t.dim() <= 2 && !slot.defined(), "router losses: unexpected router sum {} (tensor {} of {})", t.desc(), i,
             tensors.size());
    slot = t;
  }
  const Tensor& count = tensors.back();
  MT_CHECK(count.dtype() == DType::kI64 && count.numel() == 1, "router losses: expected the row count last, got {}",
           count.desc());
  s.tokens = count.to_vector<int64_t>()[0];
  return s;
}

Tensor router_z_loss_of(const RouterSums& sums) {
  MT_CHECK(sums.z.defined(), "router_z_loss: no router logits given");
  return dist_replicate(div(sums.z, static_cast<double>(std::max<int64_t>(sums.tokens, 1))));
}

Tensor load_balancing_loss_of(const RouterSums& sums, int64_t num_experts) {
  MT_CHECK(sums.tokens_per_expert.defined() && sums.prob_per_expert.defined(),
           "load_balancing_loss: no router logits given");
  const double n = static_cast<double>(std::max<int64_t>(sums.tokens, 1));
  Tensor tokens_per_expert = dist_replicate(div(sums.tokens_per_expert, n));
  Tensor router_prob_per_expert = dist_replicate(div(sums.prob_per_expert, n));
  Tensor loss = sum(mul(tokens_per_expert, router_prob_per_expert.unsqueeze(0)));
  return mul(loss, static_cast<double>(num_experts));
}

Tensor router_z_loss(const std::vector<Tensor>& router_logits) {
  MT_CHECK(!router_logits.empty(), "router_z_loss: no router logits given");
  for (size_t i = 0; i < router_logits.size(); ++i)
    MT_CHECK(router_logits[i].dim() == 2, "router_z_loss: router logits {} must be [tokens, experts], got {}", i,
             router_logits[i].desc());
  const int64_t experts = router_logits.front().size(1);
  return router_z_loss_of(add_router_sums({}, router_logits, experts, 0, false, true));
}

Tensor load_balancing_loss(const std::vector<Tensor>& router_logits, int64_t num_experts, int64_t top_k) {
  MT_CHECK(!router_logits.empty(), "load_balancing_loss: no router logits given");
  return load_balancing_loss_of(add_router_sums({}, router_logits, num_experts, top_k, true, false), num_experts);
}

}  // namespace mt
