// Flag ranges, memory and finiteness checks of the meshtrain commands (see checks.h).
#include "tools/cli/checks.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "mesh/dtensor.h"
#include "runtime/error.h"
#include "tools/cli/trainer.h"

namespace mt::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", b, units[u]);
}

}  // namespace

void validate_train_flags(const Args& args) {
  validate_step_flags(args, "train");
  args.integer("steps", 1, kMaxSteps);
  args.integer("stop-at", 0, kMaxSteps);
  args.integer("checkpoint-every", 0, kMaxSteps);
  args.integer("log-every", 1, kMaxSteps);
  args.integer("val-every", 0, kMaxSteps);
  const int64_t n = args.integer("val-batches", 1, kMaxSteps);
  // Flags that would be ignored are refused (docs/cli.md): an empty --data (a script's unset
  // variable) trained on the embedded corpus, and the validation flags without --val-data did nothing.
  for (const char* flag : {"data", "val-data"})
    MT_CHECK(!args.has(flag) || !args.str(flag).empty(),
             "meshtrain train: --{} is empty; give a token shard (or a pattern of shards){}", flag,
             std::string(flag) == "data" ? ", or leave --data out to train on the embedded corpus" : "");
  for (const char* flag : {"val-every", "val-batches"})
    MT_CHECK(!args.has(flag) || args.has("val-data"),
             "meshtrain train: --{} applies to the validation loss of --val-data, which is not given", flag);
  // Checkpoint and plan flags with nothing to apply to (a script's `--keep 3` with a forgotten
  // --checkpoint-dir kept nothing, silently, until 2026-12-08).
  const bool ckpt = args.has("checkpoint-dir") && !args.str("checkpoint-dir").empty();
  for (const char* flag : {"checkpoint-every", "keep", "overwrite", "sync-save", "gather-save"})
    MT_CHECK(!args.asks(flag) || ckpt, "meshtrain train: --{} applies to the checkpoints of --checkpoint-dir, which is not given",
             flag);
  MT_CHECK(!args.asks("allow-changes") || args.flag("resume"),
           "meshtrain train: --allow-changes applies to a --resume's settings; this run does not resume");
  const bool plan = args.has("plan") && !args.str("plan").empty();
  for (const char* flag : {"sync-save", "gather-save", "no-fuse", "bucket-mb"})
    MT_CHECK(!args.asks(flag) || plan, "meshtrain train: --{} applies to a run under --plan, which is not given", flag);
  // The validation rows, n x batch x seq tokens (+1), must be a count before any file is read.
  int64_t need = 0;
  MT_CHECK(!__builtin_mul_overflow(n, args.integer("batch"), &need) &&
               !__builtin_mul_overflow(need, args.integer("seq"), &need) && need < INT64_MAX,
           "meshtrain train: --val-batches {} x --batch {} x --seq {} tokens is past any token file", n,
           args.integer("batch"), args.integer("seq"));
}

void validate_train_flags(const Args& args, const ModelConfig& cfg, const std::string& source,
                          const std::string& command) {
  const int64_t seq = args.integer("seq");
  MT_CHECK(seq <= cfg.max_position_embeddings,
           "meshtrain {}: --seq {} is longer than max_position_embeddings = {} of the model ({})", command, seq,
           cfg.max_position_embeddings, source);
}

void check_model_fits_memory(const ModelConfig& cfg, ModelUse use, const std::string& command,
                             const std::string& source) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;  // unknown: let the allocator decide
  const double memory = static_cast<double>(pages) * static_cast<double>(page);
  const double params = cfg.num_parameters_approx();
  const double need = params * 4.0 * static_cast<double>(static_cast<int>(use));
  const char* what = use == ModelUse::kWeights           ? "f32 weights"
                     : use == ModelUse::kWeightsAndGrads ? "f32 weights and gradients"
                                                         : "f32 weights, gradients and AdamW moments";
  MT_CHECK(need <= memory,
           "meshtrain {}: the {:.3g} parameters of model '{}' need at least {} ({}) but this machine has {} of memory",
           command, params, source, human_bytes(need), what, human_bytes(memory));
}

std::optional<NonFinite> first_non_finite(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || t.is_meta() || !is_floating(t.dtype())) continue;
    // A DTensor is gathered (a collective: every rank scans the same tensors and stops at the same one).
    Tensor whole = t.is_distributed() ? full_tensor(t.detach()) : t;
    if (whole.dtype() == DType::kF64) {
      const std::vector<double> v = whole.to_vector<double>();
      for (size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i])) return NonFinite{name, static_cast<int64_t>(i), v[i]};
    } else {
      const std::vector<float> v = whole.to_vector<float>();
      for (size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i])) return NonFinite{name, static_cast<int64_t>(i), static_cast<double>(v[i])};
    }
  }
  return std::nullopt;
}

std::string value_text(double v) { return std::isnan(v) ? "nan" : fmt::format("{}", v); }

std::string describe_non_finite(const NamedTensors& tensors) {
  auto bad = first_non_finite(tensors);
  if (!bad) return "every weight is finite, so the forward pass overflowed (weights too large?)";
  return fmt::format("tensor '{}' holds {} at element {}", bad->name, value_text(bad->value), bad->index);
}

void flush_stdout(const std::string& command) {
  MT_CHECK(std::fflush(stdout) == 0 && !std::ferror(stdout), "meshtrain {}: cannot write the result to stdout: {}",
           command, std::strerror(errno));
}

}  // namespace mt::cli
