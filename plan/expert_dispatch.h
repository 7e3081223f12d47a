// Expert parallelism with a token all-to-all (docs/moe.md). A plan entry
//   dispatch  model\.layers\.\d+\.block_sparse_moe  experts  ep=all_to_all
// installs an AllToAllDispatcher on each matched MoE layer (tensor/moe.h). The layer's tokens are
// split over `ep` (the batch is sharded there); each rank routes only its own tokens, sends every
// routed (token, slot) row to the ep rank that owns its expert (one all-to-all-v), runs the
// experts it owns on the rows it received, sends the outputs back the same way, and sums them per
// token with the routing weights in expert order, as one device does. Dropless by default; with a
// capacity factor each expert keeps the rows one device would keep (ExpertRouting). The experts' parameters are whole on their owner (plan `owner(K)` placements) and
// the owner runs them on their local tensors, so their gradients are complete there (no reduction
// over ep). The backward is the same two exchanges in reverse (mesh/exchange.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "runtime/shape.h"
#include "tensor/moe.h"

namespace mt {

// Per-expert token counts of the last forward over the whole ep group (after the exchange):
// min / max and total routed rows, for the step log.
struct ExpertLoad {
  std::vector<int64_t> tokens;  // per expert, summed over the ep group (dropped rows included)
  int64_t dropped = 0;          // rows the capacity dropped: over the ep group, or the whole batch when
                                // other mesh dims split the tokens too (the capacity is the batch's then)
  int64_t rows_sent = 0;        // rows this rank sent to other ranks (bytes = rows x H x dtype)
};

class AllToAllDispatcher : public ExpertDispatcher {
 public:
  // `owners[e]`: the coordinate along mesh dim `dim` that holds expert e whole.
  AllToAllDispatcher(DeviceMesh mesh, int dim, std::vector<int64_t> owners);
  Tensor run(const ExpertRouting& routing, const std::vector<Module*>& experts, const std::string& where) override;
  std::string describe() const override;
  std::vector<int64_t> last_tokens_per_expert() const override { return load_.tokens; }
  int64_t last_dropped() const override { return load_.dropped; }
  const ExpertLoad& last_load() const { return load_; }

 private:
  DeviceMesh mesh_;
  int dim_;
  std::vector<int64_t> owners_;
  ExpertLoad load_;
};

// The owner of each expert of `layer` along mesh dim `dim`, from the storage placements of the
// experts' parameters (`placements_of(path)`, paths from the model root): every parameter of an
// expert must be whole on one coordinate of `dim` (empty on the others) and replicated on every
// other mesh dim, and all of an expert's parameters on the same coordinate. Errors name `where`
// (the plan entry), the parameter and its placements.
std::vector<int64_t> expert_owners(MoeModule& layer, const Shape& mesh_shape, const Shape& coord, int dim,
                                   const std::function<const Placements&(const std::string&)>& placements_of,
                                   const std::string& where);

}  // namespace mt
