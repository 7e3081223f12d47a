// The FSDP layout planner (plan/fsdp_layout.h) on the shape lists of three large models, built
// here from their published configurations (no weights): Llama-3-70B, DeepSeek-V3 (671B, 256
// experts per layer as separate tensors) and GPT-OSS-120B (128 experts fused in one tensor). One
// FSDP unit per decoder layer, plus one for the embedding and one for the final norm and head.
// Row granularity 1, 16 and 128 for the MLP and expert weights (1 row elsewhere), group sizes 8 to
// 1024. Printed per case: the planner's padding, the lower bound's padding, the padding of
// sharding each tensor by itself in whole blocks (the baseline: what per-tensor sharding that keeps
// blocks whole pads), and the planner's time for the whole model (identical layers planned once).
// usage: bench_fsdp_layout [GROUPS (comma list)] [GRANULARITIES (comma list)]
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "plan/fsdp_layout.h"

namespace {

using mt::LayoutTensor;
using Unit = std::vector<LayoutTensor>;

// A matrix [rows, cols] (an N-D tensor: rows = the product of all dims but the last).
LayoutTensor mat(std::string name, int64_t rows, int64_t cols, int64_t block_rows = 1) {
  return {std::move(name), rows, cols, block_rows};
}
LayoutTensor vec(std::string name, int64_t n) { return {std::move(name), n, 1, 1}; }

struct Model {
  std::string name;
  std::vector<Unit> units;
};

Unit embedding(int64_t vocab, int64_t hidden) { return {mat("embed_tokens", vocab, hidden)}; }
Unit head(int64_t vocab, int64_t hidden) { return {vec("norm", hidden), mat("lm_head", vocab, hidden)}; }

Model llama3_70b(int64_t g) {
  const int64_t H = 8192, I = 28672, vocab = 128256;
  Model m{"Llama-3-70B", {embedding(vocab, H)}};
  for (int l = 0; l < 80; ++l)
    m.units.push_back({mat("q_proj", 8192, H), mat("k_proj", 1024, H), mat("v_proj", 1024, H), mat("o_proj", H, 8192),
                       mat("gate_proj", I, H, g), mat("up_proj", I, H, g), mat("down_proj", H, I, g),
                       vec("input_layernorm", H), vec("post_attention_layernorm", H)});
  m.units.push_back(head(vocab, H));
  return m;
}

Model deepseek_v3(int64_t g) {
  const int64_t H = 7168, dense_I = 18432, moe_I = 2048, experts = 256, vocab = 129280, heads = 128;
  Model m{"DeepSeek-V3-671B", {embedding(vocab, H)}};
  for (int l = 0; l < 61; ++l) {
    Unit u = {vec("input_layernorm", H),
              mat("q_a_proj", 1536, H),
              vec("q_a_layernorm", 1536),
              mat("q_b_proj", heads * (128 + 64), 1536),
              mat("kv_a_proj_with_mqa", 512 + 64, H),
              vec("kv_a_layernorm", 512),
              mat("kv_b_proj", heads * (128 + 128), 512),
              mat("o_proj", H, heads * 128),
              vec("post_attention_layernorm", H)};
    if (l < 3) {  // first_k_dense_replace
      u.push_back(mat("gate_proj", dense_I, H, g));
      u.push_back(mat("up_proj", dense_I, H, g));
      u.push_back(mat("down_proj", H, dense_I, g));
    } else {
      u.push_back(mat("gate.weight", experts, H));
      u.push_back(vec("gate.e_score_correction_bias", experts));
      for (int e = 0; e <= experts; ++e) {  // the last is the shared expert
        const std::string p = e < experts ? fmt::format("experts.{}.", e) : std::string("shared_experts.");
        u.push_back(mat(p + "gate_proj", moe_I, H, g));
        u.push_back(mat(p + "up_proj", moe_I, H, g));
        u.push_back(mat(p + "down_proj", H, moe_I, g));
      }
    }
    m.units.push_back(std::move(u));
  }
  m.units.push_back(head(vocab, H));
  return m;
}

Model gpt_oss_120b(int64_t g) {
  const int64_t H = 2880, I = 2880, experts = 128, vocab = 201088, heads = 64, kv = 8, hd = 64;
  Model m{"GPT-OSS-120B", {embedding(vocab, H)}};
  for (int l = 0; l < 36; ++l)
    m.units.push_back({vec("input_layernorm", H), mat("q_proj", heads * hd, H), vec("q_proj.bias", heads * hd),
                       mat("k_proj", kv * hd, H), vec("k_proj.bias", kv * hd), mat("v_proj", kv * hd, H),
                       vec("v_proj.bias", kv * hd), mat("o_proj", H, heads * hd), vec("o_proj.bias", H),
                       vec("sinks", heads), vec("post_attention_layernorm", H), mat("router.weight", experts, H),
                       vec("router.bias", experts),
                       mat("experts.gate_up_proj", experts * H, 2 * I, g),  // [128, 2880, 5760]
                       mat("experts.gate_up_proj_bias", experts, 2 * I),
                       mat("experts.down_proj", experts * I, H, g),  // [128, 2880, 2880]
                       mat("experts.down_proj_bias", experts, H)});
  m.units.push_back(head(vocab, H));
  return m;
}

std::vector<int64_t> parse_list(const char* text, std::vector<int64_t> fallback) {
  if (!text) return fallback;
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> groups = parse_list(argc > 1 ? argv[1] : nullptr, {8, 16, 32, 64, 128, 256, 512, 1024});
  const std::vector<int64_t> grans = parse_list(argc > 2 ? argv[2] : nullptr, {1, 16, 128});
  fmt::print("| model | group | MLP/expert rows per block | planner padding | lower bound | per-tensor block sharding | "
             "planner time (whole model) |\n|---|---|---|---|---|---|---|\n");
  for (auto build : {llama3_70b, deepseek_v3, gpt_oss_120b}) {
    for (int64_t g : grans) {
      const Model m = build(g);
      for (int64_t group : groups) {
        mt::LayoutOptions opt;
        opt.group = group;
        int64_t payload = 0, padding = 0, bound_padding = 0, per_tensor_padding = 0;
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<mt::FsdpLayout> layouts = mt::plan_fsdp_layouts(m.units, opt);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        for (const mt::FsdpLayout& l : layouts) {
          payload += l.payload;
          padding += l.padding();
          bound_padding += l.lower_bound * group - l.payload;
        }
        // The baseline: each tensor split evenly by itself in whole blocks (padded to a multiple of
        // group blocks), as per-tensor sharding that keeps blocks whole must.
        for (const Unit& u : m.units)
          for (const LayoutTensor& t : u) {
            const int64_t blocks = t.rows / t.block_rows;
            per_tensor_padding += ((blocks + group - 1) / group * group - blocks) * t.block_numel();
          }
        auto pct = [&](int64_t x) { return 100.0 * static_cast<double>(x) / static_cast<double>(payload); };
        fmt::print("| {} | {} | {} | {:.2f}% | {:.2f}% | {:.2f}% | {:.1f} ms |\n", m.name, group, g, pct(padding),
                   pct(bound_padding), pct(per_tensor_padding), ms);
      }
    }
  }
  return 0;
}
