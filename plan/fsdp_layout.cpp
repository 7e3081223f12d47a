// The FSDP layout planner (fsdp_layout.h, docs/fsdp.md).
//
// For a fixed tensor order and shard size S, placing each tensor at the leftmost offset where it
// fits is optimal: which offsets a tensor may start at depends only on S and the tensor, so a
// smaller end of the previous tensor never leaves fewer choices (induction over the order). The
// search is therefore over S and the order. Feasibility is not monotone in S (a shard size that
// is a multiple of a large block can fit where a slightly larger one cannot), so small ranges are
// scanned exhaustively and large ones binary-searched between the lower bound and shard sizes
// known to fit (multiples of the least common multiple of the largest blocks).
#include "plan/fsdp_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>

#include "runtime/error.h"

namespace mt {
namespace {

constexpr int64_t kNone = -1;
constexpr int64_t kExhaustiveSteps = 4096;  // shard sizes tried one by one below this many

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// lcm(a, b), or 0 when it would overflow (the caller then treats it as "no such size").
int64_t lcm_or_zero(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  const int64_t g = std::gcd(a, b);
  const int64_t q = a / g;
  if (q > std::numeric_limits<int64_t>::max() / b) return 0;
  return q * b;
}

struct Item {
  int64_t n = 0;     // elements
  int64_t b = 0;     // elements per block
  int64_t step = 0;  // start offsets of a crossing tensor differ by lcm(b, tensor_align); 0: none
};

// The leftmost start >= from at which a tensor fits in shards of S elements (its blocks whole on
// one shard, the start a multiple of `ta`, the end inside `buffer`), or kNone. S is a multiple of
// ta, so every shard boundary is an allowed start.
int64_t leftmost_start(int64_t from, const Item& t, int64_t ta, int64_t S, int64_t buffer) {
  int64_t o = round_up(from, ta);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int64_t boundary = (o / S + 1) * S;  // the first shard boundary after o
    if (o + t.n <= boundary) return o + t.n <= buffer ? o : kNone;
    // Crossing `boundary`: it must fall on a block edge, so the start is boundary - j * step.
    const int64_t o2 = t.step > 0 ? boundary - t.step * ((boundary - o) / t.step) : boundary;
    // One crossing is enough; more need every boundary on a block edge (S a multiple of b).
    if (o2 < boundary && (S % t.b == 0 || o2 + t.n <= boundary + S)) return o2 + t.n <= buffer ? o2 : kNone;
    o = boundary;  // nothing before the boundary fits; from it on, the same cases, one shard later
  }
  return kNone;
}

// Whether `order` fits in group * S elements; the starts (by position in `order`) when it does.
bool fits(const std::vector<Item>& items, const std::vector<int64_t>& order, int64_t ta, int64_t S,
          int64_t group, std::vector<int64_t>* starts) {
  if (S > std::numeric_limits<int64_t>::max() / group) return false;
  const int64_t buffer = S * group;
  int64_t end = 0;
  if (starts) starts->assign(order.size(), 0);
  for (size_t i = 0; i < order.size(); ++i) {
    const Item& t = items[static_cast<size_t>(order[i])];
    if (t.b > S) return false;
    const int64_t o = leftmost_start(end, t, ta, S, buffer);
    if (o == kNone) return false;
    if (starts) (*starts)[i] = o;
    end = o + t.n;
  }
  return true;
}

// The smallest shard size (a multiple of A, >= lb) at which `order` fits, or kNone.
int64_t smallest_shard(const std::vector<Item>& items, const std::vector<int64_t>& order, int64_t ta,
                       int64_t A, int64_t lb, int64_t group) {
  auto ok = [&](int64_t S) { return fits(items, order, ta, S, group, nullptr); };
  if (ok(lb)) return lb;
  // Sizes known to fit: S a multiple of every block of at least some size (then each tensor
  // only rounds its start up to its step). Try the largest blocks first.
  std::vector<int64_t> blocks;
  for (const Item& t : items) blocks.push_back(t.b);
  std::sort(blocks.begin(), blocks.end(), std::greater<>());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  int64_t best = kNone;
  int64_t L = A;
  for (int64_t b : blocks) {
    L = lcm_or_zero(L, b);
    if (L == 0 || L > std::numeric_limits<int64_t>::max() / 4 - lb) {
      L = 0;
      break;
    }
    const int64_t S = round_up(lb, L);
    if ((best == kNone || S < best) && ok(S)) best = S;
  }
  if (L != 0) {  // every block divides L: guaranteed to fit with room for each start's rounding
    int64_t extra = 0;
    for (const Item& t : items) extra += t.step > 0 ? t.step : t.b;
    int64_t need = 0;
    for (const Item& t : items) need += t.n;
    const int64_t S = round_up(std::max<int64_t>(lb, (need + extra + group - 1) / group), L);
    if ((best == kNone || S < best) && ok(S)) best = S;
  }
  for (int64_t S = lb * 2; best == kNone && S > 0 && S < std::numeric_limits<int64_t>::max() / 4; S *= 2)
    if (ok(round_up(S, A))) best = round_up(S, A);
  if (best == kNone) return kNone;
  if ((best - lb) / A <= kExhaustiveSteps) {
    for (int64_t S = lb + A; S < best; S += A)
      if (ok(S)) return S;
    return best;
  }
  int64_t lo = lb, hi = best;  // lo does not fit, hi does
  while (hi - lo > A) {
    const int64_t mid = lo + ((hi - lo) / 2) / A * A;
    if (mid == lo) break;
    (ok(mid) ? hi : lo) = mid;
  }
  // Non-monotone: a few sizes below the found one may still fit.
  for (int64_t S = std::max(lb + A, hi - 64 * A); S < hi; S += A)
    if (ok(S)) return S;
  return hi;
}

void check_options(const LayoutOptions& o) {
  MT_CHECK(o.group >= 1, "FSDP layout: the group size must be positive, got {}", o.group);
  MT_CHECK(o.shard_align >= 1 && o.tensor_align >= 1,
           "FSDP layout: alignments must be positive, got shard {} and tensor {}", o.shard_align, o.tensor_align);
}

void check_tensor(const LayoutTensor& t) {
  MT_CHECK(t.rows >= 1 && t.cols >= 1, "FSDP layout: tensor '{}' has shape [{}, {}]; rows and columns must be positive",
           t.name, t.rows, t.cols);
  MT_CHECK(t.block_rows >= 1 && t.rows % t.block_rows == 0,
           "FSDP layout: tensor '{}' of [{}, {}]: a block of {} rows does not divide its {} rows", t.name, t.rows,
           t.cols, t.block_rows, t.rows);
}

// The shard alignment, a multiple of the tensor alignment (so every boundary is a valid start).
int64_t shard_alignment(const LayoutOptions& o) {
  const int64_t A = lcm_or_zero(o.shard_align, o.tensor_align);
  MT_CHECK(A > 0, "FSDP layout: alignments {} and {} are too large", o.shard_align, o.tensor_align);
  return A;
}

// The smallest shard size no layout can beat: at least the even split and the largest block, a
// multiple of A, and a multiple of every block of a tensor longer than two shards (such a tensor
// crosses two shard boundaries wherever it starts, and both fall on its block edges only if the
// shard size is a multiple of its block). The set of those tensors shrinks as the size grows, so
// each range of sizes with the same set is tried in turn.
int64_t lower_bound_shard(const std::vector<Item>& items, int64_t A, int64_t group) {
  int64_t payload = 0, largest_block = 1;
  for (const Item& t : items) {
    payload += t.n;
    largest_block = std::max(largest_block, t.b);
  }
  const int64_t base = round_up(std::max((payload + group - 1) / group, largest_block), A);
  std::vector<const Item*> by_length;
  for (const Item& t : items) by_length.push_back(&t);
  std::sort(by_length.begin(), by_length.end(), [](const Item* a, const Item* b) { return a->n < b->n; });
  // Sizes S < n / 2 (n > 2S) make a tensor "long". From the longest tensors down, the range of S
  // in which exactly the tensors from position k on are long is [ceil(n_{k-1} / 2), ceil(n_k / 2)).
  const size_t m = by_length.size();
  for (size_t k = 0; k <= m; ++k) {  // k: the first long tensor (m: none)
    const int64_t lo = std::max(base, k == 0 ? int64_t{0} : (by_length[k - 1]->n + 1) / 2);
    const int64_t hi = k == m ? std::numeric_limits<int64_t>::max() : (by_length[k]->n + 1) / 2;
    if (lo >= hi) continue;
    int64_t L = A;
    for (size_t j = k; j < m && L != 0; ++j) L = lcm_or_zero(L, by_length[j]->b);
    if (L == 0 || L > std::numeric_limits<int64_t>::max() / 4 - lo) continue;
    const int64_t S = round_up(lo, L);
    if (S < hi) return S;
  }
  return base;
}

}  // namespace

