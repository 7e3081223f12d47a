// The registries of tensor/grad_destination.h. Keyed by storage address: the registering buffer
// keeps its storage alive while registered and removes itself before letting it go.
#include "tensor/grad_destination.h"

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "kernels/registry.h"
#include "tensor/autograd.h"

namespace mt {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<const Storage*, GradDestinationFn> destinations;
  std::unordered_set<const Storage*> lenders, accumulators;
  std::atomic<size_t> n_destinations{0}, n_lenders{0}, n_accumulators{0};  // lock-free "none registered"
};

Registry& registry() {
  static Registry r;
  return r;
}

// Adds (on) or removes `storage` from one of the registry's sets; the caller holds the lock.
void set_member(std::unordered_set<const Storage*>& set, std::atomic<size_t>& count, const Storage* storage,
                bool on) {
  if (on)
    set.insert(storage);
  else
    set.erase(storage);
  count = set.size();
}

}  // namespace

void set_grad_destination(const Storage* storage, GradDestinationFn fn) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (fn)
    r.destinations[storage] = std::move(fn);
  else
    r.destinations.erase(storage);
  r.n_destinations = r.destinations.size();
}

Tensor grad_destination(const Tensor& weight) {
  Registry& r = registry();
  if (r.n_destinations.load(std::memory_order_relaxed) == 0 || GradMode::enabled()) return Tensor();
  if (!weight.defined() || weight.is_distributed() || !weight.impl()->storage) return Tensor();
  GradDestinationFn fn;
  {
    std::lock_guard lock(r.mu);
    auto it = r.destinations.find(weight.impl()->storage.get());
    if (it == r.destinations.end()) return Tensor();
    fn = it->second;
  }
  Tensor d = fn(weight);
  if (!d.defined()) return d;
  if (d.local_shape() != weight.local_shape() || !d.is_contiguous() || d.dtype() != weight.dtype() ||
      d.device() != weight.device())
    return Tensor();
  return d;
}

void set_grad_accumulator(const Storage* storage, bool on) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  set_member(r.accumulators, r.n_accumulators, storage, on);
}

bool accumulate_grad_in_place(const Tensor& into, const Tensor& g) {
  Registry& r = registry();
  if (r.n_accumulators.load(std::memory_order_relaxed) == 0 || GradMode::enabled()) return false;
  if (!into.defined() || !g.defined() || !into.impl()->storage || !g.impl()->storage) return false;
  const Storage* st = into.impl()->storage.get();
  {
    std::lock_guard lock(r.mu);
    if (!r.accumulators.count(st)) return false;
  }
  const auto& da = into.impl()->dist;
  const auto& db = g.impl()->dist;
  if (into.local_shape() != g.local_shape() || into.dtype() != g.dtype() || into.device() != g.device() ||
      !into.is_contiguous() || g.impl()->storage.get() == st || (da != db && (!da || !db || da->str() != db->str())))
    return false;
  // The local tensors, elementwise: what add() computes on them, written over `into`.
  BinaryParams bp{BinaryOp::kAdd, into.view_info(), g.view_info(), into.view_info()};
  MT_KERNEL(into.device().type, binary, bp);
  bump_version(into);
  return true;
}

void set_grad_lender(const Storage* storage, bool on) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  set_member(r.lenders, r.n_lenders, storage, on);
}

bool lends_grad_views(const Storage* storage) {
  Registry& r = registry();
  if (r.n_lenders.load(std::memory_order_relaxed) == 0 || !storage) return false;
  std::lock_guard lock(r.mu);
  return r.lenders.count(storage) > 0;
}

}  // namespace mt
