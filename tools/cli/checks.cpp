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

namespace mt::cli {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

enum class Upper { kInclusive, kExclusive };

// A real flag in [lo, hi] or [lo, hi), named in the error with why the range is what it is.
double real_in(const Args& args, const char* name, double lo, double hi, Upper upper, const char* why) {
  const double x = args.real(name);
  MT_CHECK(x >= lo && (upper == Upper::kExclusive ? x < hi : x <= hi), "meshtrain train: --{} {} is out of range: {}",
           name, args.str(name), why);
  return x;
}

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
  args.integer("batch", 1, kMaxBatch);
  args.integer("seq", 1, kMaxPositions);
  args.integer("accum", 1, kMaxAccum);
  args.integer("steps", 1, kMaxSteps);
  args.integer("stop-at", 0, kMaxSteps);
  args.integer("warmup", 0, kMaxSteps);
  args.integer("checkpoint-every", 0, kMaxSteps);
  args.integer("log-every", 1, kMaxSteps);
  args.integer("seed", 0, kInt64Max);
  const double inf = std::numeric_limits<double>::infinity();
  const double lr = args.real("lr");
  MT_CHECK(lr > 0, "meshtrain train: --lr {} must be positive", args.str("lr"));
  const double min_lr = real_in(args, "min-lr", 0, inf, Upper::kInclusive, "the final learning rate must be >= 0");
  MT_CHECK(min_lr <= lr, "meshtrain train: --min-lr {} is above --lr {}: the cosine schedule decays from --lr to --min-lr",
           args.str("min-lr"), args.str("lr"));
  real_in(args, "weight-decay", 0, inf, Upper::kInclusive, "weight decay must be >= 0");
  real_in(args, "beta2", 0, 1, Upper::kExclusive, "AdamW's beta2 must be in [0, 1)");
  real_in(args, "grad-clip", 0, inf, Upper::kInclusive, "the clipping norm must be >= 0 (0: off)");
  real_in(args, "dropout", 0, 1, Upper::kExclusive, "a dropout probability must be in [0, 1)");
  real_in(args, "bucket-mb", 1.0 / (1 << 20), 1 << 20, Upper::kInclusive,
          "the gradient bucket must be between 1 byte and 1 TiB");
}

void validate_train_flags(const Args& args, const ModelConfig& cfg, const std::string& source) {
  const int64_t seq = args.integer("seq");
  MT_CHECK(seq <= cfg.max_position_embeddings,
           "meshtrain train: --seq {} is longer than max_position_embeddings = {} of the model ({})", seq,
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

std::string describe_non_finite(const NamedTensors& tensors) {
  auto bad = first_non_finite(tensors);
  if (!bad) return "every weight is finite, so the forward pass overflowed (weights too large?)";
  return fmt::format("tensor '{}' holds {} at element {}", bad->name, bad->value, bad->index);
}

void flush_stdout(const std::string& command) {
  MT_CHECK(std::fflush(stdout) == 0 && !std::ferror(stdout), "meshtrain {}: cannot write the result to stdout: {}",
           command, std::strerror(errno));
}

}  // namespace mt::cli
