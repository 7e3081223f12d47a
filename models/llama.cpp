// LLaMA modules. Everything follows transformers' modeling_llama.py; where HF rounds in float32
// (the rotary tables, the RMSNorm statistics) so does this file, so that f32 runs stay close to
// bit-identical with HF and f64 runs reproduce HF's f64 model (whose tables are f32 as well).
#include "models/llama.h"

#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "models/moe.h"
#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt {

// ---- basic layers -----------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, Bias bias, double init_std, DType dtype) {
  weight_ = &param_normal("weight", Shape{out_features, in_features}, 0.0, init_std, dtype);
  if (bias == Bias::kYes) bias_ = &param_const("bias", Shape{out_features}, 0.0, dtype);
}

std::vector<Tensor> Linear::forward(const std::vector<Tensor>& inputs) {
  MT_CHECK(inputs.size() == 1, "Linear '{}': expected 1 input, got {}", path(), inputs.size());
  return {linear(inputs[0], *weight_, bias())};
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, double init_std, DType dtype) {
  weight_ = &param_normal("weight", Shape{num_embeddings, dim}, 0.0, init_std, dtype);
}

std::vector<Tensor> Embedding::forward(const std::vector<Tensor>& inputs) {
  MT_CHECK(inputs.size() == 1, "Embedding '{}': expected 1 input, got {}", path(), inputs.size());
  return {embedding(*weight_, inputs[0])};
}

RMSNorm::RMSNorm(int64_t dim, double eps, DType dtype) : eps_(eps) {
  weight_ = &param_const("weight", Shape{dim}, 1.0, dtype);
}

std::vector<Tensor> RMSNorm::forward(const std::vector<Tensor>& inputs) {
  MT_CHECK(inputs.size() == 1, "RMSNorm '{}': expected 1 input, got {}", path(), inputs.size());
  // The kernel accumulates in double and scales in f32 (f64 for f64), like HF's x.float() path.
  return {rms_norm(inputs[0], *weight_, eps_)};
}

// ---- rotary tables ----------------------------------------------------------------------------

std::vector<float> rope_inv_freq(const ModelConfig& config) {
  const int64_t D = config.resolved_head_dim();
  const int64_t half = D / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  // HF: 1.0 / (base ** (arange(0, D, 2).float() / D)), all float32.
  for (int64_t i = 0; i < half; ++i) {
    float e = static_cast<float>(2 * i) / static_cast<float>(D);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(config.rope_theta), e);
  }
  const RopeScaling& rs = config.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear) {
    for (float& f : inv) f = f / static_cast<float>(rs.factor);
  } else if (rs.type == RopeScaling::Type::kLlama3) {
    // HF _compute_llama3_parameters. Python scalars meet float32 tensors, so every operation
    // rounds to float; `a / tensor` is reciprocal(tensor) * a in PyTorch.
    const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
    const float factor = static_cast<float>(rs.factor);
    const float low_wl = static_cast<float>(old_ctx / rs.low_freq_factor);
    const float high_wl = static_cast<float>(old_ctx / rs.high_freq_factor);
    const float two_pi = static_cast<float>(2 * std::numbers::pi);
    const float low = static_cast<float>(rs.low_freq_factor);
    const float band = static_cast<float>(rs.high_freq_factor - rs.low_freq_factor);
    for (float& f : inv) {
      const float wavelen = (1.0f / f) * two_pi;
      const float scaled = wavelen > low_wl ? f / factor : f;
      const float smooth = ((1.0f / wavelen) * static_cast<float>(old_ctx) - low) / band;
      const float smoothed = ((1.0f - smooth) * scaled) / factor + smooth * scaled;
      const bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
      f = medium ? smoothed : scaled;
    }
  }
  return inv;
}

std::pair<Tensor, Tensor> rope_cos_sin(const ModelConfig& config, int64_t T, DType dtype, Device device) {
  const std::vector<float> inv = rope_inv_freq(config);
  const int64_t half = static_cast<int64_t>(inv.size());
  std::vector<float> c(static_cast<size_t>(T * half)), s(c.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(t) * inv[static_cast<size_t>(i)];
      c[static_cast<size_t>(t * half + i)] = std::cos(a);
      s[static_cast<size_t>(t * half + i)] = std::sin(a);
    }
  }
  Tensor ct = from_vector<float>(c, Shape{T, half}).to(dtype);
  Tensor st = from_vector<float>(s, Shape{T, half}).to(dtype);
  if (device != ct.device()) {
    ct = ct.to(device);
    st = st.to(device);
  }
  return {ct, st};
}

