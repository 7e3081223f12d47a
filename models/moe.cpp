// Mixtral sparse MoE block, following transformers' modeling_mixtral.py:
// softmax of the router logits in f32, top-k, renormalize, cast to the hidden dtype; then the
// layer's expert dispatch (tensor/moe.h: by default experts in index order, each over its tokens
// in (top-k slot, token) order as torch.where yields them, their weighted outputs index_add-ed
// into a zero buffer).
#include "models/moe.h"

#include "runtime/error.h"
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

}  // namespace mt