double FsdpLayout::padding_ratio() const {
  return payload > 0 ? static_cast<double>(padding()) / static_cast<double>(payload) : 0.0;
}

FsdpLayout plan_fsdp_layout(const std::vector<LayoutTensor>& tensors, const LayoutOptions& options) {
  check_options(options);
  const int64_t A = shard_alignment(options);
  const int64_t ta = options.tensor_align;
  std::vector<Item> items;
  int64_t payload = 0;
  for (const LayoutTensor& t : tensors) {
    check_tensor(t);
    items.push_back({t.numel(), t.block_numel(), lcm_or_zero(t.block_numel(), ta)});
    payload += t.numel();
  }
  FsdpLayout layout;
  layout.group = options.group;
  layout.payload = payload;
  layout.lower_bound = lower_bound_shard(items, A, options.group);
  if (tensors.empty()) {
    layout.shard_size = 0;
    return layout;
  }

  // Orders tried: the given one, then (when allowed) largest blocks first and largest tensors first.
  std::vector<std::vector<int64_t>> orders;
  std::vector<int64_t> given(tensors.size());
  std::iota(given.begin(), given.end(), 0);
  orders.push_back(given);
  if (options.order == TensorOrder::kAny) {
    std::vector<int64_t> by_block = given, by_size = given;
    std::stable_sort(by_block.begin(), by_block.end(), [&](int64_t a, int64_t b) {
      return std::pair(items[a].b, items[a].n) > std::pair(items[b].b, items[b].n);
    });
    std::stable_sort(by_size.begin(), by_size.end(), [&](int64_t a, int64_t b) { return items[a].n > items[b].n; });
    orders.push_back(by_block);
    orders.push_back(by_size);
  }
  int64_t best_S = kNone;
  size_t best_order = 0;
  for (size_t k = 0; k < orders.size(); ++k) {
    const int64_t S = smallest_shard(items, orders[k], ta, A, layout.lower_bound, options.group);
    if (S != kNone && (best_S == kNone || S < best_S)) {
      best_S = S;
      best_order = k;
    }
  }
  MT_CHECK(best_S != kNone, "FSDP layout: no shard size fits these {} tensors over {} ranks", tensors.size(),
           options.group);
  std::vector<int64_t> starts;
  fits(items, orders[best_order], ta, best_S, options.group, &starts);
  layout.shard_size = best_S;
  layout.order = best_order == 0 ? TensorOrder::kGiven : TensorOrder::kAny;
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t idx = orders[best_order][i];
    const Item& t = items[static_cast<size_t>(idx)];
    PlacedTensor p;
    p.index = idx;
    p.offset = starts[i];
    p.blocks.assign(static_cast<size_t>(options.group), 0);
    const int64_t first = p.offset / best_S, last = (p.offset + t.n - 1) / best_S;
    for (int64_t r = first; r <= last; ++r) {
      const int64_t lo = std::max(p.offset, r * best_S), hi = std::min(p.offset + t.n, (r + 1) * best_S);
      p.blocks[static_cast<size_t>(r)] = (hi - lo) / t.b;
    }
    layout.tensors.push_back(std::move(p));
  }
  return layout;
}