// ---- attention --------------------------------------------------------------------------------

namespace {

Bias bias_if(bool on) { return on ? Bias::kYes : Bias::kNo; }

}  // namespace

LlamaAttention::LlamaAttention(const ModelConfig& c, DType dtype)
    : head_dim_(c.resolved_head_dim()), attention_dropout_(c.attention_dropout) {
  const int64_t H = c.hidden_size, D = head_dim_;
  const Bias b = bias_if(c.attention_bias);
  const double std = c.initializer_range;
  q_proj_ = register_module("q_proj", std::make_shared<Linear>(H, c.num_attention_heads * D, b, std, dtype));
  k_proj_ = register_module("k_proj", std::make_shared<Linear>(H, c.num_key_value_heads * D, b, std, dtype));
  v_proj_ = register_module("v_proj", std::make_shared<Linear>(H, c.num_key_value_heads * D, b, std, dtype));
  o_proj_ = register_module("o_proj", std::make_shared<Linear>(c.num_attention_heads * D, H, b, std, dtype));
  // A head's D rows (columns of o_proj) are viewed as one [.., D] block: a plan splits whole heads.
  const std::string head = "attention head";
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    declare_shard_unit(std::string(p) + ".weight", 0, D, head);
    if (c.attention_bias) declare_shard_unit(std::string(p) + ".bias", 0, D, head);
  }
  declare_shard_unit("o_proj.weight", 1, D, head);
}

std::vector<Tensor> LlamaAttention::forward(const std::vector<Tensor>& inputs) {
  MT_CHECK(inputs.size() == 3, "LlamaAttention '{}': expected inputs {{x, cos, sin}}, got {}", path(),
           inputs.size());
  const Tensor& x = inputs[0];
  MT_CHECK(x.dim() == 3, "LlamaAttention '{}': x must be [B, T, H], got {}", path(), x.desc());
  const int64_t B = x.size(0), T = x.size(1), D = head_dim_;
  Tensor cos = inputs[1].unsqueeze(-2), sin = inputs[2].unsqueeze(-2);  // [T, 1, D/2]
  // [B, T, heads, D]; RoPE before the transpose to [B, heads, T, D] (HF order is the same math).
  Tensor q = (*q_proj_)(x).view(Shape{B, T, -1, D});
  Tensor k = (*k_proj_)(x).view(Shape{B, T, -1, D});
  Tensor v = (*v_proj_)(x).view(Shape{B, T, -1, D});
  q = rotary_embedding(q, cos, sin, RopeStyle::kHalf).transpose(1, 2);
  k = rotary_embedding(k, cos, sin, RopeStyle::kHalf).transpose(1, 2);
  v = v.transpose(1, 2);
  if (cache_) {  // keys and values of every position so far; causal with offset S - T
    MT_CHECK(!is_training(), "LlamaAttention '{}': incremental decoding (a KV cache) runs in eval mode", path());
    std::tie(k, v) = cache_->append(cache_layer_, k, v);
  }
  const double scale = std::pow(static_cast<double>(D), -0.5);  // HF: head_dim**-0.5
  Tensor attn = is_training() && attention_dropout_ > 0
                    ? attention_dropout(q, k, v, scale, attention_dropout_)  // HF's eager path
                    : scaled_dot_product_attention(q, k, v, Causal::kYes, scale);
  attn = attn.to(x.dtype()).transpose(1, 2).reshape(Shape{B, T, -1});
  return {(*o_proj_)(attn)};
}

// ---- MLP and decoder layer --------------------------------------------------------------------

LlamaMLP::LlamaMLP(const ModelConfig& c, DType dtype) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const Bias b = bias_if(c.mlp_bias);
  const double std = c.initializer_range;
  gate_proj_ = register_module("gate_proj", std::make_shared<Linear>(H, I, b, std, dtype));
  up_proj_ = register_module("up_proj", std::make_shared<Linear>(H, I, b, std, dtype));
  down_proj_ = register_module("down_proj", std::make_shared<Linear>(I, H, b, std, dtype));
}

