// DistSpec: the opaque distributed spec a TensorImpl may carry (DESIGN.md "One Tensor type, local
// or distributed"). tensor/ knows nothing of meshes or placements: mesh/dtensor.h defines the one
// implementation, DTensorSpec. A tensor whose impl has a spec is a DTensor whose storage is its
// local shard; a tensor without one is a plain local tensor (the only cost: one null pointer).
// What tensor/ needs to know of a spec is here: its global shape (Tensor::shape() of a DTensor is
// the global shape; the impl's sizes are the local ones) and the few facts autograd and in-place
// updates check.
#pragma once

#include <memory>
#include <string>

#include "runtime/shape.h"

namespace mt {

struct DistSpec {
  virtual ~DistSpec() = default;
  virtual std::string str() const = 0;
  virtual std::string placements_str() const = 0;  // "[S(0), R]"
  virtual const Shape& global_shape() const = 0;
  virtual bool is_replicated() const = 0;  // Replicate on every mesh dim
  virtual bool has_partial() const = 0;
  // The spec a gradient of this tensor is brought to: Partial mapped to Replicate (interned).
  virtual std::shared_ptr<const DistSpec> grad_spec() const = 0;
};

}  // namespace mt
