// Muon (Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024,
// https://kellerjordan.github.io/posts/muon/): SGD with Nesterov momentum whose update of each
// hidden 2-D weight matrix is orthogonalized by a quintic Newton-Schulz iteration; every other
// parameter (embeddings, lm_head, norms, biases, tensors that are not 2-D) is updated by AdamW.
//
//   buf = momentum * buf + g
//   u   = g + momentum * buf            (Nesterov; buf without it)
//   O   = newton_schulz5(u)             (about U V^T of u's SVD: every singular value near 1)
//   p   = p * (1 - lr * wd) - lr * 0.2 * sqrt(max(rows, cols)) * O
//
// The Newton-Schulz coefficients (a, b, c) = (3.4445, -4.7750, 2.0315) and the 5 iterations are
// Keller Jordan's. The shape scale 0.2 * sqrt(max(rows, cols)) is Moonshot's ("Muon is Scalable
// for LLM Training", Liu et al., 2025): it gives the Muon update the RMS of a typical AdamW update
// (O has RMS about 1/sqrt(max(rows, cols))), so one learning rate and schedule serve both the
// Muon and the AdamW parameters. State: "momentum_buffer.<name>" for Muon parameters,
// "exp_avg.<name>" and "exp_avg_sq.<name>" for the AdamW ones (docs/optim.md).
//
// DTensor parameters: a Muon matrix split along dim 0 on one mesh dim (FSDP's RaggedShard, ZeRO's
// Shard(0)) is gathered to one root rank per matrix (chosen by load balancing), orthogonalized
// there and its update redistributed back to the rows' owners (docs/fsdp.md, "Muon"). A matrix
// split otherwise (tensor parallelism's S(1), or on two mesh dims: FSDP x TP) is gathered the same
// way over the flattened group of its splitting mesh dims: each rank's block goes to one root
// (load-balanced per group), which assembles the matrix, iterates once and sends each rank its block.
#pragma once

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "optim/optimizer.h"

namespace mt {

struct MuonOptions {
  double lr = 3e-3;         // shared by the Muon and the AdamW parameters
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;  // the AdamW parameters
};

// The quintic Newton-Schulz orthogonalization of a 2-D f32 tensor (Keller Jordan's coefficients),
// `steps` iterations, in f32 on its device: x = g / (||g||_F + 1e-7), transposed so that it is
// wide (rows <= cols), then x = a x + (b A + c A A) x with A = x x^T; transposed back.
Tensor newton_schulz5(const Tensor& g, int steps = 5);

class Muon : public Optimizer {
 public:
  Muon(std::vector<ParamGroup> groups, const MuonOptions& opts);
  const MuonOptions& options() const { return opts_; }

  // Whether a parameter gets the Muon update: 2-D, and not an embedding or the output head (a name
  // containing "embed" or "lm_head"); the others get AdamW.
  static bool uses_muon(const std::string& name, const Shape& shape);
  // The factor applied to the orthogonalized update of a rows x cols matrix: 0.2 sqrt(max(rows, cols)).
  static double shape_scale(int64_t rows, int64_t cols);

  // Bytes of optimizer state this rank holds (momentum buffers, AdamW moments; local shards).
  int64_t state_bytes() const;
  NamedTensors state_dict() const override;
  void load_state_dict(const NamedTensors& state) override;

  // Under FSDP: the root rank that orthogonalizes each split Muon matrix (by name), chosen by
  // greedy load balancing (largest flops first, to the least loaded rank); empty otherwise.
  // (FSDP x TP: the root's index in the flattened group of the matrix's splitting mesh dims.)
  const std::unordered_map<std::string, int64_t>& roots() const { return roots_; }
  // Newton-Schulz work this rank has done since construction (flops, 5 x (4 m^2 n + 2 m^3) per
  // matrix and step, m <= n its sides): each matrix is iterated once per step on one rank of its
  // group, so the ranks' sum equals one device's.
  double newton_schulz_flops() const { return ns_flops_done_; }
  // The Newton-Schulz flops one step will add to it on this rank, from the shapes and the roots
  // alone: the matrices this rank is the root of, and every matrix that is whole here.
  double step_newton_schulz_flops() const;
  // The same for a Muon over `params` (all of them: the rule picks the matrices) with `ns_steps`
  // iterations, without making one: works on meta parameters (the estimate, plan/estimate.h).
  static double planned_newton_schulz_flops(const NamedTensors& params, int ns_steps);

 protected:
  void update(Slot& slot, const Tensor& grad, double lr, double weight_decay) override;
  // Split matrices are queued by update() and orthogonalized here, in three phases so that the
  // roots work at the same time: every matrix's rows sent to its root, each root's Newton-Schulz,
  // every update sent back to the rows' owners and applied.
  void finish_step(bool apply) override;

 private:
  struct State {
    bool muon = false;
    Tensor param;   // the parameter as given (a DTensor under a plan)
    Tensor buf;     // Muon: momentum buffer
    Tensor m, v;    // AdamW
  };
  struct Queued {
    std::string name;
    Tensor p, u;  // local
    double lr = 0, decay = 1;
  };
  std::vector<Queued> queued_;
  NamedTensors own_state() const;
  MuonOptions opts_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, State> state_;
  std::unordered_map<std::string, int64_t> roots_;
  double ns_flops_done_ = 0;
  std::unordered_set<std::string> general_;  // split otherwise (TP's S(1), two mesh dims): blocks to a root
  // The root assignment (greedy load balancing over the split matrices) and the generally split ones.
  struct RootPlan {
    std::unordered_map<std::string, int64_t> roots;
    std::unordered_set<std::string> general;
  };
  static RootPlan plan_roots(const NamedTensors& matrices, int ns_steps);
  static double rank_newton_schulz_flops(const NamedTensors& matrices, const RootPlan& plan, int ns_steps);
};

}  // namespace mt
