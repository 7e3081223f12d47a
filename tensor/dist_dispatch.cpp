#include "tensor/dist_dispatch.h"

#include "tensor/dist_replicate.h"

#include "runtime/error.h"
#include "tensor/dist_spec.h"

namespace mt {

namespace {
DistHandler g_handler = nullptr;
DistReplicateHandler g_replicate = nullptr;
}  // namespace

void set_dist_handler(DistHandler h) { g_handler = h; }
void set_dist_replicate_handler(DistReplicateHandler h) { g_replicate = h; }

Tensor dist_replicate(const Tensor& t) {
  if (!t.is_distributed()) return t;
  MT_CHECK(g_replicate, "dist_replicate: a DTensor but no DTensor support is installed");
  return g_replicate(t);
}

std::vector<Tensor> dist_dispatch(const DistOp& op, const std::vector<Tensor>& inputs, DistLocalFn local) {
  MT_CHECK(g_handler, "{}: a DTensor input but no DTensor dispatch is installed", op.name);
  return g_handler(op, inputs, local);
}

bool any_dist(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    if (t.is_distributed()) return true;
  return false;
}

void check_inplace_dist(const Tensor& self, const Tensor& other, const char* op) {
  const DistSpec* a = self.dist_spec();
  const DistSpec* b = other.defined() ? other.dist_spec() : nullptr;
  if (!a && !b) return;
  if (a && !b && other.defined() && other.numel() == 1 && !a->has_partial()) return;
  MT_CHECK(a && b && a == b,
           "{}: in-place update of {} {} from {} {}: both must be DTensors with the same placements "
           "and shape (redistribute one first)",
           op, self.desc(), a ? a->placements_str() : "(local)", other.desc(),
           b ? b->placements_str() : "(local)");
}

}  // namespace mt
