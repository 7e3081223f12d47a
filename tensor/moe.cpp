// The default expert dispatch: every expert on this device, in expert order (tensor/moe.h).
#include "tensor/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/error.h"
#include "tensor/ops.h"

namespace mt {

ExpertLists expert_lists(const std::vector<int64_t>& selected, int64_t n_tokens, int64_t top_k, int64_t experts,
                         const std::string& where) {
  MT_CHECK(static_cast<int64_t>(selected.size()) == n_tokens * top_k,
           "{}: {} selected experts for {} tokens x top-k {}", where, selected.size(), n_tokens, top_k);
  ExpertLists l;
  l.tokens.resize(static_cast<size_t>(experts));
  l.slots.resize(static_cast<size_t>(experts));
  for (int64_t j = 0; j < top_k; ++j) {
    for (int64_t n = 0; n < n_tokens; ++n) {
      const int64_t e = selected[static_cast<size_t>(n * top_k + j)];
      MT_CHECK(e >= 0 && e < experts, "{}: token {} slot {} routed to expert {}, outside [0, {})", where, n, j, e,
               experts);
      l.tokens[static_cast<size_t>(e)].push_back(n);
      l.slots[static_cast<size_t>(e)].push_back(n * top_k + j);
    }
  }
  return l;
}

int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t experts) {
  if (capacity_factor <= 0) return std::numeric_limits<int64_t>::max();
  // F is meant as written: 1.1 x 50 rows / 5 experts is 11 rows, though the double nearest 1.1 is
  // above it and the product 11.000000000000002 (12 rows until 2026-12-08). A relative 1e-12 below
  // the product absorbs the decimal's binary rounding, far below any real fraction of a row.
  const double x = capacity_factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts);
  const double c = std::ceil(x * (1.0 - 1e-12));
  // No expert can get more than every (token, slot) row: a capacity above that is dropless, and
  // capping it here keeps a huge factor (1e19) from overflowing the conversion (which gave
  // INT64_MIN, a capacity of 1, until 2026-12-07).
  const int64_t rows = std::max<int64_t>(1, tokens * top_k);
  return c >= static_cast<double>(rows) ? rows : std::max<int64_t>(1, static_cast<int64_t>(c));
}

std::vector<int64_t> rows_per_slot(const ExpertLists& l, int64_t top_k) {
  std::vector<int64_t> rows(l.slots.size() * static_cast<size_t>(top_k), 0);
  for (size_t e = 0; e < l.slots.size(); ++e)
    for (int64_t s : l.slots[e]) ++rows[e * static_cast<size_t>(top_k) + static_cast<size_t>(s % top_k)];
  return rows;
}

std::vector<int64_t> capacity_keep(const std::vector<int64_t>& routed, int64_t ranks, int64_t experts,
                                   int64_t top_k, int64_t capacity, int64_t* dropped) {
  std::vector<int64_t> kept(routed.size(), 0);
  int64_t left_out = 0;
  for (int64_t e = 0; e < experts; ++e) {
    int64_t used = 0;
    for (int64_t s = 0; s < top_k; ++s)
      for (int64_t r = 0; r < ranks; ++r) {
        const auto i = static_cast<size_t>((r * experts + e) * top_k + s);
        kept[i] = std::max<int64_t>(0, std::min(routed[i], capacity - used));
        used += kept[i];
        left_out += routed[i] - kept[i];
      }
  }
  if (dropped) *dropped = left_out;
  return kept;
}

void keep_rows(ExpertLists& l, int64_t top_k, const int64_t* keep) {
  for (size_t e = 0; e < l.tokens.size(); ++e) {
    std::vector<int64_t> tokens, slots, seen(static_cast<size_t>(top_k), 0);
    for (size_t i = 0; i < l.tokens[e].size(); ++i) {
      const auto j = static_cast<size_t>(l.slots[e][i] % top_k);
      if (seen[j]++ < keep[e * static_cast<size_t>(top_k) + j]) {
        tokens.push_back(l.tokens[e][i]);
        slots.push_back(l.slots[e][i]);
      }
    }
    l.tokens[e] = std::move(tokens);
    l.slots[e] = std::move(slots);
  }
}