void check_fsdp_layout(const std::vector<LayoutTensor>& tensors, const LayoutOptions& options,
                       const FsdpLayout& layout) {
  check_options(options);
  const int64_t A = shard_alignment(options);
  const int64_t S = layout.shard_size, P = layout.group;
  MT_CHECK(P == options.group, "FSDP layout: planned for {} ranks, checked for {}", P, options.group);
  MT_CHECK(tensors.empty() || (S > 0 && S % A == 0), "FSDP layout: shard size {} is not a positive multiple of {}",
           S, A);
  MT_CHECK(layout.tensors.size() == tensors.size(), "FSDP layout: {} tensors placed, {} given",
           layout.tensors.size(), tensors.size());
  std::set<int64_t> seen;
  int64_t end = 0;
  for (const PlacedTensor& p : layout.tensors) {
    MT_CHECK(p.index >= 0 && p.index < static_cast<int64_t>(tensors.size()) && seen.insert(p.index).second,
             "FSDP layout: tensor index {} is out of range or placed twice", p.index);
    const LayoutTensor& t = tensors[static_cast<size_t>(p.index)];
    check_tensor(t);
    const int64_t n = t.numel(), b = t.block_numel();
    MT_CHECK(p.offset >= end, "FSDP layout: tensor '{}' at offset {} overlaps the one before it (which ends at {})",
             t.name, p.offset, end);
    MT_CHECK(p.offset % options.tensor_align == 0, "FSDP layout: tensor '{}' starts at {}, not a multiple of {}",
             t.name, p.offset, options.tensor_align);
    MT_CHECK(p.offset + n <= S * P, "FSDP layout: tensor '{}' ends at {}, past the buffer of {} elements", t.name,
             p.offset + n, S * P);
    MT_CHECK(p.blocks.size() == static_cast<size_t>(P), "FSDP layout: tensor '{}' has blocks for {} ranks, not {}",
             t.name, p.blocks.size(), P);
    for (int64_t r = 0; r < P; ++r) {
      const int64_t lo = std::max(p.offset, r * S), hi = std::min(p.offset + n, (r + 1) * S);
      const int64_t on_rank = std::max<int64_t>(0, hi - lo);
      MT_CHECK(on_rank % b == 0 && (on_rank == 0 || (lo - p.offset) % b == 0),
               "FSDP layout: tensor '{}' (blocks of {} rows) is cut inside a block at the start of rank {}'s shard",
               t.name, t.block_rows, r);
      MT_CHECK(p.blocks[static_cast<size_t>(r)] == on_rank / b,
               "FSDP layout: tensor '{}' records {} blocks on rank {}, its offset puts {} there", t.name,
               p.blocks[static_cast<size_t>(r)], r, on_rank / b);
    }
    end = p.offset + n;
  }
}

