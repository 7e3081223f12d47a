// Mixtral's sparse mixture-of-experts MLP (HF MixtralSparseMoeBlock); its router losses are in
// models/router_loss.h. The block computes the
// routing; its experts run through the layer's dispatcher (tensor/moe.h): by default each expert
// here on the tokens routed to it (index_select, expert MLP, times routing weight, index_add back),
// under a plan with `dispatch ... all_to_all` on the ranks that own them. Gradients reach the
// router through the routing weights.
#pragma once

#include <memory>
#include <vector>

#include "models/config.h"
#include "models/llama.h"
#include "models/router_loss.h"
#include "tensor/module.h"
#include "tensor/moe.h"

namespace mt {

// HF MixtralBlockSparseTop2MLP: w2(silu(w1(x)) * w3(x)); w1, w3 [I, H], w2 [H, I].
class MixtralExpert : public Module {
 public:
  MixtralExpert(const ModelConfig& config, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

 private:
  std::shared_ptr<Linear> w1_, w2_, w3_;
};

// gate (Linear H -> E, no bias), experts.0 .. experts.{E-1}.
// forward({x [B, T, H]}) -> {out [B, T, H], router_logits [B*T, E] (x's dtype)}.
class MixtralSparseMoeBlock : public MoeModule {
 public:
  MixtralSparseMoeBlock(const ModelConfig& config, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  std::vector<Module*> expert_modules() override;

 private:
  std::shared_ptr<Linear> gate_;
  std::shared_ptr<ModuleList> experts_;
  int64_t num_experts_, top_k_;
};

}  // namespace mt
