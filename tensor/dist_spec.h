// DistSpec: the opaque distributed spec a TensorImpl may carry (DESIGN.md "One Tensor type, local
// or distributed"). tensor/ knows nothing of meshes or placements: mesh/dtensor.h defines the one
// implementation, DTensorSpec. A tensor whose impl has a spec is a DTensor whose storage is its
// local shard; a tensor without one is a plain local tensor (the only cost: one null pointer).
#pragma once

#include <string>

namespace mt {

struct DistSpec {
  virtual ~DistSpec() = default;
  virtual std::string str() const = 0;
};

}  // namespace mt
