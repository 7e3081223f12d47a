// What `meshtrain parity` measures and prints (docs/cli.md, "parity"): per step the loss and the
// gradient norm of the parallel run and of the reference, per tensor the largest difference
// between the parallel tensor (a DTensor: each rank compares its own shard with the same slice of
// the reference) and the reference, with the rank and placement that held the worst element.
// Relative differences are taken against the largest magnitude of the reference (a tensor's
// max |ref|, a loss's |ref|), as the project's parity tests always have.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/cli/parallel.h"

namespace mt::cli {

// |a - b| relative to `scale` (0 when both are equal, inf when the scale is 0 and they differ;
// any nan makes it inf).
double relative_diff(double abs_diff, double scale);

// One element's difference, as parity and compare count it: 0 for equal values (infinities of one
// sign included), inf for a NaN or an infinity the other side lacks, else |a - b|. A tensor's
// scale is its reference's largest finite magnitude (an inf there made every difference pass until
// 2026-12-07).
double element_diff(double a, double b);

// A tensor's differences are relative to its largest |reference|, but never to less than this
// fraction of the largest |reference| among the tensors compared with it (the step's gradients,
// the weights): a gradient that is zero in exact arithmetic (q and k at a sequence of one token)
// holds only rounding noise on both sides, of the size of the other gradients' rounding, and
// its own scale would call that noise a 100% difference. docs/cli.md, "parity".
inline constexpr double kScaleFloor = 1e-3;
// The floors of tensors whose largest |reference| values are `ref_max`: kScaleFloor x the largest.
double scale_floor(const std::vector<double>& ref_max);

struct StepRow {
  int64_t step = 0;
  double loss = 0, grad_norm = 0;                       // the parallel run
  std::optional<double> ref_loss, ref_grad_norm;        // absent with a --reference file
  double loss_rel() const;
  double grad_norm_rel() const;
};

struct TensorDiff {
  std::string name;
  Shape shape;            // global
  std::string placement;  // on the plan's mesh, e.g. "tp=S(0)"; "replicated" for a plain tensor
  double max_abs = 0;     // max |parallel - reference| over every element on every rank
  double ref_max = 0;     // max |reference|
  double floor = 0;       // the least scale (kScaleFloor of the largest ref_max compared with it)
  int rank = 0;           // the rank that held the worst element
  Shape local_index;      // its coordinates in that rank's local shard
  double rel() const { return relative_diff(max_abs, std::max(ref_max, floor)); }
};

// Compares every tensor of `parallel` (this rank's DTensors or plain tensors) with the full
// reference tensor of the same name (the same on every rank). Collective: every rank calls it
// with the same names. A name missing from `reference`, or a reference of another shape, is an
// error naming `source` (the reference) and the tensor.
std::vector<TensorDiff> compare_tensors(const NamedTensors& parallel, const NamedTensors& reference,
                                        const PlanContext& ctx, const std::string& source);

// The parameters that have a gradient on one side only (after the parallel run's gradient
// reduction), as "NAME has a gradient under the plan only" / "... in the reference only": the
// optimizer steps such a parameter (momentum, weight decay) on that side only, so the weights part
// whatever the tolerance. Collective: a parallel gradient counts when any rank holds one.
std::vector<std::string> one_sided_gradients(const NamedTensors& parallel, const NamedTensors& reference,
                                             const PlanContext& ctx);

// The gradients of `params` (zeros where a parameter got none), same names.
NamedTensors gradients_of(const NamedTensors& params);

struct ParityReport {
  std::string plan;
  int world = 1;
  double tol = 0;        // every loss; step 1's grad norm and gradients (from the same weights)
  double drift_tol = 0;  // what follows an optimizer step: later grad norms, the last weights and gradients
  std::string reference;  // "in-process" or the --reference path
  std::vector<StepRow> steps;
  std::vector<TensorDiff> first_grads;      // of step 1, before clipping (both sides from the same weights)
  std::vector<TensorDiff> weights, grads;  // after the last step (grads: only when it is not step 1)
  nlohmann::json per_module;               // --per-module, else null
  std::vector<std::string> one_sided;      // "step S: NAME has a gradient ... only" (always a failure)
  // The checks beyond the tolerance, one line each ("step 2 loss: rel 3e-4 > 1e-5").
  std::vector<std::string> failures() const;
  bool pass() const { return failures().empty(); }
};

// The tables and the verdict on stdout (rank 0 prints; others are quiet).
void print_report(const ParityReport& r);
nlohmann::json report_json(const ParityReport& r);

}  // namespace mt::cli
