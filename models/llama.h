// LLaMA (and the shared skeleton of Mixtral) as meshtrain Modules whose parameter paths are the
// Hugging Face names ("model.layers.0.self_attn.q_proj.weight", ...), computing what
// transformers' modeling_llama.py computes: RMSNorm in f32, HF rotate_half RoPE with tables built
// in f32 (default, linear and llama3 rope_scaling), causal GQA attention, SwiGLU MLP, f32 logits.
// Mixtral differs only in the MLP (models/moe.h). docs/models.md has the details and the
// parameter creation order (which fixes the Philox offsets of the initial weights).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "models/config.h"
#include "models/kv_cache.h"
#include "models/router_loss.h"
#include "tensor/module.h"
#include "tensor/tensor.h"

namespace mt {

enum class Bias { kNo, kYes };

// y = x @ weight^T + bias; weight [out, in] ~ normal(0, init_std), bias zeros.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Bias bias, double init_std, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;  // {x [..., in]} -> {[..., out]}
  const Tensor& weight() const { return *weight_; }
  Tensor bias() const { return bias_ ? *bias_ : Tensor(); }

 private:
  Tensor* weight_ = nullptr;
  Tensor* bias_ = nullptr;
};

// {ids [...]} -> {weight[ids] [..., H]}; weight [V, H] ~ normal(0, init_std).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, double init_std, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  const Tensor& weight() const { return *weight_; }

 private:
  Tensor* weight_ = nullptr;
};

// HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in f32, times weight (ones at init).
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

 private:
  Tensor* weight_ = nullptr;
  double eps_;
};

// ---- rotary tables ----------------------------------------------------------------------------

// HF's inv_freq [D/2] for the config, computed in float32 exactly as transformers does
// (1 / theta^(2i/D), then rope_scaling: linear divides by factor, llama3 rescales bands).
std::vector<float> rope_inv_freq(const ModelConfig& config);
// cos/sin [T, D/2] of positions 0..T-1: float32 (t * inv_freq), cos/sin in float32, then
// converted to `dtype` (HF casts the tables to the activations' dtype).
std::pair<Tensor, Tensor> rope_cos_sin(const ModelConfig& config, int64_t T, DType dtype,
                                       Device device = Device::cpu());

// ---- blocks -----------------------------------------------------------------------------------

// q/k/v/o_proj. forward({x [B, T, H], cos [T, D/2], sin [T, D/2]}) -> {[B, T, H]}. The head
// counts are read from the projections' output widths, so a plan may shard heads.
class LlamaAttention : public Module {
 public:
  LlamaAttention(const ModelConfig& config, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  // Incremental decoding (models/kv_cache.h): with a cache, forward appends its keys and values as
  // layer `layer` and attends over every position the cache holds (the rotary tables are then
  // those of the new positions). nullptr: the plain forward.
  void set_kv_cache(KvCache* cache, int64_t layer) {
    cache_ = cache;
    cache_layer_ = layer;
  }

 private:
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
  int64_t head_dim_;
  double attention_dropout_;
  KvCache* cache_ = nullptr;
  int64_t cache_layer_ = 0;
};

// down_proj(silu(gate_proj(x)) * up_proj(x)).
class LlamaMLP : public Module {
 public:
  LlamaMLP(const ModelConfig& config, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

 private:
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
};

// self_attn, mlp (llama) or block_sparse_moe (mixtral), input_layernorm, post_attention_layernorm.
// forward({x, cos, sin}) -> {out} (llama) or {out, router_logits [B*T, E]} (mixtral).
class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const ModelConfig& config, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  const std::shared_ptr<LlamaAttention>& self_attn() const { return self_attn_; }

