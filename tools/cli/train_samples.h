// `train --sample-every N`: text the model writes while it trains, as llm.c prints samples
// (docs/generate.md, "During training"). One device only; the sample runs in eval mode without
// gradients and with its own Philox generator (seed + step), so the training run's numbers are
// those of a run without samples.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/generate.h"
#include "models/hf_tokenizer.h"
#include "models/llama.h"
#include "tools/cli/args.h"

namespace mt::cli {

// The train flags sample-every, sample-tokens, sample-prompt, sample-temperature.
std::vector<FlagSpec> sample_flags();

struct TrainSample {
  std::vector<int64_t> tokens;
  std::optional<std::string> text;  // when the vocabulary can be decoded
  int64_t unknown = 0;               // ids tokenizer.json does not define, left out of `text`
};

class TrainSampler {
 public:
  // nullopt when --sample-every is 0. Errors name the flag: under --plan, a text prompt for a
  // vocabulary other than bytes, a sample longer than max_position_embeddings. `seed`: the run's
  // (a resumed run's is its checkpoint's, not --seed's default); sample N draws from seed + N.
  static std::optional<TrainSampler> from_args(const Args& args, const ModelConfig& cfg, const std::string& hf_dir,
                                               bool under_plan, uint64_t seed);
  bool due(int64_t done, int64_t stop_at) const { return done % every_ == 0 || done == stop_at; }
  TrainSample take(CausalLM& model, Device device, int64_t done) const;
  // "step N | sample (...):\n<text>" or the ids.
  static std::string describe(const TrainSample& s, int64_t done, int64_t steps);

 private:
  int64_t every_ = 0;
  std::vector<int64_t> prompt_;
  GenerateOptions opts_;
  uint64_t seed_ = 0;
  bool bytes_ = false;
  std::optional<HfTokenDecoder> decoder_;
};

}  // namespace mt::cli
