// The registries of tensor/grad_destination.h. Keyed by storage address: the registering buffer
// keeps its storage alive while registered and removes itself before letting it go.
#include "tensor/grad_destination.h"

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "tensor/autograd.h"

namespace mt {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<const Storage*, GradDestinationFn> destinations;
  std::unordered_set<const Storage*> lenders;
  std::atomic<size_t> n_destinations{0}, n_lenders{0};  // lock-free "none registered"
};

Registry& registry() {
  static Registry r;
  return r;
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

void set_grad_lender(const Storage* storage, bool on) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (on)
    r.lenders.insert(storage);
  else
    r.lenders.erase(storage);
  r.n_lenders = r.lenders.size();
}

bool lends_grad_views(const Storage* storage) {
  Registry& r = registry();
  if (r.n_lenders.load(std::memory_order_relaxed) == 0 || !storage) return false;
  std::lock_guard lock(r.mu);
  return r.lenders.count(storage) > 0;
}

}  // namespace mt
