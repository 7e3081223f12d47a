// The FSDP layout planner (fsdp_layout.h, docs/fsdp.md).
//
// For a fixed tensor order and shard size S, placing each tensor at the leftmost offset where it
// fits is optimal: which offsets a tensor may start at depends only on S and the tensor, so a
// smaller end of the previous tensor never leaves fewer choices (induction over the order). The
// search is therefore over S and the order. A tensor longer than two shards forces S to a
// multiple of its block, which splits the sizes into ranges with one such multiple each
// (shard_ranges); the first candidate of the first range is the lower bound. Feasibility is not
// monotone in S (a multiple of a large block can fit where a slightly larger size cannot), so
// ranges are scanned candidate by candidate while that is cheap, and binary-searched otherwise
// between their first candidate and a size known to fit.
#include "plan/fsdp_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "runtime/error.h"

namespace mt {
namespace {

constexpr int64_t kNone = -1;

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

// Shard sizes S with the same set of "long" tensors (n > 2S: wherever such a tensor starts it
// crosses two shard boundaries, and both fall on its block edges only if S is a multiple of its
// block): every S in [lo, hi) that can fit is a multiple of L. The set shrinks as S grows, so the
// ranges come in increasing order of S with L dividing the previous range's L.
struct ShardRange {
  int64_t lo = 0, hi = 0, L = 0;
};

std::vector<ShardRange> shard_ranges(const std::vector<Item>& items, int64_t A, int64_t group) {
  int64_t payload = 0, largest_block = 1;
  for (const Item& t : items) {
    payload += t.n;
    largest_block = std::max(largest_block, t.b);
  }
  const int64_t base = round_up(std::max((payload + group - 1) / group, largest_block), A);
  std::vector<size_t> by_length(items.size());
  std::iota(by_length.begin(), by_length.end(), size_t{0});
  std::sort(by_length.begin(), by_length.end(), [&](size_t a, size_t b) { return items[a].n < items[b].n; });
  // Tensor j is long while S < ceil(n_j / 2); from position k of the sorted list on, all are long
  // for S in [ceil(n_{k-1} / 2), ceil(n_k / 2)).
  std::vector<ShardRange> out;
  const size_t m = by_length.size();
  for (size_t k = 0; k <= m; ++k) {
    const int64_t lo = std::max(base, k == 0 ? int64_t{0} : (items[by_length[k - 1]].n + 1) / 2);
    const int64_t hi = k == m ? std::numeric_limits<int64_t>::max() / 4 : (items[by_length[k]].n + 1) / 2;
    if (lo >= hi) continue;
    int64_t L = A;
    for (size_t j = k; j < m && L != 0; ++j) L = lcm_or_zero(L, items[by_length[j]].b);
    if (L == 0 || L > std::numeric_limits<int64_t>::max() / 4 - lo) continue;  // no such size fits
    if (round_up(lo, L) < hi) out.push_back({lo, hi, L});
  }
  return out;
}

// The smallest shard size at which `order` fits, or kNone. Each range's candidates (multiples of
// its L) are tried one by one while that stays cheap (kScanBudget placements in all); a larger
// range is binary-searched between its first candidate and a size known to fit (a multiple of
// the largest blocks' lcm, where each tensor only rounds its start up to its step), then the
// sizes just below the result are tried (feasibility is not monotone in S).
int64_t smallest_shard(const std::vector<Item>& items, const std::vector<int64_t>& order, int64_t ta,
                       const std::vector<ShardRange>& ranges, int64_t group) {
  constexpr int64_t kScanBudget = int64_t{1} << 21;
  auto ok = [&](int64_t S) { return fits(items, order, ta, S, group, nullptr); };
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(items.size()));
  int64_t budget = kScanBudget;
  std::vector<int64_t> blocks;
  for (const Item& t : items) blocks.push_back(t.b);
  std::sort(blocks.begin(), blocks.end(), std::greater<>());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  int64_t need = 0, extra = 0;
  for (const Item& t : items) {
    need += t.n;
    extra += t.step > 0 ? t.step : t.b;
  }
  for (const ShardRange& r : ranges) {
    const int64_t first = round_up(r.lo, r.L);
    const int64_t count = (r.hi - 1 - first) / r.L + 1;
    if (count <= budget / n) {
      budget -= count * n;
      for (int64_t S = first; S < r.hi; S += r.L)
        if (ok(S)) return S;
      continue;
    }
    // Sizes known to fit, or likely to: multiples of L and of the largest blocks.
    int64_t best = kNone;
    int64_t Lb = r.L;
    for (int64_t b : blocks) {
      Lb = lcm_or_zero(Lb, b);
      if (Lb == 0 || Lb > std::numeric_limits<int64_t>::max() / 4 - first) break;
      const int64_t S = round_up(first, Lb);
      if (S < r.hi && (best == kNone || S < best) && ok(S)) best = S;
    }
    if (Lb != 0 && Lb <= std::numeric_limits<int64_t>::max() / 4 - first) {  // every block divides Lb
      const int64_t S = round_up(std::max(first, (need + extra + group - 1) / group), Lb);
      if (S < r.hi && (best == kNone || S < best) && ok(S)) best = S;
    }
    if (best == kNone) continue;
    if (ok(first)) return first;
    int64_t lo = first, hi = best;  // lo does not fit, hi does
    while (hi - lo > r.L) {
      const int64_t mid = lo + ((hi - lo) / 2) / r.L * r.L;
      (ok(mid) ? hi : lo) = mid;
    }
    for (int64_t S = std::max(first + r.L, hi - 64 * r.L); S < hi; S += r.L)
      if (ok(S)) return S;
    return hi;
  }
  return kNone;
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

}  // namespace

int64_t PlacedTensor::blocks_on(int64_t rank) const {
  const int64_t i = rank - first_rank;
  return i >= 0 && i < static_cast<int64_t>(blocks.size()) ? blocks[static_cast<size_t>(i)] : 0;
}

std::vector<int64_t> PlacedTensor::ragged_units(int64_t group) const {
  std::vector<int64_t> units(static_cast<size_t>(group), 0);
  for (int64_t r = 0; r < group; ++r) units[static_cast<size_t>(r)] = blocks_on(r);
  return units;
}

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
  const std::vector<ShardRange> ranges = shard_ranges(items, A, options.group);
  // No layout has a smaller shard size than the first range's first candidate.
  layout.lower_bound = ranges.empty() ? 0 : round_up(ranges.front().lo, ranges.front().L);
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
    const int64_t S = smallest_shard(items, orders[k], ta, ranges, options.group);
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
    p.first_rank = p.offset / best_S;
    const int64_t last = (p.offset + t.n - 1) / best_S;
    for (int64_t r = p.first_rank; r <= last; ++r) {
      const int64_t lo = std::max(p.offset, r * best_S), hi = std::min(p.offset + t.n, (r + 1) * best_S);
      p.blocks.push_back((hi - lo) / t.b);
    }
    layout.tensors.push_back(std::move(p));
  }
  return layout;
}