std::string describe_fsdp_layout(const std::vector<LayoutTensor>& tensors, const FsdpLayout& layout) {
  std::string out = fmt::format(
      "{} tensors over {} ranks: shard {} elements (lower bound {}), buffer {}, payload {}, padding {} ({:.2f}%){}\n",
      layout.tensors.size(), layout.group, layout.shard_size, layout.lower_bound, layout.buffer_size(), layout.payload,
      layout.padding(), 100 * layout.padding_ratio(), layout.order == TensorOrder::kAny ? ", reordered" : "");
  for (const PlacedTensor& p : layout.tensors) {
    const LayoutTensor& t = tensors[static_cast<size_t>(p.index)];
    int64_t first = 0, last = static_cast<int64_t>(p.blocks.size()) - 1;
    while (first < last && p.blocks[static_cast<size_t>(first)] == 0) ++first;
    while (last > first && p.blocks[static_cast<size_t>(last)] == 0) --last;
    std::string blocks;
    for (int64_t r = first; r <= last; ++r) blocks += fmt::format("{}{}", r > first ? "," : "", p.blocks[static_cast<size_t>(r)]);
    out += fmt::format("  {} [{}, {}] block {} rows: offset {}, ranks {}..{} hold [{}] blocks\n", t.name, t.rows,
                       t.cols, t.block_rows, p.offset, first, last, blocks);
  }
  return out;
}

}  // namespace mt
