// Redistribute: change how a DTensor's global tensor is held by a mesh (docs/placements.md,
// "Redistribute"). Given this rank's local tensor under placements `src`, returns its local
// tensor under `dst`, communicating along the mesh dims that change. Collective over the groups
// of those mesh dims: every rank of the mesh calls it with the same arguments.
#pragma once

#include "mesh/communicator.h"
#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "runtime/shape.h"
#include "tensor/tensor.h"

namespace mt {

// `local` must have the local shape of `global_shape` under `src` at this rank's coordinates
// (any strides, any dtype the collectives accept; Partial(avg) needs a floating dtype). The
// result is a fresh contiguous tensor, except when src == dst where `local` itself is returned.
// Partial(sum) destinations hold the value on coordinate 0 of that mesh dim and zeros elsewhere;
// Partial(avg|max|min) destinations hold it on every rank (as local_shard does).
// Supported: R, S(d) (uneven and empty chunks), P(sum|avg|max|min), IS(d,g), RS(d,units,b).
// Not recorded by autograd.
Tensor redistribute_local(const Tensor& local, const Shape& global_shape, const Placements& src,
                          const Placements& dst, const DeviceMesh& mesh);

// The collective reduction that resolves a Partial placement's op.
CommReduceOp comm_reduce_op(PartialOp op);

}  // namespace mt
