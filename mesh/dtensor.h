// DTensor core (docs/dtensor.md): a Tensor whose impl carries a DTensorSpec (mesh, one placement
// per mesh dim, global shape) and whose storage is this rank's local shard. Specs are interned:
// equal live specs are the same pointer, so two tensors' specs compare as pointers. A spec no
// tensor or cache holds is freed (a run whose shapes vary does not grow); its id() is never
// reused, so caches that outlive it key on the id, not the address.
// Ops on DTensors dispatch through sharding rules (mesh/dispatch.cpp, docs/sharding.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "runtime/shape.h"
#include "tensor/dist_spec.h"
#include "tensor/tensor.h"

namespace mt {

class DTensorSpec : public DistSpec, public std::enable_shared_from_this<DTensorSpec> {
 public:
  DTensorSpec(DeviceMesh mesh, Placements placements, Shape global_shape)
      : mesh_(std::move(mesh)), placements_(std::move(placements)), global_shape_(global_shape) {}
  const DeviceMesh& mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  const Shape& global_shape() const override { return global_shape_; }
  // Unique over the process's life (an address may be reused once the spec is freed).
  uint64_t id() const { return id_; }
  std::string placements_str() const override;
  bool is_replicated() const override;
  bool has_partial() const override;
  std::shared_ptr<const DistSpec> grad_spec() const override;
  // Local shape on this rank (local_layout at the mesh coordinates).
  Shape local_shape() const;
  // "DTensorSpec(DeviceMesh([2, 2], [\"a\", \"b\"]), [S(0), R], [5, 3])"
  std::string str() const override;

 private:
  DeviceMesh mesh_;
  Placements placements_;
  Shape global_shape_;
  std::shared_ptr<const DTensorSpec> grad_;  // set by intern_spec when Partial; else this spec
  uint64_t id_ = 0;                          // set by intern_spec
  friend std::shared_ptr<const DTensorSpec> intern_spec(const DeviceMesh&, const Placements&, const Shape&);
};

// The one live spec for (mesh, placements, global shape): equal arguments give the same pointer
// while any holder of it lives (the table holds specs weakly).
// Meshes are equal when they print the same and have the same world ranks. Thread-safe.
// Checks that placements has one entry per mesh dim and that split dims exist.
std::shared_ptr<const DTensorSpec> intern_spec(const DeviceMesh& mesh, const Placements& placements,
                                               const Shape& global_shape);
// How many interned specs are alive now (tests: a run whose shapes vary keeps this bounded).
size_t live_spec_count();

// The spec of a DTensor; throws naming `op` when `t` is not one.
const DTensorSpec& dtensor_spec(const Tensor& t, const char* op);

// Every rank passes the same global tensor; the result holds this rank's shard (local_shard:
// Partial(sum) puts the value on coordinate 0 and zeros elsewhere). Not recorded by autograd:
// the result is a fresh leaf (call requires_grad_() on it).
Tensor distribute_tensor(const Tensor& global, const DeviceMesh& mesh, const Placements& placements);

// Wraps this rank's local tensor (shares storage); its shape must be the local shape of
// global_shape under placements at this rank. Differentiable: the gradient is the local tensor of
// the incoming DTensor gradient redistributed to `placements` (Partial mapped to Replicate).
Tensor from_local(const Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                  const Shape& global_shape);

// The local shard as a plain tensor sharing storage. Differentiable: the plain local gradient
// becomes a DTensor gradient with the spec of `dt`.
Tensor to_local(const Tensor& dt);
// The same with the gradient's placements given (PyTorch's `to_local(grad_placements=...)`): a
// replicated mesh dim may be P(sum) when each rank's use of the local tensor saw only its part of
// the data there (an expert run on a data-parallel rank's own tokens); the other dims must be the
// DTensor's own (Partial ones as Replicate). Empty: as to_local(dt).
Tensor to_local(const Tensor& dt, const Placements& grad_placements);

// Redistributes to Replicate on every mesh dim and returns the plain global tensor. Collective.
Tensor full_tensor(const Tensor& dt);

// Every DTensor replaced by its full tensor (detached), plain tensors kept: what a save needs, e.g.
// write_hf_checkpoint(dir, cfg, full_tensors(hf_state(model, cfg))) writes the same files as the
// single-device model. Collective: every rank calls it with the same names in the same order
// (and may then write on rank 0 only).
std::vector<std::pair<std::string, Tensor>> full_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors);

// The value of a one-element tensor, DTensor (gathered or reduced first: collective) or not, e.g. a
// loss under any plan.
double full_item(const Tensor& t);

// Changes the placements (redistribute_local, collective over the mesh dims that change).
// Differentiable: the gradient arrives as a DTensor (any placements) and is redistributed to the
// source placements with Partial mapped to Replicate (docs/dtensor.md, "Gradients").
Tensor redistribute(const Tensor& dt, const Placements& dst);

}  // namespace mt
