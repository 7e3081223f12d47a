// `meshtrain generate`: a prompt's continuation by a model (docs/generate.md).
//   generate --hf DIR | --config NAME [--init-seed S]   the model: a checkpoint, or random weights
//            --prompt TEXT | --prompt-ids 1,2,3         text: bytes, or encoded by DIR/tokenizer.json
//            --max-new-tokens N --temperature T --top-k K --top-p P --seed S --eos ID|none|auto
//            --no-cache --device D --precision f32|bf16
// Prints the continuation's text (the byte vocabulary, or a tokenizer.json next to the
// checkpoint), then as the last stdout line {"prompt": [...], "tokens": [...], "text": "..."}.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "models/config.h"
#include "models/generate.h"
#include "models/hf_checkpoint.h"
#include "models/hf_config.h"
#include "models/hf_encoder.h"
#include "models/hf_tokenizer.h"
#include "models/llama.h"
#include "models/tokenizer.h"
#include "mesh/world.h"
#include "optim/master_weights.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "tools/cli/args.h"
#include "tools/cli/checks.h"
#include "tools/cli/commands.h"
#include "tools/cli/device.h"
#include "tools/cli/train_state.h"
#include "tools/cli/trainer.h"

namespace mt::cli {
namespace {

const std::vector<FlagSpec> kGenerateFlags = {
    {"hf", "Hugging Face checkpoint directory (config.json + model.safetensors[.index.json])", "", false},
    {"config", "instead of --hf: a built-in name or config.json, with random weights from --init-seed", "", false},
    {"init-seed", "with --config: the seed of the random weights (the weights `init --seed` writes)", "0", false},
    {"prompt", "the prompt as text: bytes for the 256-token byte vocabulary, else encoded by the checkpoint's "
               "tokenizer.json as `tokenizer(text)` does (with its BOS)", "", false},
    {"no-special-tokens", "with --prompt and a tokenizer.json: encode without the tokenizer's template (no BOS)", "",
     true},
    {"prompt-ids", "the prompt as comma-separated token ids", "", false},
    {"max-new-tokens", "tokens to generate at most", "64", false},
    {"temperature", "softmax temperature (0: greedy, the highest logit)", "1.0", false},
    {"top-k", "sample among the k highest logits only (0: all)", "0", false},
    {"top-p", "sample among the fewest highest probabilities that sum to p (1: all)", "1.0", false},
    {"seed", "sampling seed (Philox; the same tokens for the same seed)", "1337", false},
    {"eos", "stop at this token id, or none; auto: the config's eos_token_id, every id of a list (none for the "
            "byte vocabulary)",
     "auto", false},
    {"no-cache", "recompute the whole prefix each step instead of using the KV cache (slower; for checks)", "", true},
    {"device", "cpu, cuda or cuda:N", "cpu", false},
    {"precision", "f32, or bf16 (the weights cast to bf16)", "f32", false},
};

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, comma - at);
    const auto first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
    item = first == std::string::npos ? "" : item.substr(first, last - first + 1);
    MT_CHECK(!item.empty() && item.find_first_not_of("0123456789") == std::string::npos && item.size() <= 18,
             "meshtrain generate: --prompt-ids: item {} ('{}') is not a token id (comma-separated non-negative "
             "integers)",
             ids.size() + 1, item);
    ids.push_back(std::stoll(item));
    at = comma + 1;
  }
  return ids;
}

std::shared_ptr<CausalLM> load_model(const Args& args, ModelConfig& cfg, std::string& dir) {
  MT_CHECK(args.has("hf") != args.has("config"),
           "meshtrain generate: give the model as --hf DIR (a checkpoint) or --config NAME (random weights), one "
           "of the two");
  if (args.has("hf")) {
    MT_CHECK(!args.has("init-seed"), "meshtrain generate: --init-seed sets the random weights of --config; --hf {} "
             "brings its own weights", args.str("hf"));
    dir = args.str("hf");
    HfCheckpoint ck = read_model_checkpoint(dir);
    cfg = ck.config;
    check_model_fits_memory(cfg, ModelUse::kWeights, "generate", dir);
    return build_run_model(cfg, &ck, false);  // built on meta, the file's weights loaded
  }
  cfg = resolve_config(args.str("config"));
  check_model_fits_memory(cfg, ModelUse::kWeights, "generate", args.str("config"));
  manual_seed(static_cast<uint64_t>(args.integer("init-seed", 0, std::numeric_limits<int64_t>::max())));
  return build_run_model(cfg, nullptr, false);
}

}  // namespace

