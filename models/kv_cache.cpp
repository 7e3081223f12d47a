// The decoding cache: preallocated per-layer key/value buffers written in place.
#include "models/kv_cache.h"

#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

namespace mt {

KvCache::KvCache(int64_t capacity) : capacity_(capacity) {
  MT_CHECK(capacity >= 1, "KvCache: capacity must be at least 1 position, got {}", capacity);
}

std::pair<Tensor, Tensor> KvCache::append(int64_t layer, const Tensor& k, const Tensor& v) {
  MT_CHECK(layer >= 0, "KvCache: layer {} must be >= 0", layer);
  MT_CHECK(k.dim() == 4 && v.dim() == 4 && k.size(0) == v.size(0) && k.size(1) == v.size(1) &&
               k.size(2) == v.size(2),
           "KvCache: layer {}: expected k and v [B, kv heads, T, D] with equal B, heads and T, got k {} and v {}",
           layer, k.desc(), v.desc());
  const int64_t T = k.size(2);
  MT_CHECK(length_ + T <= capacity_,
           "KvCache: layer {}: {} new positions after the {} held pass the cache's capacity of {} positions", layer, T,
           length_, capacity_);
  if (static_cast<size_t>(layer) >= layers_.size()) layers_.resize(static_cast<size_t>(layer) + 1);
  auto& [kb, vb] = layers_[static_cast<size_t>(layer)];
  const Shape kshape{k.size(0), k.size(1), capacity_, k.size(3)}, vshape{v.size(0), v.size(1), capacity_, v.size(3)};
  if (!kb.defined() || kb.shape() != kshape || vb.shape() != vshape || kb.dtype() != k.dtype() ||
      kb.device() != k.device()) {
    MT_CHECK(length_ == 0,
             "KvCache: layer {}: k {} and v {} do not match the cache's buffers {} and {} of the {} positions held",
             layer, k.desc(), v.desc(), kb.defined() ? kb.desc() : std::string("(none)"),
             vb.defined() ? vb.desc() : std::string("(none)"), length_);
    kb = empty(kshape, TensorOptions(k.dtype()).with_device(k.device()));
    vb = empty(vshape, TensorOptions(v.dtype()).with_device(v.device()));
  }
  NoGradGuard no_grad;
  Tensor kd = kb.narrow(2, length_, T), vd = vb.narrow(2, length_, T);
  kd.copy_(k);
  vd.copy_(v);
  return {kb.narrow(2, 0, length_ + T), vb.narrow(2, 0, length_ + T)};
}

void KvCache::advance(int64_t T) {
  MT_CHECK(T >= 0 && length_ + T <= capacity_, "KvCache: cannot advance {} positions past {} of capacity {}", T,
           length_, capacity_);
  length_ += T;
}

}  // namespace mt