 private:
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<Module> mlp_;  // LlamaMLP or MixtralSparseMoeBlock
  std::shared_ptr<RMSNorm> input_layernorm_, post_attention_layernorm_;
  bool moe_;
  double residual_dropout_;
};

// embed_tokens, layers, norm. forward({input_ids [B, T]}) -> {hidden [B, T, H] after the final
// norm, then (mixtral) the router logits [B*T, E] of each layer}.
class LlamaModel : public Module {
 public:
  LlamaModel(const ModelConfig& config, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  const std::shared_ptr<Embedding>& embed_tokens() const { return embed_tokens_; }
  // Pipeline stages (CausalLM::set_pipeline_span): forward runs the embedding only when `embed`
  // (else input 0 is the hidden state [B, T, H]), layers [layer_first, layer_last), the final
  // norm only when `norm`.
  void set_span(bool embed, int64_t layer_first, int64_t layer_last, bool norm);
  // Incremental decoding: every layer's attention appends to `cache` (nullptr: off), and forward
  // takes the rotary tables of positions [cache length, cache length + T), then advances it.
  void set_kv_cache(KvCache* cache);

 private:
  ModelConfig config_;
  bool span_embed_ = true, span_norm_ = true;
  int64_t span_first_ = 0, span_last_ = -1;  // -1: every layer
  std::shared_ptr<Embedding> embed_tokens_;
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<RMSNorm> norm_;
  // Last rotary tables built (T rows, or the KV cache's capacity), reused while their row count,
  // dtype and device stay the same.
  Tensor cos_, sin_;
  KvCache* cache_ = nullptr;
};

// LlamaForCausalLM / MixtralForCausalLM: model, lm_head (absent when tie_word_embeddings: the
// logits then use model.embed_tokens.weight, and HF files omit lm_head.weight).
// forward({input_ids [B, T] i64}) -> {logits [B, T, V] f32 (f64 for f64 weights), (mixtral) router
// logits [B*T, E] of each layer}.
class CausalLM : public Module {
 public:
  CausalLM(const ModelConfig& config, DType dtype);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  // Mean cross-entropy of logits(input_ids) against targets [B, T] (ignore_index -100), plus
  // router_aux_loss_coef * load_balancing_loss for mixtral when config.output_router_logits, plus
  // router_z_loss_coef * router_z_loss when that is not 0. 16-bit logits go to cross_entropy as
  // lm_head computed them: the kernels widen each logit to f32 exactly and accumulate in f32, as
  // on logits.float(), without the f32 copy of the logits and of their gradient (4.2 GB each for
  // 8192 tokens of a 128256 vocabulary). `router_losses` false: the cross-entropy alone (a
  // validation loss).
  Tensor loss(const Tensor& input_ids, const Tensor& targets, bool router_losses = true);
  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }

  // Pipeline parallelism (plan/pipeline.h, docs/pipeline.md): the module paths of the pipeline
  // units in forward order, "model.embed_tokens", "model.layers.0", .., "model.norm", "lm_head"
  // (absent when tied); `is_layer` marks the decoder layers.
  std::vector<std::pair<std::string, bool>> pipeline_units() const;
  // forward() then runs only units [first, last): input 0 is the ids when first == 0, else the
  // hidden state [B, T, H] unit first - 1 produced; output 0 is the logits when `last` is the
  // unit count, else the hidden state, followed by the router logits of the span's MoE layers
  // (for the router losses: causal_lm_router_sums). (0, unit count) is the whole model.
  // With tied embeddings the last stage's logits use model.embed_tokens.weight: that stage must
  // keep the embedding module (prune_to_stage's `keep`).
  void set_pipeline_span(int64_t first, int64_t last);

  // Generation (models/generate.h). set_kv_cache: every forward feeds only new tokens, at the
  // positions after those the cache holds (the whole model only, not a pipeline stage; eval mode).
  // last_logits: the logits [B, V] (f32, f64 for f64 weights) of the last position of input_ids
  // [B, T] only, so that a long prompt does not make [B, T, V] logits.
  void set_kv_cache(KvCache* cache);
  Tensor last_logits(const Tensor& input_ids);

 private:
  int64_t span_first_ = 0, span_last_ = -1;  // -1: the whole model
  ModelConfig config_;
  DType dtype_;
  std::shared_ptr<LlamaModel> model_;
  std::shared_ptr<Linear> lm_head_;  // null when tied
  bool head_dtype_logits_ = false;   // forward() leaves 16-bit logits as they are (loss())
};

// Validates the config and builds the model; parameters are created on init_device() (meta
// under InitDeviceGuard) from the default generator, in registration order.
std::shared_ptr<CausalLM> build_causal_lm(const ModelConfig& config, DType dtype = DType::kF32);

// The training loss of a CausalLM's outputs (logits, then each MoE layer's router logits) as
// CausalLM::loss defines it; also what the start-up checks evaluate after a forward on meta.
Tensor causal_lm_loss(const ModelConfig& config, const std::vector<Tensor>& outputs, const Tensor& targets,
                      bool router_losses = true);

// The same loss in two parts, for pipeline stages: each chunk adds the router statistics of its
// outputs (outputs[1..], its MoE layers' router logits) to the sums the chunks before it carried,
// for the router losses the config turns on (none: `sums` unchanged), and the chunk with the
// logits adds the losses of the totals to the cross-entropy. The result is causal_lm_loss's, bit
// for bit.
RouterSums causal_lm_router_sums(const ModelConfig& config, RouterSums sums, const std::vector<Tensor>& outputs);
// Whether the config turns on the load-balancing loss / the z-loss (what causal_lm_loss adds).
bool uses_balance_loss(const ModelConfig& config);
bool uses_z_loss(const ModelConfig& config);
Tensor causal_lm_loss(const ModelConfig& config, const Tensor& logits, const Tensor& targets, const RouterSums& sums);

}  // namespace mt