int run_generate(int argc, char** argv) {
  Args args("generate", kGenerateFlags, argc, argv, 2);
  // Everything about the flags is checked before the model is read.
  GenerateOptions opts;
  opts.max_new_tokens = args.integer("max-new-tokens", 1, int64_t{1} << 24);
  opts.sampling.temperature = args.real("temperature");
  opts.sampling.top_k = args.integer("top-k", 0, std::numeric_limits<int32_t>::max());
  opts.sampling.top_p = args.real("top-p");
  opts.seed = static_cast<uint64_t>(args.integer("seed", 0, std::numeric_limits<int64_t>::max()));
  opts.kv_cache = !args.flag("no-cache");
  try {
    check_sampling(opts.sampling);
  } catch (const Error& e) {  // name the flags: --temperature, --top-k, --top-p
    MT_FAIL("meshtrain generate: {} (--temperature {}, --top-k {}, --top-p {})", e.what(), args.str("temperature"),
            args.str("top-k"), args.str("top-p"));
  }
  MT_CHECK(args.has("prompt") != args.has("prompt-ids"),
           "meshtrain generate: give the prompt as --prompt TEXT or --prompt-ids 1,2,3, one of the two");
  MT_CHECK(!args.has("prompt") || !args.str("prompt").empty(), "meshtrain generate: --prompt is empty");
  const DType dtype = parse_precision(args.str("precision"), "generate");
  const Device device = resolve_device("generate", args.str("device"));
  // One process (under `mpirun -np 2` every rank generated and printed the same text until
  // 2026-12-08).
  MT_CHECK(launcher_world().size == 1,
           "meshtrain generate: runs in one process, but mpirun started {}: run it without mpirun (or with -np 1)",
           launcher_world().size);
  // What the flags say by themselves, before a checkpoint of any size is read (these came after
  // the load until 2026-12-08): the ids' syntax, --eos's, --no-special-tokens without --prompt.
  const std::vector<int64_t> prompt_ids = args.has("prompt-ids") ? parse_ids(args.str("prompt-ids")) : std::vector<int64_t>{};
  const std::string eos = args.str("eos");
  if (eos != "auto" && eos != "none") (void)args.integer("eos", 0, std::numeric_limits<int64_t>::max());
  MT_CHECK(!args.flag("no-special-tokens") || args.has("prompt"),
           "meshtrain generate: --no-special-tokens applies to a --prompt encoded by a tokenizer.json");

  ModelConfig cfg;
  std::string dir;
  std::shared_ptr<CausalLM> model = load_model(args, cfg, dir);
  // 256 ids are bytes unless the checkpoint brings a tokenizer.json (a BPE of 256 tokens trained on
  // the data: its prompt went in as bytes, silently, until 2026-12-08).
  const bool bytes = ByteTokenizer::is_byte_vocabulary(cfg.vocab_size, dir);
  std::vector<int64_t> prompt;
  MT_CHECK(!args.flag("no-special-tokens") || (args.has("prompt") && !bytes),
           "meshtrain generate: --no-special-tokens applies to a --prompt encoded by a tokenizer.json");
  if (args.has("prompt") && bytes) {
    for (int32_t t : ByteTokenizer().encode(args.str("prompt"))) prompt.push_back(t);
  } else if (args.has("prompt")) {
    std::optional<HfTokenEncoder> enc = dir.empty() ? std::nullopt : HfTokenEncoder::from_dir(dir);
    MT_CHECK(enc.has_value(),
             "meshtrain generate: --prompt text for a vocabulary of {} tokens needs a tokenizer.json {}; give the "
             "prompt's token ids with --prompt-ids instead",
             cfg.vocab_size, dir.empty() ? std::string("(--config has none: use --hf DIR)") : "in " + dir);
    try {
      prompt = enc->encode(args.str("prompt"), !args.flag("no-special-tokens"));
    } catch (const Error& e) {  // e.g. text that is not UTF-8: name the flag too
      MT_FAIL("meshtrain generate: --prompt: {}", e.what());
    }
    MT_CHECK(!prompt.empty(), "meshtrain generate: --prompt encodes to no tokens");
  } else {
    prompt = prompt_ids;
  }
  for (size_t i = 0; i < prompt.size(); ++i)
    MT_CHECK(prompt[i] < cfg.vocab_size, "meshtrain generate: prompt token {} (position {}) is outside the vocabulary [0, {})",
             prompt[i], i, cfg.vocab_size);
  const auto T = static_cast<int64_t>(prompt.size());
  // The last new token is never fed back: positions 0 .. T + N - 2 are run.
  MT_CHECK(T + opts.max_new_tokens - 1 <= cfg.max_position_embeddings,
           "meshtrain generate: the prompt's {} tokens and --max-new-tokens {} need {} positions (the last new "
           "token is not fed back), which pass the model's max_position_embeddings of {}",
           T, opts.max_new_tokens, T + opts.max_new_tokens - 1, cfg.max_position_embeddings);
  if (eos == "auto" && !bytes && cfg.eos_token_id >= 0) {
    opts.eos_token_ids = {cfg.eos_token_id};  // with every id of a list-valued eos_token_id
    opts.eos_token_ids.insert(opts.eos_token_ids.end(), cfg.extra_eos_token_ids.begin(), cfg.extra_eos_token_ids.end());
  } else if (eos != "auto" && eos != "none") {
    opts.eos_token_ids = {args.integer("eos", 0, cfg.vocab_size - 1)};
  }
  std::optional<HfTokenDecoder> decoder;
  bool undecodable = false;  // a tokenizer.json whose decoder is not supported (its notice printed)
  if (!bytes && !dir.empty()) {
    try {
      decoder = HfTokenDecoder::from_dir(dir);  // nullopt without tokenizer.json
    } catch (const Error& e) {  // the ids are still the answer: say why there is no text
      fmt::print(stderr, "generate: notice: {}; printing token ids only\n", e.what());
      undecodable = true;
    }
  }

  if (dtype != DType::kF32) cast_parameters(*model, dtype);
  if (!device.is_cpu()) model->to(device);
  const Tensor ids = from_vector(prompt, Shape{1, T}, DType::kI64).to(device);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t> tokens = generate(*model, ids, opts)[0];
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::string text;
  if (bytes) {
    std::vector<int32_t> b(tokens.begin(), tokens.end());
    text = ByteTokenizer().decode(b);
  } else if (decoder) {
    int64_t unknown = 0;
    text = decoder->decode(tokens, &unknown);
    if (unknown)
      fmt::print(stderr, "generate: notice: {} of the ids are not defined by {}/tokenizer.json (a vocabulary padded "
                 "past the tokenizer's) and are left out of the text\n", unknown, dir);
  }
  if (bytes || decoder) fmt::print("{}\n", text);
  fmt::print(stderr, "generate: {} tokens in {:.3f} s ({:.1f} tokens/s, {}{})\n", tokens.size(), sec,
             static_cast<double>(tokens.size()) / std::max(sec, 1e-9), opts.kv_cache ? "KV cache" : "no cache",
             bytes || decoder ? ""
             : undecodable    ? "; the tokenizer.json cannot decode (the notice above): token ids only"
                              : "; no tokenizer: token ids only");
  nlohmann::ordered_json j;
  j["prompt"] = prompt;
  j["tokens"] = tokens;
  if (bytes || decoder) j["text"] = text;
  fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  flush_stdout("generate");
  return 0;
}

}  // namespace mt::cli
