// DeviceMesh: the world's ranks arranged as an N-D array with named dims, in row-major order
// (world rank = row-major index of its coordinates). mesh["tp"] is this rank's 1-D group along
// "tp"; mesh.flatten({"dp", "cp"}) is one dim made of several (its group: the ranks that differ
// only in those dims, ordered row-major among them), for fused reductions.
//
// A mesh and all its sub-meshes share one communicator cache keyed by the set of root dims: the
// communicator of a group is created once, on first use, and reused. Creating one is collective
// over the members of that group only (MPI_Comm_create_group), so every member must ask for it.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "mesh/communicator.h"
#include "runtime/shape.h"

namespace mt {

class DeviceMesh {
 public:
  // shape.numel() must equal world().size(); names are distinct and non-empty.
  DeviceMesh(Shape shape, std::vector<std::string> names);
  // The mesh as rank `coords` of a world that is not running would see it, without
  // communicators (comm() throws): for checking a plan on meta tensors for any world size
  // (plan/check.h, `meshtrain plan`). Shapes, coordinates and ranks are those of that rank.
  static DeviceMesh simulated(Shape shape, std::vector<std::string> names, std::vector<int64_t> coords);
  bool is_simulated() const;

  int ndim() const { return static_cast<int>(names_.size()); }
  Shape shape() const;
  const std::vector<std::string>& names() const { return names_; }
  int64_t size() const;  // ranks in this (sub-)mesh
  int64_t size(int dim) const;
  int64_t size(const std::string& name) const;
  int dim_index(const std::string& name) const;  // throws naming the mesh's dims

  // This rank's coordinates in this (sub-)mesh, and its row-major index among the members.
  int64_t coordinate(int dim) const;
  int64_t coordinate(const std::string& name) const;
  std::vector<int64_t> coordinates() const;
  // The same as a Shape: what local_layout, local_shard and fill_random_sharded take.
  Shape coordinate_shape() const;
  int64_t rank() const;
  // World ranks of this (sub-)mesh's members, row-major: rank() indexes this list.
  std::vector<int> world_ranks() const;
  // A short key naming world_ranks(): equal for equal rank lists (a process-wide id per distinct
  // list), computed once per (sub-)mesh. DTensor spec keys and same-mesh checks use it: with a
  // 10,000-rank mesh, building and comparing the rank lists per op was the cost of an estimate.
  const std::string& world_ranks_key() const;

  // 1-D sub-mesh of this rank's group along `name`.
  DeviceMesh operator[](const std::string& name) const;
  // Sub-mesh keeping the named dims (in mesh order), e.g. {"dp", "tp"} of a 3-D mesh.
  DeviceMesh select(const std::vector<std::string>& names) const;
  // 1-D mesh made of the named dims (in mesh order); its dim is named "dp_cp".
  DeviceMesh flatten(const std::vector<std::string>& names) const;

  // Communicator over all dims of this (sub-)mesh (for mesh["tp"]: the tp group).
  Communicator comm() const;
  Communicator comm(int dim) const;
  Communicator comm(const std::string& name) const;

  // The root mesh dims that make up `dim`, in mesh order, comma separated ("dp"; "dp,cp" for a
  // flattened dim): the name collective counts give a group (mesh/collective_count.h).
  std::string dim_label(int dim) const;

  // "DeviceMesh([2, 2], [\"dp\", \"tp\"])"
  std::string str() const;

 private:
  struct Root;
  DeviceMesh(std::shared_ptr<Root> root, std::vector<std::vector<int>> dims,
             std::vector<std::string> names);
  Communicator comm_for(const std::vector<int>& root_dims) const;
  std::string label_of(std::vector<int> root_dims) const;
  std::vector<int> root_dims_of(const std::vector<std::string>& names, const char* op) const;

  std::shared_ptr<Root> root_;
  std::vector<std::vector<int>> dims_;  // root dims that make up each dim of this mesh
  std::vector<std::string> names_;
};

}  // namespace mt

template <>
struct fmt::formatter<mt::DeviceMesh> : fmt::formatter<std::string_view> {
  auto format(const mt::DeviceMesh& m, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(m.str(), ctx);
  }
};