std::vector<Tensor> LlamaMLP::forward(const std::vector<Tensor>& inputs) {
  MT_CHECK(inputs.size() == 1, "LlamaMLP '{}': expected 1 input, got {}", path(), inputs.size());
  const Tensor& x = inputs[0];
  return {(*down_proj_)(silu_mul((*gate_proj_)(x), (*up_proj_)(x)))};
}

LlamaDecoderLayer::LlamaDecoderLayer(const ModelConfig& c, DType dtype)
    : moe_(c.is_moe()), residual_dropout_(c.residual_dropout) {
  self_attn_ = register_module("self_attn", std::make_shared<LlamaAttention>(c, dtype));
  if (moe_)
    mlp_ = register_module("block_sparse_moe", std::make_shared<MixtralSparseMoeBlock>(c, dtype));
  else
    mlp_ = register_module("mlp", std::make_shared<LlamaMLP>(c, dtype));
  input_layernorm_ = register_module("input_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, dtype));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, dtype));
}

std::vector<Tensor> LlamaDecoderLayer::forward(const std::vector<Tensor>& inputs) {
  MT_CHECK(inputs.size() == 3, "decoder layer '{}': expected inputs {{x, cos, sin}}, got {}", path(),
           inputs.size());
  const Tensor& x = inputs[0];
  const double p = is_training() ? residual_dropout_ : 0.0;
  Tensor a = (*self_attn_)({(*input_layernorm_)(x), inputs[1], inputs[2]})[0];
  if (p > 0) a = dropout(a, p);
  Tensor h = add(x, a);
  std::vector<Tensor> mo = (*mlp_)(std::vector<Tensor>{(*post_attention_layernorm_)(h)});
  Tensor m = mo[0];
  if (p > 0) m = dropout(m, p);
  Tensor out = add(h, m);
  if (moe_) return {out, mo.at(1)};
  return {out};
}

// ---- whole model ------------------------------------------------------------------------------

LlamaModel::LlamaModel(const ModelConfig& c, DType dtype) : config_(c) {
  embed_tokens_ =
      register_module("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, c.initializer_range, dtype));
  layers_ = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers_->push_back(std::make_shared<LlamaDecoderLayer>(c, dtype));
  norm_ = register_module("norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, dtype));
}

std::vector<Tensor> LlamaModel::forward(const std::vector<Tensor>& inputs) {
  MT_CHECK(inputs.size() == 1, "LlamaModel '{}': expected 1 input (input_ids), got {}", path(), inputs.size());
  const Tensor& ids = inputs[0];
  MT_CHECK(!span_embed_ || (ids.dim() == 2 && is_integral(ids.dtype()) && ids.dtype() != DType::kBool),
           "LlamaModel '{}': input_ids must be an integer tensor [B, T], got {}", path(), ids.desc());
  MT_CHECK(span_embed_ || (ids.dim() == 3 && is_floating(ids.dtype())),
           "LlamaModel '{}': a pipeline stage after the embedding takes the hidden state [B, T, H], got {}", path(),
           ids.desc());
  const int64_t T = ids.size(1);
  Tensor h = span_embed_ ? (*embed_tokens_)(ids) : ids;
  // Rotary tables of positions 0..rows-1; with a KV cache those of the capacity, of which this
  // step takes rows [length, length + T) (each row depends on its position only).
  const int64_t rows = cache_ ? cache_->capacity() : T;
  MT_CHECK(!cache_ || cache_->length() + T <= rows,
           "LlamaModel '{}': {} new positions after the {} the KV cache holds pass its capacity of {}", path(), T,
           cache_ ? cache_->length() : 0, rows);
  if (!cos_.defined() || cos_.size(0) != rows || cos_.dtype() != h.dtype() || cos_.device() != h.device())
    std::tie(cos_, sin_) = rope_cos_sin(config_, rows, h.dtype(), h.device());
  const Tensor cos = cache_ ? cos_.narrow(0, cache_->length(), T) : cos_;
  const Tensor sin = cache_ ? sin_.narrow(0, cache_->length(), T) : sin_;
  std::vector<Tensor> router_logits;
  const size_t last = span_last_ < 0 ? layers_->size() : static_cast<size_t>(span_last_);
  for (size_t i = static_cast<size_t>(span_first_); i < last; ++i) {
    std::vector<Tensor> o = (*layers_->at(i))({h, cos, sin});
    h = o[0];
    if (o.size() > 1) router_logits.push_back(o[1]);
  }
  if (cache_) cache_->advance(T);
  std::vector<Tensor> out{span_norm_ ? (*norm_)(h) : h};
  out.insert(out.end(), router_logits.begin(), router_logits.end());
  return out;
}

void LlamaModel::set_span(bool embed, int64_t layer_first, int64_t layer_last, bool norm) {
  const auto n = static_cast<int64_t>(layers_->size());
  MT_CHECK(0 <= layer_first && layer_first <= layer_last && layer_last <= n,
           "LlamaModel '{}': layer span [{}, {}) outside the {} layers", path(), layer_first, layer_last, n);
  span_embed_ = embed;
  span_first_ = layer_first;
  span_last_ = layer_last;
  span_norm_ = norm;
}

void LlamaModel::set_kv_cache(KvCache* cache) {
  MT_CHECK(!cache || (span_embed_ && span_first_ == 0 && span_last_ < 0 && span_norm_),
           "LlamaModel '{}': a KV cache needs the whole model, not a pipeline stage", path());
  cache_ = cache;
  for (size_t i = 0; i < layers_->size(); ++i)
    layers_->at<LlamaDecoderLayer>(i)->self_attn()->set_kv_cache(cache, static_cast<int64_t>(i));
}

CausalLM::CausalLM(const ModelConfig& c, DType dtype) : config_(c), dtype_(dtype) {
  c.validate();
  MT_CHECK(is_floating(dtype), "CausalLM: parameter dtype must be floating, got {}", dtype);
  model_ = register_module("model", std::make_shared<LlamaModel>(c, dtype));
  if (!c.tie_word_embeddings)
    lm_head_ = register_module("lm_head", std::make_shared<Linear>(c.hidden_size, c.vocab_size, Bias::kNo,
                                                                   c.initializer_range, dtype));
  else
    declare_shared_use("model.embed_tokens.weight");  // the head (forward) reads it after the embedding
}

std::vector<std::pair<std::string, bool>> CausalLM::pipeline_units() const {
  std::vector<std::pair<std::string, bool>> u{{"model.embed_tokens", false}};
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) u.emplace_back(fmt::format("model.layers.{}", i), true);
  u.emplace_back("model.norm", false);
  if (lm_head_) u.emplace_back("lm_head", false);
  return u;
}

void CausalLM::set_pipeline_span(int64_t first, int64_t last) {
  const auto n = static_cast<int64_t>(pipeline_units().size());
  MT_CHECK(0 <= first && first < last && last <= n, "CausalLM: pipeline span [{}, {}) outside the {} units", first,
           last, n);
  const int64_t L = config_.num_hidden_layers;
  // unit 0: embedding; 1..L: layers; L + 1: norm; L + 2: lm_head.
  auto clamp = [&](int64_t u) { return std::min(std::max<int64_t>(u - 1, 0), L); };
  model_->set_span(first == 0, clamp(first), clamp(last), first <= L + 1 && last > L + 1);
  span_first_ = first;
  span_last_ = last == n && first == 0 ? -1 : last;
}

std::vector<Tensor> CausalLM::forward(const std::vector<Tensor>& inputs) {
  const auto n = static_cast<int64_t>(pipeline_units().size());
  if (span_last_ >= 0 && span_last_ < n) {  // a pipeline stage that ends before the logits
    if (span_first_ > config_.num_hidden_layers + 1) return {inputs.at(0)};  // nothing of model (lm_head only: n/a)
    return (*model_)(inputs);  // the hidden state, then the router logits of its MoE layers
  }
  if (span_first_ > config_.num_hidden_layers + 1) {  // lm_head alone
    Tensor logits = (*lm_head_)(inputs.at(0));
    return {logits.dtype() == DType::kF64 || head_dtype_logits_ ? logits : logits.to(DType::kF32)};
  }
  std::vector<Tensor> o = (*model_)(inputs);
  // HF computes lm_head in the weights' dtype, then logits.float(). f64 logits stay f64 (only
  // 16-bit logits are upcast), so f64 models keep full precision for gradient checks.
  Tensor logits = lm_head_ ? (*lm_head_)(o[0]) : linear(o[0], model_->embed_tokens()->weight());
  o[0] = logits.dtype() == DType::kF64 || head_dtype_logits_ ? logits : logits.to(DType::kF32);
  return o;
}

void CausalLM::set_kv_cache(KvCache* cache) {
  MT_CHECK(!cache || (span_first_ == 0 && span_last_ < 0), "CausalLM: a KV cache needs the whole model, not a "
           "pipeline stage (units [{}, {}))", span_first_, span_last_);
  model_->set_kv_cache(cache);
}

Tensor CausalLM::last_logits(const Tensor& input_ids) {
  MT_CHECK(span_first_ == 0 && span_last_ < 0, "CausalLM::last_logits: needs the whole model, not a pipeline stage");
  MT_CHECK(input_ids.dim() == 2 && input_ids.size(1) >= 1, "CausalLM::last_logits: input_ids must be [B, T] with T >= 1, got {}",
           input_ids.desc());
  // model_ and lm_head through their module calls (their hooks run); CausalLM's own forward is
  // skipped, since it would apply lm_head to every position.
  Tensor h = (*model_)(std::vector<Tensor>{input_ids})[0];
  h = h.narrow(1, h.size(1) - 1, 1);
  Tensor logits = lm_head_ ? (*lm_head_)(h) : linear(h, model_->embed_tokens()->weight());
  logits = logits.reshape(Shape{logits.size(0), logits.size(2)});
  return logits.dtype() == DType::kF64 ? logits : logits.to(DType::kF32);
}

Tensor CausalLM::loss(const Tensor& input_ids, const Tensor& targets, bool router_losses) {
  MT_CHECK(targets.shape() == input_ids.shape(), "CausalLM::loss: targets {} must have the shape of input_ids {}",
           targets.shape(), input_ids.shape());
  std::vector<Tensor> o;
  {
    // Through the module call (its hooks run), keeping lm_head's dtype: see llama.h.
    struct Restore {
      bool& flag;
      ~Restore() { flag = false; }
    } restore{head_dtype_logits_};
    head_dtype_logits_ = true;
    o = (*this)(std::vector<Tensor>{input_ids});
  }
  return causal_lm_loss(config_, o, targets, router_losses);
}

bool uses_balance_loss(const ModelConfig& c) {
  return c.is_moe() && c.output_router_logits && c.router_aux_loss_coef != 0;
}
bool uses_z_loss(const ModelConfig& c) { return c.is_moe() && c.router_z_loss_coef != 0; }

RouterSums causal_lm_router_sums(const ModelConfig& config, RouterSums sums, const std::vector<Tensor>& outputs) {
  if ((!uses_balance_loss(config) && !uses_z_loss(config)) || outputs.size() < 2) return sums;
  const std::vector<Tensor> rl(outputs.begin() + 1, outputs.end());
  return add_router_sums(std::move(sums), rl, config.num_local_experts, config.num_experts_per_tok,
                         uses_balance_loss(config), uses_z_loss(config));
}

Tensor causal_lm_loss(const ModelConfig& config, const Tensor& logits, const Tensor& targets, const RouterSums& sums) {
  Tensor l = cross_entropy(logits, targets);
  if (uses_balance_loss(config))
    l = add(l, mul(load_balancing_loss_of(sums, config.num_local_experts).to(l.dtype()), config.router_aux_loss_coef));
  if (uses_z_loss(config)) l = add(l, mul(router_z_loss_of(sums).to(l.dtype()), config.router_z_loss_coef));
  return l;
}

Tensor causal_lm_loss(const ModelConfig& config, const std::vector<Tensor>& outputs, const Tensor& targets,
                      bool router_losses) {
  if (!router_losses || (!uses_balance_loss(config) && !uses_z_loss(config))) return cross_entropy(outputs.at(0), targets);
  return causal_lm_loss(config, outputs.at(0), targets, causal_lm_router_sums(config, {}, outputs));
}

std::shared_ptr<CausalLM> build_causal_lm(const ModelConfig& config, DType dtype) {
  return std::make_shared<CausalLM>(config, dtype);
}

}  // namespace mt
