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

// Header of an activation: [ndim, is_dtensor, dtype, nplacements, local shape (8), global shape (8),
// (kind, dim) per placement (8 x 2)].
constexpr int64_t kMaxActDims = 8;
constexpr int64_t kHeader = 4 + 2 * kMaxActDims + 2 * kMaxActDims;
// Tags: 4 per (micro-batch, receiving global chunk): header, activation, gradient.
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

Tensor PipelineRunner::recv_activation(int peer, int tag, Tensor* leaf) {
  Tensor h = empty(Shape{kHeader}, DType::kI64);
  comm_.recv(h, peer, tag + kHeaderTag);
  std::vector<int64_t> v = h.to_vector<int64_t>();
  const int64_t nd = v[0];
  Shape local, global;
  for (int64_t i = 0; i < nd; ++i) {
    local.push_back(v[static_cast<size_t>(4 + i)]);
    global.push_back(v[static_cast<size_t>(4 + kMaxActDims + i)]);
  }
  Tensor x = empty(local, TensorOptions(static_cast<DType>(v[2])).with_device(device_));
  comm_.recv(x, peer, tag + kActTag);
  x.requires_grad_(true);
  *leaf = x;
  if (v[1] == 0) return x;
  Placements ps;
  for (int64_t i = 0; i < v[3]; ++i)
    ps.push_back(decode_placement(v[static_cast<size_t>(4 + 2 * kMaxActDims + 2 * i)],
                                  v[static_cast<size_t>(4 + 2 * kMaxActDims + 2 * i + 1)]));
  return from_local(x, stage_mesh_, ps, global);
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
  std::map<std::pair<int64_t, int64_t>, Tensor> inputs, outputs;  // per (micro-batch, chunk), until its backward
  for (const PipelineAction& a : pipeline_schedule(schedule_, p, stage_, step.micros, V)) {
    const int64_t m = a.micro, v = a.chunk, c = global(v);
    if (a.forward) {
      Tensor leaf;
      Tensor x = takes_input(v) ? step.input(m) : recv_activation(stage_of(c - 1), tag(m, c), &leaf);
      const auto t0 = Clock::now();
      Tensor y = step.forward(m, v, x);
      stats_.compute_s += since(t0);
      if (!makes_loss(v)) {
        const Tensor local = y.is_distributed() ? to_local(y.detach()) : y.detach();
        MT_CHECK(local.dim() <= kMaxActDims, "pipeline: activation of {} dims (at most {})", local.dim(), kMaxActDims);
        std::vector<int64_t> hv(static_cast<size_t>(kHeader), 0);
        hv[0] = local.dim();
        hv[1] = y.is_distributed() ? 1 : 0;
        hv[2] = static_cast<int64_t>(local.dtype());
        for (int i = 0; i < local.dim(); ++i) {
          hv[static_cast<size_t>(4 + i)] = local.size(i);
          hv[static_cast<size_t>(4 + kMaxActDims + i)] =
              y.is_distributed() ? dtensor_spec(y, "pipeline").global_shape()[static_cast<size_t>(i)] : local.size(i);
        }
        if (y.is_distributed()) {
          const Placements& ps = dtensor_spec(y, "pipeline").placements();
          hv[3] = static_cast<int64_t>(ps.size());
          for (size_t i = 0; i < ps.size(); ++i) {
            hv[4 + 2 * kMaxActDims + 2 * i] = encode_placement(ps[i]);
            hv[4 + 2 * kMaxActDims + 2 * i + 1] = ps[i].dim();
          }
        }
        send(from_vector<int64_t>(hv, Shape{kHeader}), stage_of(c + 1), tag(m, c + 1) + kHeaderTag);
        send(local, stage_of(c + 1), tag(m, c + 1) + kActTag);
        stats_.messages += 1;
        stats_.bytes += local.numel() * dtype_size(local.dtype());
      }
      if (step.forward_only) continue;
      if (!takes_input(v)) inputs[{m, v}] = leaf;
      outputs[{m, v}] = y;
    } else {
      if (step.forward_only) continue;
      Tensor y = outputs.at({m, v});
      outputs.erase({m, v});
      Tensor g = makes_loss(v) ? Tensor() : recv_like(y, stage_of(c + 1), tag(m, c) + kGradTag);
      if (step.before_backward) step.before_backward(m);
      const auto t0 = Clock::now();
      y.backward(g);
      stats_.compute_s += since(t0);
      if (!takes_input(v)) {
        // The received local tensor is the leaf (from_local's input): its gradient is local.
        Tensor gx = inputs.at({m, v}).grad();
        inputs.erase({m, v});
        MT_CHECK(gx.defined(), "pipeline stage {}: micro-batch {}: the input got no gradient", stage_, m);
        send(gx, stage_of(c - 1), tag(m, c - 1) + kGradTag);
        stats_.messages += 1;
        stats_.bytes += gx.numel() * dtype_size(gx.dtype());
      }
    }
  }
  wait_sends();
  stats_.total_s = since(t_run);
}

}  // namespace mt
