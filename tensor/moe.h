// The mixture-of-experts seam between a model and a plan. A model's MoE layer computes its routing
// (which experts each token goes to, with which weights) and hands the rest to an
// ExpertDispatcher: run each expert on the tokens routed to it and sum the weighted outputs back
// per token. The default runs every expert here, in expert order (what one device does); a plan
// installs another dispatcher on the layer (plan/expert_dispatch.h: tokens sent to the ranks that
// own their experts with an all-to-all) without touching the model's code. docs/moe.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/module.h"
#include "tensor/tensor.h"

namespace mt {

// One layer call's routing, all over the same N tokens.
struct ExpertRouting {
  Tensor x;         // [N, H] the tokens
  Tensor selected;  // [N, k] int64: the experts of each token, by slot
  Tensor weights;   // [N, k] x's dtype: the weight of each (token, slot)
  // The layer's input ([B, T, H], x is its [N, H] view): the output takes its shape (and, for a
  // DTensor, its placements). Undefined: the output is [N, H].
  Tensor input;
  // > 0: each expert computes at most ceil(capacity_factor * N_all * k / E) rows (N_all: the
  // tokens of this call over every rank that shares the experts), in slot-major order over the
  // whole batch (slot 0 of every token first); the other rows are dropped (their term is zero).
  // 0: dropless.
  double capacity_factor = 0;
};

// The tokens of each expert in the order one device processes them: slot-major (all tokens of
// slot 0, then slot 1, ...), as torch.where over an [k, N] expert mask yields them.
struct ExpertLists {
  std::vector<std::vector<int64_t>> tokens;  // per expert: token index n
  std::vector<std::vector<int64_t>> slots;   // per expert: flat (token, slot) index n * k + j
};
// `selected` holds N * k expert ids (row-major [N, k]); an id outside [0, experts) is an error
// naming `where`.
ExpertLists expert_lists(const std::vector<int64_t>& selected, int64_t n_tokens, int64_t top_k, int64_t experts,
                         const std::string& where);

// Rows each expert may compute: ceil(capacity_factor * tokens * top_k / experts), at least 1 and at
// most tokens * top_k (every row: dropless, for any factor however large);
// INT64_MAX when capacity_factor is 0 (dropless).
int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t experts);

// Rows of each (expert, slot) of `lists`: [experts * top_k], row-major.
std::vector<int64_t> rows_per_slot(const ExpertLists& lists, int64_t top_k);

// The rows the capacity keeps, decided as one device does: `routed` holds the rows of each (rank,
// expert, slot), [ranks * experts * top_k] row-major with the ranks in batch order (one rank: the
// whole batch); expert e keeps its first `capacity` rows in the order slot 0 of every rank, then
// slot 1, ... Returns the kept rows in the same layout; `dropped` receives how many were left out.
std::vector<int64_t> capacity_keep(const std::vector<int64_t>& routed, int64_t ranks, int64_t experts,
                                   int64_t top_k, int64_t capacity, int64_t* dropped);

// Keeps, per expert e, only its first `keep[e * top_k + j]` rows of slot j (the lists are
// slot-major, so these are prefixes of each slot's run).
void keep_rows(ExpertLists& lists, int64_t top_k, const int64_t* keep);

// An index tensor of `v` on `device` (for index_select / index_add of routed rows).
Tensor expert_index(const std::vector<int64_t>& v, Device device);

// `out` plus one expert's weighted terms: out[token_index[i]] += flat_weights[slot_index[i]] *
// rows[i], the terms cast to out's dtype (index_add, recorded by autograd).
Tensor add_expert_terms(const Tensor& out, const Tensor& rows, const Tensor& token_index, const Tensor& slot_index,
                        const Tensor& flat_weights);

class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;
  // out [N, H] (x's dtype; viewed as `input` when given): out[n] = sum over slots j of
  // weights[n, j] * expert_{selected[n, j]}(x[n]), the experts' terms added in expert order.
  // `experts` are the layer's expert modules by index.
  virtual Tensor run(const ExpertRouting& routing, const std::vector<Module*>& experts, const std::string& where) = 0;
  virtual std::string describe() const = 0;  // "all_to_all over ep (4 ranks)"
  // Tokens routed to each expert in the last run, over every rank that shares the experts, and the
  // rows the capacity dropped there.
  virtual std::vector<int64_t> last_tokens_per_expert() const = 0;
  virtual int64_t last_dropped() const = 0;
};

// Every expert here: for each expert in index order, its tokens (ExpertLists order) gathered, the
// expert applied, scaled by their weights and index_add-ed into a zero [N, H] buffer. Experts that
// got no token are not run (their parameters get no gradient), as transformers does.
// `tokens_per_expert`, when given, receives how many (token, slot) rows were routed to each expert
// (dropped ones included), `dropped` how many rows the capacity dropped.
Tensor run_experts_locally(const ExpertRouting& routing, const std::vector<Module*>& experts, const std::string& where,
                           std::vector<int64_t>* tokens_per_expert = nullptr, int64_t* dropped = nullptr);

// A module whose experts run through a dispatcher (models/moe.h's MixtralSparseMoeBlock).
class MoeModule : public Module {
 public:
  virtual std::vector<Module*> expert_modules() = 0;
  // nullptr restores the local default.
  void set_dispatcher(std::shared_ptr<ExpertDispatcher> d) { dispatcher_ = std::move(d); }
  const std::shared_ptr<ExpertDispatcher>& dispatcher() const { return dispatcher_; }
  // Rows (token, slot) routed to each expert by the last forward: over the whole expert-parallel
  // group under all_to_all dispatch, else over the tokens this layer saw. Empty before a forward.
  const std::vector<int64_t>& tokens_per_expert() const { return tokens_per_expert_; }
  // (token, slot) rows the capacity dropped in the last forward (same scope as above).
  int64_t dropped_rows() const { return dropped_; }
  // 0: dropless (the default); see ExpertRouting::capacity_factor.
  void set_capacity_factor(double f) { capacity_factor_ = f; }
  double capacity_factor() const { return capacity_factor_; }

 protected:
  Tensor run_experts(const ExpertRouting& routing);

 private:
  std::shared_ptr<ExpertDispatcher> dispatcher_;
  std::vector<int64_t> tokens_per_expert_;
  int64_t dropped_ = 0;
  double capacity_factor_ = 0;
};

}  // namespace mt
