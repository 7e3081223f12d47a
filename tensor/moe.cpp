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
  const double c = std::ceil(capacity_factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts));
  return std::max<int64_t>(1, static_cast<int64_t>(c));
}

int64_t keep_rows(ExpertLists& l, int64_t top_k, const std::vector<std::vector<int64_t>>& keep) {
  int64_t dropped = 0;
  for (size_t e = 0; e < l.tokens.size(); ++e) {
    std::vector<int64_t> tokens, slots, seen(static_cast<size_t>(top_k), 0);
    for (size_t i = 0; i < l.tokens[e].size(); ++i) {
      const auto j = static_cast<size_t>(l.slots[e][i] % top_k);
      if (seen[j]++ < keep[e][j]) {
        tokens.push_back(l.tokens[e][i]);
        slots.push_back(l.slots[e][i]);
      } else {
        ++dropped;
      }
    }
    l.tokens[e] = std::move(tokens);
    l.slots[e] = std::move(slots);
  }
  return dropped;
}

Tensor run_experts_locally(const ExpertRouting& r, const std::vector<Module*>& experts, const std::string& where,
                           std::vector<int64_t>* tokens_per_expert, int64_t* dropped) {
  const Tensor& x = r.x;
  MT_CHECK(x.dim() == 2 && r.selected.dim() == 2 && r.selected.size(0) == x.size(0),
           "{}: routing of x {} with selected experts {}", where, x.desc(), r.selected.desc());
  const int64_t N = x.size(0), H = x.size(1), k = r.selected.size(1);
  const auto E = static_cast<int64_t>(experts.size());
  ExpertLists l = expert_lists(r.selected.to_vector<int64_t>(), N, k, E, where);
  if (tokens_per_expert) {
    tokens_per_expert->clear();
    for (const auto& t : l.tokens) tokens_per_expert->push_back(static_cast<int64_t>(t.size()));
  }
  // Capacity: each expert's first C rows in slot-major order.
  const int64_t cap = expert_capacity(r.capacity_factor, N, k, E);
  std::vector<std::vector<int64_t>> keep(static_cast<size_t>(E), std::vector<int64_t>(static_cast<size_t>(k)));
  for (size_t e = 0; e < l.tokens.size(); ++e) {
    int64_t left = cap;
    std::vector<int64_t> per_slot(static_cast<size_t>(k), 0);
    for (int64_t s : l.slots[e]) ++per_slot[static_cast<size_t>(s % k)];
    for (int64_t j = 0; j < k; ++j) {
      keep[e][static_cast<size_t>(j)] = std::min(left, per_slot[static_cast<size_t>(j)]);
      left -= keep[e][static_cast<size_t>(j)];
    }
  }
  const int64_t n_dropped = keep_rows(l, k, keep);
  if (dropped) *dropped = n_dropped;
  Tensor flat_weights = r.weights.reshape(Shape{N * k});
  Tensor out = zeros(Shape{N, H}, x.options().with_grad(false));
  for (int64_t e = 0; e < E; ++e) {
    const auto& tok = l.tokens[static_cast<size_t>(e)];
    if (tok.empty()) continue;  // transformers skips experts that got no token
    const auto n = static_cast<int64_t>(tok.size());
    Tensor tix = from_vector<int64_t>(tok, Shape{n}), wix = from_vector<int64_t>(l.slots[static_cast<size_t>(e)], Shape{n});
    if (tix.device() != x.device()) {
      tix = tix.to(x.device());
      wix = wix.to(x.device());
    }
    Tensor cur = (*experts[static_cast<size_t>(e)])(index_select(x, 0, tix));
    cur = mul(cur, index_select(flat_weights, 0, wix).unsqueeze(1));
    out = index_add(out, 0, tix, cur.to(x.dtype()));
  }
  return r.input.defined() ? out.view(r.input.shape()) : out;
}

Tensor MoeModule::run_experts(const ExpertRouting& routing) {
  std::vector<Module*> experts = expert_modules();
  const std::string where = "MoE layer '" + path() + "'";
  ExpertRouting r = routing;
  r.capacity_factor = capacity_factor_;
  if (!dispatcher_) return run_experts_locally(r, experts, where, &tokens_per_expert_, &dropped_);
  Tensor out = dispatcher_->run(r, experts, where);
  tokens_per_expert_ = dispatcher_->last_tokens_per_expert();
  dropped_ = dispatcher_->last_dropped();
  return out;
}

}  // namespace mt
