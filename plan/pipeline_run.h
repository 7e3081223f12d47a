// Pipeline parallelism, the running half (docs/pipeline.md): one optimizer step's forwards and
// backwards of one stage, in the order pipeline_schedule() gives, with the activations and their
// gradients sent point to point to the neighbouring stages over the pipeline dim's communicator
// (MPI on host, the mesh's backend on devices). Sends are asynchronous (posted, waited for at the
// end of the step), receives block, and every message carries its micro-batch in its tag, so no
// schedule can deadlock. A distributed activation travels as its local shard plus a small header
// (shapes, placements, dtype); the receiver wraps it as the same DTensor on its own stage mesh
// (the stage meshes are alike), so the other plan entries compose. A chunk may send more than its
// activation (Step::forward): each tensor travels the same way, in order, on the same tags (MPI
// and NCCL both match one sender's messages in the order sent).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mesh/communicator.h"
#include "mesh/device_mesh.h"
#include "plan/plan.h"
#include "runtime/device.h"
#include "tensor/tensor.h"

namespace mt {

struct PipelineStats {
  double total_s = 0;    // wall time of run()
  double compute_s = 0;  // inside the forward and backward callbacks (the rest is waiting and sending)
  int64_t messages = 0;  // tensors sent (headers not counted)
  int64_t bytes = 0;     // bytes of those tensors
  double bubble() const { return total_s > 0 ? 1.0 - compute_s / total_s : 0; }
};

class PipelineRunner {
 public:
  // The i64 elements of the header each sent tensor is preceded by (for the estimate's counts).
  static constexpr int64_t kHeaderElements = 38;

  // `mesh`: the plan's whole mesh; `dim`: the pipeline dim; `stage_mesh`: mesh without `dim` as
  // this rank sees it (DeviceMesh::select of the other dims). Received tensors go to `device`.
  // `virtual_stages`: chunks per stage under interleaved 1F1B (chunk v of stage s is global chunk
  // v * stages + s; its output goes to stage s + 1, or from the last stage to stage 0's chunk v + 1).
  PipelineRunner(const DeviceMesh& mesh, const std::string& dim, const DeviceMesh& stage_mesh,
                 PipelineScheduleKind schedule, Device device = Device::cpu(), int64_t virtual_stages = 1);

  int64_t stages() const { return stages_; }
  int64_t stage() const { return stage_; }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ + 1 == stages_; }
  int64_t virtual_stages() const { return virtual_; }
  // Whether chunk v of this stage takes the model's input / computes the loss.
  bool takes_input(int64_t v) const { return is_first() && v == 0; }
  bool makes_loss(int64_t v) const { return is_last() && v + 1 == virtual_; }
  PipelineScheduleKind schedule() const { return schedule_; }
  void set_schedule(PipelineScheduleKind s) { schedule_ = s; }
  Communicator& comm() { return comm_; }  // over the pipeline dim (group rank = stage)

  struct Step {
    int64_t micros = 1;
    // The first stage's input of micro-batch m (placed on the stage mesh).
    std::function<Tensor(int64_t m)> input;
    // Runs this stage's modules (of its chunk v) on what the chunk before sent (x[0]: its
    // activation, or input(m) on the first chunk; x[1..]: what else it sent) and returns what to
    // send on the same way: [0] the activation, then any tensors carried to the next chunk
    // beside it (e.g. the MoE router statistics summed over the layers so far), whose gradients
    // come back where they require one. Where makes_loss(v): the (scaled) scalar loss to run
    // backward from, alone.
    std::function<std::vector<Tensor>(int64_t m, int64_t v, const std::vector<Tensor>& x)> forward;
    // Called before micro-batch m's backward (e.g. GradReducer::set_sync on the last one).
    std::function<void(int64_t m)> before_backward;
    // Forwards only (`meshtrain eval`): the schedule's backwards are skipped and nothing is kept
    // for them.
    bool forward_only = false;
  };
  // One step: every forward and backward of this stage. Collective over the pipeline dim.
  void run(const Step& step);
  const PipelineStats& stats() const { return stats_; }

 private:
  void send(const Tensor& t, int peer, int tag);
  void send_activations(const std::vector<Tensor>& y, int peer, int tag);
  std::vector<Tensor> recv_activations(int peer, int tag, std::vector<Tensor>* leaves);
  Tensor recv_like(const Tensor& like, int peer, int tag);
  void wait_sends();

  DeviceMesh stage_mesh_;
  Communicator comm_;
  int64_t stages_ = 1, stage_ = 0;
  PipelineScheduleKind schedule_;
  Device device_;
  int64_t virtual_ = 1;
  PipelineStats stats_;
  std::vector<std::pair<Work, Tensor>> pending_;  // sends in flight and what they read
};

}  // namespace mt