std::vector<FsdpLayout> plan_fsdp_layouts(const std::vector<std::vector<LayoutTensor>>& units,
                                          const LayoutOptions& options) {
  std::map<std::vector<std::array<int64_t, 3>>, size_t> planned;  // shapes -> index into out
  std::vector<FsdpLayout> out;
  out.reserve(units.size());
  for (const auto& unit : units) {
    std::vector<std::array<int64_t, 3>> key;
    key.reserve(unit.size());
    for (const LayoutTensor& t : unit) key.push_back({t.rows, t.cols, t.block_rows});
    auto [it, fresh] = planned.emplace(std::move(key), out.size());
    out.push_back(fresh ? plan_fsdp_layout(unit, options) : out[it->second]);
  }
  return out;
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
    const int64_t spanned = static_cast<int64_t>(p.blocks.size());
    MT_CHECK(p.first_rank >= 0 && spanned >= 1 && p.first_rank + spanned <= P,
             "FSDP layout: tensor '{}' records blocks on ranks {} to {} of {}", t.name, p.first_rank,
             p.first_rank + spanned - 1, P);
    int64_t recorded = 0;
    for (int64_t b_on : p.blocks) recorded += b_on;
    MT_CHECK(recorded == t.rows / t.block_rows, "FSDP layout: tensor '{}' records {} blocks, it has {}", t.name,
             recorded, t.rows / t.block_rows);
    for (int64_t r = p.offset / S; r <= (p.offset + n - 1) / S; ++r) {
      const int64_t lo = std::max(p.offset, r * S), hi = std::min(p.offset + n, (r + 1) * S);
      const int64_t on_rank = std::max<int64_t>(0, hi - lo);
      MT_CHECK(on_rank % b == 0 && (on_rank == 0 || (lo - p.offset) % b == 0),
               "FSDP layout: tensor '{}' (blocks of {} rows) is cut inside a block at the start of rank {}'s shard",
               t.name, t.block_rows, r);
      MT_CHECK(p.blocks_on(r) == on_rank / b,
               "FSDP layout: tensor '{}' records {} blocks on rank {}, its offset puts {} there", t.name, p.blocks_on(r),
               r, on_rank / b);
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
    out += fmt::format("  {} [{}, {}] block {} rows: offset {}, ranks {}..{} hold [{}] blocks\n", t.name, t.rows,
                       t.cols, t.block_rows, p.offset, p.first_rank,
                       p.first_rank + static_cast<int64_t>(p.blocks.size()) - 1, fmt::join(p.blocks, ","));
  }
  return out;
}

}  // namespace mt
