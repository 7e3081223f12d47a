// One stage's share of a pipeline step (pipeline_run.h).
#include "plan/pipeline_run.h"

#include <chrono>
#include <map>

#include "mesh/dtensor.h"
#include "plan/pipeline.h"
#include "runtime/error.h"

namespace mt {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Header of each tensor a chunk sends: [ndim, is_dtensor, dtype, nplacements, requires_grad, count
// (of the tensors sent, in the first header), local shape (8), global shape (8), (kind, dim) per
// placement (8 x 2)].
constexpr int64_t kMaxActDims = 8, kHeadFields = 6;
constexpr int64_t kHeader = kHeadFields + 2 * kMaxActDims + 2 * kMaxActDims;
static_assert(kHeader == PipelineRunner::kHeaderElements);
constexpr int64_t kMaxSent = 16;  // tensors a chunk sends (a sanity bound on a received count)
// Tags: 4 per (micro-batch, receiving global chunk): header, activation, gradient. The tensors of
// one chunk's output share them, sent and received in order.
constexpr int kHeaderTag = 0, kActTag = 1, kGradTag = 2;

// Placement kinds in the header: 0 R, 1 S(dim), 2 P(sum), 3 ZS(dim) (context parallelism's
// zigzag split of the sequence), 1000 + groups IS(dim, groups).
constexpr int64_t kZigzag = 3, kInterleaved = 1000;
constexpr char kCannotCross[] = "pipeline: an activation with placement {} cannot cross stages (R, S(d), P(sum), IS and ZS can)";

int64_t encode_placement(const Placement& p) {
  switch (p.kind()) {
    case PlacementKind::kReplicate: return 0;
    case PlacementKind::kShard: return 1;
    case PlacementKind::kPartial:
      MT_CHECK(p.reduce_op() == PartialOp::kSum, kCannotCross, p.str());
      return 2;
    case PlacementKind::kInterleavedShard:
      if (p.mirrored()) {
        MT_CHECK(p.groups() == 2, kCannotCross, p.str());
        return kZigzag;
      }
      return kInterleaved + p.groups();
    default:
      MT_FAIL(kCannotCross, p.str());
  }
}

Placement decode_placement(int64_t kind, int64_t dim) {
  if (kind == 0) return Placement::replicate();
  if (kind == 1) return Placement::shard(static_cast<int>(dim));
  if (kind == kZigzag) return Placement::zigzag_shard(static_cast<int>(dim));
  if (kind > kInterleaved) return Placement::interleaved_shard(static_cast<int>(dim), kind - kInterleaved);
  return Placement::partial();
}

}  // namespace

PipelineRunner::PipelineRunner(const DeviceMesh& mesh, const std::string& dim, const DeviceMesh& stage_mesh,
                               PipelineScheduleKind schedule, Device device, int64_t virtual_stages)
    : stage_mesh_(stage_mesh), comm_(mesh.comm(dim)), schedule_(schedule), device_(device), virtual_(virtual_stages) {
  stages_ = mesh.size(dim);
  stage_ = mesh.coordinate(dim);
}

void PipelineRunner::send(const Tensor& t, int peer, int tag) {
  Tensor c = t.contiguous();
  pending_.emplace_back(comm_.send_async(c, peer, tag), c);
}

void PipelineRunner::wait_sends() {
  for (auto& [w, t] : pending_) w.wait();
  pending_.clear();
}

void PipelineRunner::send_activations(const std::vector<Tensor>& ys, int peer, int tag) {
  MT_CHECK(!ys.empty() && static_cast<int64_t>(ys.size()) <= kMaxSent,
           "pipeline stage {}: a chunk sends 1 to {} tensors, got {}", stage_, kMaxSent, ys.size());
  for (size_t k = 0; k < ys.size(); ++k) {
    const Tensor& y = ys[k];
    MT_CHECK(y.defined(), "pipeline stage {}: output {} of the chunk is undefined", stage_, k);
    const Tensor local = y.is_distributed() ? to_local(y.detach()) : y.detach();
    MT_CHECK(local.dim() <= kMaxActDims, "pipeline: activation of {} dims (at most {})", local.dim(), kMaxActDims);
    std::vector<int64_t> hv(static_cast<size_t>(kHeader), 0);
    hv[0] = local.dim();
    hv[1] = y.is_distributed() ? 1 : 0;
    hv[2] = static_cast<int64_t>(local.dtype());
    hv[4] = y.requires_grad() ? 1 : 0;
    hv[5] = static_cast<int64_t>(ys.size());
    for (int i = 0; i < local.dim(); ++i) {
      hv[static_cast<size_t>(kHeadFields + i)] = local.size(i);
      hv[static_cast<size_t>(kHeadFields + kMaxActDims + i)] =
          y.is_distributed() ? dtensor_spec(y, "pipeline").global_shape()[static_cast<size_t>(i)] : local.size(i);
    }
    if (y.is_distributed()) {
      const Placements& ps = dtensor_spec(y, "pipeline").placements();
      hv[3] = static_cast<int64_t>(ps.size());
      for (size_t i = 0; i < ps.size(); ++i) {
        hv[kHeadFields + 2 * kMaxActDims + 2 * i] = encode_placement(ps[i]);
        hv[kHeadFields + 2 * kMaxActDims + 2 * i + 1] = ps[i].dim();
      }
    }
    send(from_vector<int64_t>(hv, Shape{kHeader}), peer, tag + kHeaderTag);
    send(local, peer, tag + kActTag);
    stats_.messages += 1;
    stats_.bytes += local.numel() * dtype_size(local.dtype());
  }
}

std::vector<Tensor> PipelineRunner::recv_activations(int peer, int tag, std::vector<Tensor>* leaves) {
  std::vector<Tensor> out;
  leaves->clear();
  for (int64_t k = 0, count = 1; k < count; ++k) {
    Tensor h = empty(Shape{kHeader}, DType::kI64);
    comm_.recv(h, peer, tag + kHeaderTag);
    std::vector<int64_t> v = h.to_vector<int64_t>();
    if (k == 0) {
      count = v[5];
      MT_CHECK(count >= 1 && count <= kMaxSent, "pipeline stage {}: stage {} announced {} tensors (1 to {})", stage_,
               peer, count, kMaxSent);
    }
    const int64_t nd = v[0];
    Shape local, global;
    for (int64_t i = 0; i < nd; ++i) {
      local.push_back(v[static_cast<size_t>(kHeadFields + i)]);
      global.push_back(v[static_cast<size_t>(kHeadFields + kMaxActDims + i)]);
    }
    Tensor x = empty(local, TensorOptions(static_cast<DType>(v[2])).with_device(device_));
    comm_.recv(x, peer, tag + kActTag);
    // The activation's gradient always goes back (as before carried tensors existed); a carried
    // tensor's where the sender's tensor requires one.
    if (k == 0 || v[4] != 0) x.requires_grad_(true);
    leaves->push_back(x);
    if (v[1] == 0) {
      out.push_back(x);
      continue;
    }
    Placements ps;
    for (int64_t i = 0; i < v[3]; ++i)
      ps.push_back(decode_placement(v[static_cast<size_t>(kHeadFields + 2 * kMaxActDims + 2 * i)],
                                    v[static_cast<size_t>(kHeadFields + 2 * kMaxActDims + 2 * i + 1)]));
    out.push_back(from_local(x, stage_mesh_, ps, global));
  }
  return out;
}

Tensor PipelineRunner::recv_like(const Tensor& like, int peer, int tag) {
  const Tensor local = like.is_distributed() ? to_local(like.detach()) : like;
  Tensor g = empty(local.shape(), TensorOptions(local.dtype()).with_device(local.device()));
  comm_.recv(g, peer, tag);
  if (!like.is_distributed()) return g;
  const DTensorSpec& spec = dtensor_spec(like, "pipeline backward");
  // A Partial activation's gradient is Replicate (as from_local's backward makes it).
  Placements ps = spec.placements();
  for (auto& p : ps)
    if (p.is_partial()) p = Placement::replicate();
  return from_local(g, spec.mesh(), ps, spec.global_shape());
}

void PipelineRunner::run(const Step& step) {
  const auto t_run = Clock::now();
  stats_ = {};
  const int64_t p = stages_, V = virtual_, chunks = p * V;
  // Global chunk of this stage's chunk v; the stage and the tag base of a message to chunk c.
  auto global = [&](int64_t v) { return v * p + stage_; };
  auto stage_of = [&](int64_t c) { return static_cast<int>(c % p); };
  auto tag = [&](int64_t m, int64_t c) { return static_cast<int>((m * chunks + c) * 4); };
  // Per (micro-batch, chunk), until its backward: the received leaves and the chunk's outputs.
  std::map<std::pair<int64_t, int64_t>, std::vector<Tensor>> inputs, outputs;
  for (const PipelineAction& a : pipeline_schedule(schedule_, p, stage_, step.micros, V)) {
    const int64_t m = a.micro, v = a.chunk, c = global(v);
    if (a.forward) {
      std::vector<Tensor> leaves;
      const std::vector<Tensor> x = takes_input(v) ? std::vector<Tensor>{step.input(m)}
                                                   : recv_activations(stage_of(c - 1), tag(m, c), &leaves);
      const auto t0 = Clock::now();
      std::vector<Tensor> y = step.forward(m, v, x);
      stats_.compute_s += since(t0);
      MT_CHECK(!y.empty() && (!makes_loss(v) || y.size() == 1),
               "pipeline stage {}: the chunk that makes the loss returns the loss alone, got {} tensors", stage_,
               y.size());
      if (!makes_loss(v)) send_activations(y, stage_of(c + 1), tag(m, c + 1));
      if (step.forward_only) continue;
      if (!takes_input(v)) inputs[{m, v}] = std::move(leaves);
      outputs[{m, v}] = std::move(y);
    } else {
      if (step.forward_only) continue;
      std::vector<Tensor> y = std::move(outputs.at({m, v}));
      outputs.erase({m, v});
      // The gradients of what this chunk sent, in the order sent: the activation's, then those of
      // the carried tensors that require one.
      std::vector<Tensor> roots{y[0]}, grads{makes_loss(v) ? Tensor() : recv_like(y[0], stage_of(c + 1), tag(m, c) + kGradTag)};
      for (size_t k = 1; k < y.size(); ++k) {
        if (!y[k].requires_grad()) continue;
        roots.push_back(y[k]);
        grads.push_back(recv_like(y[k], stage_of(c + 1), tag(m, c) + kGradTag));
      }
      if (step.before_backward) step.before_backward(m);
      const auto t0 = Clock::now();
      if (roots.size() == 1)
        y[0].backward(grads[0]);
      else
        backward(roots, grads);
      stats_.compute_s += since(t0);
      if (!takes_input(v)) {
        // The received local tensors are the leaves (from_local's input): their gradients are local.
        const std::vector<Tensor> leaves = std::move(inputs.at({m, v}));
        inputs.erase({m, v});
        for (size_t k = 0; k < leaves.size(); ++k) {
          if (!leaves[k].requires_grad()) continue;
          Tensor gx = leaves[k].grad();
          if (k == 0)
            MT_CHECK(gx.defined(), "pipeline stage {}: micro-batch {}: the input got no gradient", stage_, m);
          else if (!gx.defined())  // a carried tensor this chunk did not use
            gx = zeros(leaves[k].shape(), leaves[k].options().with_grad(false));
          send(gx, stage_of(c - 1), tag(m, c - 1) + kGradTag);
          stats_.messages += 1;
          stats_.bytes += gx.numel() * dtype_size(gx.dtype());
        }
      }
    }
  }
  wait_sends();
  stats_.total_s = since(t_run);
}

}  // namespace mt
