// train --sample-every: a generate() call between steps.
#include "tools/cli/train_samples.h"

#include <fmt/format.h>

#include <limits>

#include "models/hf_encoder.h"
#include "models/tokenizer.h"
#include "runtime/error.h"
#include "tensor/ops.h"
#include "tools/cli/checks.h"

namespace mt::cli {

std::vector<FlagSpec> sample_flags() {
  return {
      {"sample-every", "print text the model generates every N steps and at the end (0: never; one device only)",
       "0", false},
      {"sample-tokens", "tokens per sample", "64", false},
      {"sample-prompt", "the samples' prompt as text (byte vocabulary: default a newline; other vocabularies: "
                        "encoded by --hf's tokenizer.json with its BOS, default the config's bos_token_id)", "", false},
      {"sample-temperature", "the samples' softmax temperature (0: greedy)", "1.0", false},
  };
}

std::optional<TrainSampler> TrainSampler::from_args(const Args& args, const ModelConfig& cfg,
                                                    const std::string& hf_dir, bool under_plan, uint64_t seed) {
  const int64_t every = args.integer("sample-every", 0, kMaxSteps);
  if (every == 0) {
    // A flag that would be ignored is refused, as --val-every without --val-data (2026-12-07).
    for (const char* f : {"sample-tokens", "sample-prompt", "sample-temperature"})
      MT_CHECK(!args.has(f), "meshtrain train: --{} applies to the samples of --sample-every N, which is not given "
               "(or 0)", f);
    return std::nullopt;
  }
  MT_CHECK(!under_plan,
           "meshtrain train: --sample-every runs on one device, not under --plan (generate from a checkpoint "
           "instead: meshtrain generate --hf DIR)");
  TrainSampler s;
  s.every_ = every;
  s.opts_.max_new_tokens = args.integer("sample-tokens", 1, int64_t{1} << 20);
  s.opts_.sampling.temperature = args.real("sample-temperature");
  MT_CHECK(s.opts_.sampling.temperature >= 0, "meshtrain train: --sample-temperature {} must be >= 0 (0: greedy)",
           s.opts_.sampling.temperature);
  s.seed_ = seed;
  s.bytes_ = ByteTokenizer::is_byte_vocabulary(cfg.vocab_size, hf_dir);
  const std::string text = args.str("sample-prompt");
  if (s.bytes_) {
    for (int32_t t : ByteTokenizer().encode(text.empty() ? std::string("\n") : text)) s.prompt_.push_back(t);
  } else {
    if (!text.empty()) {
      std::optional<HfTokenEncoder> enc = hf_dir.empty() ? std::nullopt : HfTokenEncoder::from_dir(hf_dir);
      MT_CHECK(enc.has_value(),
               "meshtrain train: --sample-prompt text for a vocabulary of {} tokens needs a tokenizer.json in the --hf "
               "directory{}; leave it empty to start the samples from bos_token_id",
               cfg.vocab_size, hf_dir.empty() ? std::string(" (there is no --hf)") : " " + hf_dir);
      try {
        s.prompt_ = enc->encode(text);
      } catch (const Error& e) {  // e.g. text that is not UTF-8: name the flag too
        MT_FAIL("meshtrain train: --sample-prompt: {}", e.what());
      }
      MT_CHECK(!s.prompt_.empty(), "meshtrain train: --sample-prompt encodes to no tokens");
      for (int64_t id : s.prompt_)
        MT_CHECK(id >= 0 && id < cfg.vocab_size, "meshtrain train: --sample-prompt encodes to token {}, outside the "
                 "model's vocabulary [0, {})", id, cfg.vocab_size);
    } else {
      MT_CHECK(cfg.bos_token_id >= 0 && cfg.bos_token_id < cfg.vocab_size,
               "meshtrain train: --sample-every: the config has no bos_token_id to start the samples from");
      s.prompt_.push_back(cfg.bos_token_id);
    }
    if (!hf_dir.empty()) {
      try {
        s.decoder_ = HfTokenDecoder::from_dir(hf_dir);
      } catch (const Error& e) {
        fmt::print(stderr, "train: notice: {}; samples are printed as token ids\n", e.what());
      }
    }
  }
  const auto T = static_cast<int64_t>(s.prompt_.size());
  // As in generate: the last new token is never fed back, so positions 0 .. T + N - 2 run.
  MT_CHECK(T + s.opts_.max_new_tokens - 1 <= cfg.max_position_embeddings,
           "meshtrain train: the sample's prompt ({} tokens) and --sample-tokens {} need {} positions (the last "
           "new token is not fed back), which pass the model's max_position_embeddings of {}",
           T, s.opts_.max_new_tokens, T + s.opts_.max_new_tokens - 1, cfg.max_position_embeddings);
  return s;
}

TrainSample TrainSampler::take(CausalLM& model, Device device, int64_t done) const {
  GenerateOptions o = opts_;
  o.seed = seed_ + static_cast<uint64_t>(done);
  const Tensor prompt =
      from_vector(prompt_, Shape{1, static_cast<int64_t>(prompt_.size())}, DType::kI64).to(device);
  TrainSample s;
  s.tokens = generate(model, prompt, o)[0];
  if (bytes_)
    s.text = ByteTokenizer().decode(std::vector<int32_t>(s.tokens.begin(), s.tokens.end()));
  else if (decoder_)
    s.text = decoder_->decode(s.tokens, &s.unknown);
  return s;
}

std::string TrainSampler::describe(const TrainSample& s, int64_t done, int64_t steps) {
  std::string ids;
  if (!s.text) {
    for (int64_t t : s.tokens) {
      if (!ids.empty()) ids += ',';
      ids += std::to_string(t);
    }
  }
  const std::string left_out =
      s.unknown ? fmt::format("; {} ids that tokenizer.json does not define left out", s.unknown) : "";
  return fmt::format("step {:5d}/{} | sample ({} tokens{}):\n{}\n", done, steps, s.tokens.size(), left_out,
                     s.text ? *s.text : ids);
}

}  // namespace mt::cli
