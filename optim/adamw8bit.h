// 8-bit AdamW: AdamW (optim/adamw.h, the same formulas and options) whose moments are stored as
// 8-bit codes, block-wise quantized against a per-block f32 absmax (kernels/quant8.h: a signed
// square-root code for m, a fourth-root code for v). A block is kBlockRows = 32 consecutive rows
// (slices of tensor dim 0) of a tensor with dim >= 2, or kBlock1d = 256 consecutive elements of a
// 1-D tensor; the last block may be shorter. Tensors with fewer than kMinNumel = 4096 elements
// (norm gains, small biases) keep f32 moments (AdamW's exact update). Each step dequantizes a
// block, updates p, m, v in f32, and requantizes against the block's new absmax: blocks are
// independent, so a shard that holds whole blocks (FSDP with rows(32), docs/fsdp.md) updates
// exactly as the whole tensor would, with no communication. A shard that cuts blocks (split by
// columns, e.g. tensor parallelism's Shard(1), or rows off the block edges, e.g. FSDP rows(1))
// shares those blocks with other ranks: its update runs in two phases around one all-reduce
// (max) per step and mesh of every such block's new absmax (finish_step), and the result is
// still the whole tensor's, bit for bit. Formulas, memory and the state_dict keys:
// docs/optim.md; the sharded cases: docs/fsdp.md.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/params.h"
#include "mesh/communicator.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"

namespace mt {

class AdamW8bit : public Optimizer {
 public:
  static constexpr int64_t kBlockRows = 32;   // rows per block (dim >= 2)
  static constexpr int64_t kBlock1d = 256;    // elements per block (1-D)
  static constexpr int64_t kMinNumel = 4096;  // smaller tensors keep f32 moments

  // Parameters must be contiguous f32 (DTensor parameters: local shards) on a device with the
  // `adamw8bit` kernel (CPU, CUDA). A DTensor
  // parameter must not be Partial, and each rank's shard must be one rectangle of the tensor (a
  // range of rows, whole or cut by columns: Shard, RaggedShard at row granularity); otherwise the
  // constructor throws naming the parameter and its placements. Every rank of a parameter's mesh
  // must step it together (DTensor gradients do): shared blocks meet in a collective.
  AdamW8bit(std::vector<ParamGroup> groups, const AdamWOptions& opts);
  const AdamWOptions& options() const { return opts_; }

  // Whether a tensor of this (global) shape gets 8-bit moments, and its rows per block.
  static bool quantized(const Shape& shape) { return shape.numel() >= kMinNumel; }
  static int64_t block_rows(const Shape& shape) { return shape.size() == 1 ? kBlock1d : kBlockRows; }

  // This rank's bytes of optimizer state (codes, absmax, f32 moments of small tensors).
  int64_t state_bytes() const;
  // Parameters whose blocks this optimizer shares between ranks (two-phase update), in order.
  std::vector<std::string> shared_block_params() const;

  // "step", then for each parameter in group order either "exp_avg_q.<name>" (u8 codes, the
  // parameter's shape), "exp_avg_sq_q.<name>" (u8) and "absmax.<name>" (f32 [rows, 2]: m's and v's
  // block absmax, repeated on every row of a block), or, for small tensors, "exp_avg.<name>" and
  // "exp_avg_sq.<name>" (f32); then "step.<name>". DTensor parameters give DTensor state with the
  // parameter's placements. Resuming from it is bit-exact.
  NamedTensors state_dict() const override;
  void load_state_dict(const NamedTensors& state) override;

 protected:
  void update(Slot& slot, const Tensor& grad, double lr, double weight_decay) override;
  void finish_step(bool apply) override;

 private:
  struct State {
    bool quantized = false;
    Tensor m, v;     // u8 codes, or f32 moments
    Tensor absmax;   // f32 [rows, 2] (quantized only)
    int64_t row_numel = 1, block_rows = 1;  // of the local shard
    // Blocks shared with other ranks: this shard's first row in the tensor, its first block, its
    // blocks and the tensor's, and the ranks of the parameter's mesh, which reduce the absmax.
    bool shared = false;
    int64_t row_offset = 0, first_block = 0, local_blocks = 0, global_blocks = 0;
    Communicator comm;
    std::string mesh_key;  // the mesh's ranks (DeviceMesh::world_ranks_key)
  };
  // A shared-block update between its phases: the kApply call to make once the blocks' absmax
  // (block_absmax, this shard's part after kMax) is reduced, and the tensors it reads and writes.
  struct Pending {
    const State* state = nullptr;
    AdamW8bitParams call;
    Tensor block_absmax;
    Tensor param, grad, m, v, absmax;  // what `call` points into, alive until it runs
  };
  NamedTensors own_state() const;
  AdamWOptions opts_;
  std::vector<std::string> names_;  // group order
  std::unordered_map<std::string, State> state_;
  std::vector<Pending> pending_;
};

}  // namespace mt
