// `meshtrain eval`, `grad` and `init`: the contracts other tools rely on.
//   eval --hf DIR --tokens FILE               prints {"loss": L} as the last stdout line
//   grad --hf DIR --tokens FILE --out G       also writes every parameter's gradient (f32, HF names)
//   init --config NAME_OR_JSON --seed S --out DIR   writes freshly initialized weights
// FILE holds one sequence per line of T+1 comma-separated ids: inputs are the first T, targets
// the last T, and the loss is the mean cross-entropy over all targets (no auxiliary losses).
#include <fmt/format.h>

#include "models/data.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"

namespace mt::cli {
namespace {

const std::vector<FlagSpec> kEvalFlags = {
    {"hf", "Hugging Face checkpoint directory (config.json + model.safetensors[.index.json])", "", false},
    {"tokens", "text file: one sequence of T+1 comma-separated token ids per line", "", false},
    {"out", "where grad writes the gradients (safetensors, f32, HF names)", "", false},
};

struct Batch {
  Tensor inputs, targets;
};

Batch read_batch(const std::string& path, int64_t vocab) {
  TokenRows rows = read_token_lines(path);
  check_token_range(rows, vocab, path);
  MT_CHECK(rows.cols >= 2, "{}: each line needs at least 2 token ids (T+1 with T >= 1), found {}", path, rows.cols);
  Tensor all = from_vector<int64_t>(rows.ids, Shape{rows.rows, rows.cols});
  return {all.narrow(1, 0, rows.cols - 1).contiguous(), all.narrow(1, 1, rows.cols - 1).contiguous()};
}

// Loads the checkpoint in f32 and returns the model with its mean cross-entropy on the file.
std::pair<std::shared_ptr<CausalLM>, Tensor> model_loss(const Args& args) {
  const std::string dir = args.required("hf"), tokens = args.required("tokens");
  HfCheckpoint ck = read_hf_checkpoint(dir);
  Batch batch = read_batch(tokens, ck.config.vocab_size);
  std::shared_ptr<CausalLM> model;
  {
    InitDeviceGuard meta(Device::meta());  // weights come from the file: skip random init
    model = build_causal_lm(ck.config);
  }
  load_into_module(*model, ck);
  model->eval();
  Tensor logits = (*model)(std::vector<Tensor>{batch.inputs})[0];
  Tensor loss = cross_entropy(logits.to(DType::kF32), batch.targets);
  return {model, loss};
}

void print_loss(const Tensor& loss) { fmt::print("{{\"loss\": {:.9g}}}\n", loss.item()); }

}  // namespace

int run_eval(int argc, char** argv) {
  Args args("eval", kEvalFlags, argc, argv, 2);
  NoGradGuard no_grad;
  auto [model, loss] = model_loss(args);
  print_loss(loss);
  return 0;
}

int run_grad(int argc, char** argv) {
  Args args("grad", kEvalFlags, argc, argv, 2);
  const std::string out = args.required("out");
  auto [model, loss] = model_loss(args);
  loss.backward();
  // The model's own parameters (not hf_state's detached export views, which carry no grad).
  // Their paths are the HF names; tied models have no lm_head parameter. A parameter that got no
  // gradient (an expert no token was routed to) contributes zeros, as in transformers.
  std::vector<std::pair<std::string, Tensor>> grads;
  for (auto& [name, p] : model->named_parameters()) {
    Tensor g = p.grad().defined() ? p.grad() : zeros(p.shape(), p.options());
    grads.emplace_back(name, g.to(DType::kF32));
  }
  write_safetensors(out, grads);
  print_loss(loss);
  return 0;
}

int run_init(int argc, char** argv) {
  Args args("init", {{"config", "built-in name, config.json, or a directory holding one", "", false},
                     {"seed", "random seed", "0", false},
                     {"out", "output directory for config.json + model.safetensors", "", false},
                     {"dtype", "f32, bf16 or f16 on disk", "f32", false}},
            argc, argv, 2);
  ModelConfig cfg = resolve_config(args.required("config"));
  const std::string out = args.required("out");
  std::string dt = args.str("dtype");
  MT_CHECK(dt == "f32" || dt == "bf16" || dt == "f16", "meshtrain init: --dtype must be f32, bf16 or f16, got '{}'", dt);
  DType dtype = dt == "f32" ? DType::kF32 : dt == "bf16" ? DType::kBF16 : DType::kF16;
  manual_seed(static_cast<uint64_t>(args.integer("seed")));
  auto model = build_causal_lm(cfg);
  write_hf_checkpoint(out, cfg, hf_state(*model, cfg), dtype);
  fmt::print("{{\"out\": \"{}\", \"parameters\": {}}}\n", out, cfg.num_parameters());
  return 0;
}

}  // namespace mt::cli