Tensor expert_index(const std::vector<int64_t>& v, Device device) {
  Tensor t = from_vector<int64_t>(v, Shape{static_cast<int64_t>(v.size())});
  return device.is_cpu() ? t : t.to(device);
}

Tensor add_expert_terms(const Tensor& out, const Tensor& rows, const Tensor& token_index, const Tensor& slot_index,
                        const Tensor& flat_weights) {
  Tensor cur = mul(rows, index_select(flat_weights, 0, slot_index).unsqueeze(1));
  return index_add(out, 0, token_index, cur.to(out.dtype()));
}

Tensor run_experts_locally(const ExpertRouting& r, const std::vector<Module*>& experts, const std::string& where,
                           std::vector<int64_t>* tokens_per_expert, int64_t* dropped) {
  const Tensor& x = r.x;
  // Routing reads the selected experts on the host: a split token DTensor (a plan that shards the
  // batch but does not say how experts run) has no such list on one rank.
  MT_CHECK(!r.selected.is_distributed() || r.selected.dist_spec()->is_replicated(),
           "{}: the tokens are split over the mesh ({}) but the layer's experts have no dispatch: a plan for an MoE "
           "model needs a `dispatch` entry for its MoE layers (e.g. `dispatch model\\.layers\\.\\d+\\."
           "block_sparse_moe experts ep=all_to_all`, as in plans/mixtral_ep.plan; docs/moe.md)",
           where, r.selected.dist_spec()->placements_str());
  MT_CHECK(x.dim() == 2 && r.selected.dim() == 2 && r.selected.size(0) == x.size(0),
           "{}: routing of x {} with selected experts {}", where, x.desc(), r.selected.desc());
  const int64_t N = x.size(0), H = x.size(1), k = r.selected.size(1);
  const auto E = static_cast<int64_t>(experts.size());
  ExpertLists l = expert_lists(r.selected.to_vector<int64_t>(), N, k, E, where);
  if (tokens_per_expert) {
    tokens_per_expert->clear();
    for (const auto& t : l.tokens) tokens_per_expert->push_back(static_cast<int64_t>(t.size()));
  }
  // Capacity: each expert's first C rows in slot-major order (one rank holds the whole batch).
  const int64_t cap = expert_capacity(r.capacity_factor, N, k, E);
  const std::vector<int64_t> kept = capacity_keep(rows_per_slot(l, k), 1, E, k, cap, dropped);
  keep_rows(l, k, kept.data());
  Tensor flat_weights = r.weights.reshape(Shape{N * k});
  Tensor out = zeros(Shape{N, H}, x.options().with_grad(false));
  for (int64_t e = 0; e < E; ++e) {
    const auto& tok = l.tokens[static_cast<size_t>(e)];
    if (tok.empty()) continue;  // transformers skips experts that got no token
    Tensor tix = expert_index(tok, x.device());
    Tensor cur = (*experts[static_cast<size_t>(e)])(index_select(x, 0, tix));
    out = add_expert_terms(out, cur, tix, expert_index(l.slots[static_cast<size_t>(e)], x.device()), flat_weights);
  }
  return r.input.defined() ? out.view(r.input.shape()) : out;
}

Tensor MoeModule::run_experts(const ExpertRouting& routing) {
  std::vector<Module*> experts = expert_modules();
  const std::string where = "MoE layer '" + path() + "'";
  ExpertRouting r = routing;
  // Capacity drops rows in training only: in eval mode (validation, eval, generate) every routed
  // row is computed, so that a cached decode step (one token) and a full forward agree.
  r.capacity_factor = is_training() ? capacity_factor_ : 0;
  if (!dispatcher_) return run_experts_locally(r, experts, where, &tokens_per_expert_, &dropped_);
  Tensor out = dispatcher_->run(r, experts, where);
  tokens_per_expert_ = dispatcher_->last_tokens_per_expert();
  dropped_ = dispatcher_->last_dropped();
  return out;
}

}  // namespace mt
