// The router losses of a mixture-of-experts model: the load-balancing loss (HF
// load_balancing_loss_func without attention mask) and ST-MoE's router z-loss, as sums over the
// layers' router logits that a pipeline stage can carry to the next (RouterSums).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace mt {

// The sums the router losses are made of, over the tokens of every layer so far. A pipeline stage
// adds its layers' to those the stage before it sent, in layer order, and the chunk that makes the
// loss turns the totals into the losses: the single-device values, bit for bit (docs/moe.md).
struct RouterSums {
  Tensor tokens_per_expert;  // [k, E]: how often expert e was slot k's choice (load balancing)
  Tensor prob_per_expert;    // [E]: the router's probabilities (load balancing)
  Tensor z;                  // scalar: logsumexp(router logits)^2 (z-loss)
  int64_t tokens = 0;        // router rows summed (tokens x layers)
};

// `sums` plus the statistics of `router_logits` ([tokens, E] per layer, in layer order) that the
// losses asked for need: `balance` the load-balancing loss's (top_k experts per token), `z` the
// z-loss's.
RouterSums add_router_sums(RouterSums sums, const std::vector<Tensor>& router_logits, int64_t num_experts,
                           int64_t top_k, bool balance, bool z);

// RouterSums as tensors that a pipeline chunk sends on beside its activation (the defined sums,
// then the row count as an i64 [1] tensor on `device`), and back.
std::vector<Tensor> router_sums_tensors(const RouterSums& sums, Device device);
RouterSums router_sums_of(const std::vector<Tensor>& tensors);

// The losses of the totals over every layer (what add_router_sums summed with `balance` / `z`).
Tensor load_balancing_loss_of(const RouterSums& sums, int64_t num_experts);
Tensor router_z_loss_of(const RouterSums& sums);

// num_experts * sum_{k,e} tokens_per_expert[k, e] * router_prob_per_expert[e] over the
// concatenated router logits of all layers (softmax in the logits' dtype, as HF). f32 (f64 when
// the logits are f64).
Tensor load_balancing_loss(const std::vector<Tensor>& router_logits, int64_t num_experts, int64_t top_k);

// The router z-loss of ST-MoE (Zoph et al. 2022, eq. 5): the mean over every token of every layer
// of logsumexp(router logits)^2, in f32 (f64 for f64 logits). Keeps the router's logits small.
Tensor router_z_loss(const std::vector<Tensor>& router_logits);

}  // namespace mt
