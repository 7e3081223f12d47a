// Mixtral sparse MoE block and load-balancing loss, following transformers' modeling_mixtral.py:
// softmax of the router logits in f32, top-k, renormalize, cast to the hidden dtype; then the
// layer's expert dispatch (tensor/moe.h: by default experts in index order, each over its tokens
// in (top-k slot, token) order as torch.where yields them, their weighted outputs index_add-ed
// into a zero buffer).
#include "models/moe.h"

#include <algorithm>
#include <string>

#include "runtime/error.h"
#include "tensor/dist_replicate.h"
#include "tensor/ops.h"

namespace mt {

MixtralExpert::MixtralExpert(const ModelConfig& c, DType dtype) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const double std = c.initializer_range;
  // HF registers w1, w2, w3 in this order.
  w1_ = register_module("w1", std::make_shared<Linear>(H, I, Bias::kNo, std, dtype));
  w2_ = register_module("w2", std::make_shared<Linear>(I, H, Bias::kNo, std, dtype));
  w3_ = register_module("w3", std::make_shared<Linear>(H, I, Bias::kNo, std, dtype));
}

std::vector<Tensor> MixtralExpert::forward(const std::vector<Tensor>& inputs) {
  MT_CHECK(inputs.size() == 1, "MixtralExpert '{}': expected 1 input, got {}", path(), inputs.size());
  const Tensor& x = inputs[0];
  return {(*w2_)(silu_mul((*w1_)(x), (*w3_)(x)))};
}

MixtralSparseMoeBlock::MixtralSparseMoeBlock(const ModelConfig& c, DType dtype)
    : num_experts_(c.num_local_experts), top_k_(c.num_experts_per_tok) {
  gate_ = register_module("gate", std::make_shared<Linear>(c.hidden_size, c.num_local_experts, Bias::kNo,
                                                           c.initializer_range, dtype));
  experts_ = register_module("experts", std::make_shared<ModuleList>());
  for (int64_t e = 0; e < c.num_local_experts; ++e) experts_->push_back(std::make_shared<MixtralExpert>(c, dtype));
  set_capacity_factor(c.moe_capacity_factor);
}

std::vector<Tensor> MixtralSparseMoeBlock::forward(const std::vector<Tensor>& inputs) {
  MT_CHECK(inputs.size() == 1, "MixtralSparseMoeBlock '{}': expected 1 input, got {}", path(), inputs.size());
  const Tensor& x = inputs[0];
  MT_CHECK(x.dim() == 3, "MixtralSparseMoeBlock '{}': x must be [B, T, H], got {}", path(), x.desc());
  const int64_t H = x.size(2);
  Tensor xf;  // [N, H]
  try {
    xf = x.reshape(Shape{-1, H});
  } catch (const Error& e) {
    if (!x.is_distributed()) throw;
    // A sequence split (context or sequence parallelism) cannot be flattened into rows: said as
    // such rather than as the reshape's own message.
    MT_FAIL("MoE layer '{}': its input x {} is placed {}, which cannot be flattened to [tokens, hidden] ({}); an MoE "
            "layer takes its tokens whole or split by batch (S(0), with `dispatch` for the experts): MoE layers "
            "under context or sequence parallelism are not supported",
            path(), x.shape(), x.dist_spec()->placements_str(), e.what());
  }
  Tensor router_logits = (*gate_)(xf);  // [N, E]
  const DType sdt = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor probs = softmax(router_logits.to(sdt), 1);
  auto [weights, selected] = topk(probs, top_k_, -1);  // [N, k] each
  weights = div(weights, sum(weights, {-1}, KeepDim::kYes)).to(x.dtype());
  return {run_experts({xf, selected, weights, x}), router_logits};
}

std::vector<Module*> MixtralSparseMoeBlock::expert_modules() {
  std::vector<Module*> out;
  for (size_t e = 0; e < static_cast<size_t>(num_experts_); ++e) out.push_back(experts_->at(e).get());
  return out;
}

// Both router losses are whole-batch statistics: per-layer sums over the tokens, added over the
// layers, divided by the token count and made whole (dist_replicate: under expert parallelism the
// tokens are split over ranks and the sums are Partial) before anything non-linear is applied.
// No concatenation of the layers' logits, which a split token dim would not allow.

Tensor router_z_loss(const std::vector<Tensor>& router_logits) {
  MT_CHECK(!router_logits.empty(), "router_z_loss: no router logits given");
  Tensor total;
  int64_t tokens = 0;
  for (size_t i = 0; i < router_logits.size(); ++i) {
    const Tensor& logits = router_logits[i];
    MT_CHECK(logits.dim() == 2, "router_z_loss: router logits {} must be [tokens, experts], got {}", i,
             logits.desc());
    const DType dt = logits.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Tensor z = logits.to(dt);
    // logsumexp per token, stably: z_0 - log_softmax(z)_0 (any column gives it).
    Tensor lse = sub(z.narrow(1, 0, 1), log_softmax(z, 1).narrow(1, 0, 1));
    Tensor s = sum(square(lse));
    total = total.defined() ? add(total, s) : s;
    tokens += logits.size(0);
  }
  return dist_replicate(div(total, static_cast<double>(std::max<int64_t>(tokens, 1))));
}

Tensor load_balancing_loss(const std::vector<Tensor>& router_logits, int64_t num_experts, int64_t top_k) {
  MT_CHECK(!router_logits.empty(), "load_balancing_loss: no router logits given");
  for (size_t i = 0; i < router_logits.size(); ++i)
    MT_CHECK(router_logits[i].dim() == 2 && router_logits[i].size(1) == num_experts,
             "load_balancing_loss: router logits {} must be [tokens, num_experts = {}], got {}", i, num_experts,
             router_logits[i].desc());
  MT_CHECK(top_k > 0 && top_k <= num_experts, "load_balancing_loss: top_k {} must be in [1, num_experts = {}]",
           top_k, num_experts);
  // HF: softmax of the (concatenated) logits in their dtype, expert_mask.float(); products with the
  // probabilities promote to the wider type.
  Tensor tokens_per_expert, router_prob_per_expert;  // sums over the tokens: [k, E] and [E]
  int64_t tokens = 0;
  DType dt = DType::kF32;
  for (const Tensor& logits : router_logits) {
    Tensor probs = softmax(logits, -1);
    dt = probs.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Tensor selected = topk(probs, top_k, -1).second;                 // [N, k]
    Tensor mask = sum(one_hot(selected, num_experts).to(dt), {0});  // [k, E]
    Tensor p = sum(probs.to(dt), {0});                              // [E]
    tokens_per_expert = tokens_per_expert.defined() ? add(tokens_per_expert, mask) : mask;
    router_prob_per_expert = router_prob_per_expert.defined() ? add(router_prob_per_expert, p) : p;
    tokens += logits.size(0);
  }
  const double n = static_cast<double>(std::max<int64_t>(tokens, 1));
  tokens_per_expert = dist_replicate(div(tokens_per_expert, n));
  router_prob_per_expert = dist_replicate(div(router_prob_per_expert, n));
  Tensor loss = sum(mul(tokens_per_expert, router_prob_per_expert.unsqueeze(0)));
  return mul(loss, static_cast<double>(num_experts));
}

}  // namespace mt
