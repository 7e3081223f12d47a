// estimate_rank: a warm-up and a measured training step on meta tensors over a simulated mesh,
// with byte, collective and kernel-cost counting (estimate.h, docs/estimate.md).
#include "plan/estimate.h"

#include <optional>

#include "kernels/registry.h"
#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/shard_layout.h"
#include "plan/grad_reducer.h"
#include "plan/parallelize.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/meta_memory.h"

namespace mt {
namespace {

int64_t bytes_of(const Shape& s, DType dt) { return s.numel() * static_cast<int64_t>(dtype_size(dt)); }

void add_scaled(CollectiveCounts& into, const CollectiveCounts& part, int64_t times) {
  for (const auto& [k, t] : part) {
    CollectiveTally& d = into[k];
    d.calls += t.calls * times;
    d.bytes += t.bytes * times;
    d.group_size = std::max(d.group_size, t.group_size);
  }
}

void add_scaled(KernelCost& into, const KernelCost& part, int64_t times) {
  const double x = static_cast<double>(times);
  into.matmul_flops += part.matmul_flops * x;
  for (int b = 0; b < kGemmDimBuckets; ++b) into.matmul_flops_by_dim[b] += part.matmul_flops_by_dim[b] * x;
  into.matmul_bytes += part.matmul_bytes * x;
  into.other_bytes += part.other_bytes * x;
  into.optimizer_bytes += part.optimizer_bytes * x;
  into.kernels += part.kernels * times;
  into.matmuls += part.matmuls * times;
  into.dist_ops += part.dist_ops * times;
  into.redistributes += part.redistributes * times;
  into.blocking_collectives += part.blocking_collectives * times;
}

}  // namespace

int64_t rank_of(const PlanMesh& mesh, const std::vector<int64_t>& coord) {
  int64_t r = 0;
  for (int d = 0; d < mesh.ndim(); ++d) r = r * mesh.shape[d] + coord[static_cast<size_t>(d)];
  return r;
}

std::vector<std::vector<int64_t>> estimate_coordinates(const PlanMesh& mesh, int64_t all_up_to) {
  std::vector<std::vector<int64_t>> out;
  const int64_t n = mesh.size();
  for (int64_t r = 0; r < n; ++r) {
    if (n > all_up_to && r != 0 && r != n - 1) continue;
    std::vector<int64_t> c(static_cast<size_t>(mesh.ndim()));
    int64_t rem = r;
    for (int d = mesh.ndim() - 1; d >= 0; --d) {
      c[static_cast<size_t>(d)] = rem % mesh.shape[d];
      rem /= mesh.shape[d];
    }
    out.push_back(std::move(c));
  }
  return out;
}

bool same_local_shapes(const RankEstimate& est, const PlanMesh& mesh, const std::vector<int64_t>& other) {
  Shape a, b;
  for (int64_t v : est.coord) a.push_back(v);
  for (int64_t v : other) b.push_back(v);
  for (const auto& [shape, ps] : est.layouts)
    if (local_layout(shape, ps, mesh.shape, a).local_shape != local_layout(shape, ps, mesh.shape, b).local_shape)
      return false;
  return true;
}

namespace {
// Muon::uses_muon (optim/muon.h): 2-D, not an embedding, not the output head.
bool muon_matrix(const std::string& name, const Shape& shape) {
  return shape.size() == 2 && name.find("embed") == std::string::npos && name.find("lm_head") == std::string::npos;
}
}  // namespace

RankEstimate estimate_rank(const EstimateModel& em, const Plan& plan, const PlanMesh& pm,
                           const std::vector<int64_t>& coord, const EstimateOptions& o) {
  MT_CHECK(o.batch >= 1 && o.seq >= 1 && o.accum >= 1, "estimate: batch {}, seq {} and accum {} must be >= 1", o.batch,
           o.seq, o.accum);
  MT_CHECK(o.optimizer == "adamw" || o.optimizer == "adamw8bit" || o.optimizer == "muon",
           "estimate: --optimizer {} is not supported: the estimate models adamw, adamw8bit and muon (docs/estimate.md)",
           o.optimizer);
  const bool eight_bit = o.optimizer == "adamw8bit";
  const bool muon = o.optimizer == "muon";
  int64_t muon_elements = 0;  // local elements of the Muon matrices (their optimizer traffic differs)
  MT_CHECK(o.precision == DType::kF32 || o.precision == DType::kBF16 || o.precision == DType::kF16,
           "estimate: precision {} is not supported (f32, bf16 or f16)", o.precision);
  RankEstimate est;
  est.coord = coord;
  est.rank = rank_of(pm, coord);

  std::shared_ptr<Module> model = em.build_meta();  // outside the counting scope: nothing counted
  MT_CHECK(model != nullptr, "estimate: the model builder returned null");
  DeviceMesh sim = DeviceMesh::simulated(pm.shape, pm.names, coord);
  MetaKernelsGuard meta_kernels;
  MetaMemoryScope bytes;

  Parallelized par = parallelize(*model, plan, sim, Device::meta());  // local shards, counted
  const bool master = o.precision != DType::kF32;
  std::vector<Tensor> state;  // master weights and optimizer moments: alive across steps
  for (auto& [name, p] : model->named_parameters()) {
    const Shape local = p.local_shape();
    est.local_params += local.numel();
    if (master && is_floating(p.dtype())) {  // the parameter becomes 16-bit; an f32 master copy stays
      Tensor cast = empty(local, TensorOptions(o.precision).with_device(Device::meta()));
      p.impl()->storage = cast.impl()->storage;
      p.impl()->dtype = o.precision;
      p.impl()->strides = cast.strides();
      p.impl()->offset = 0;
      state.push_back(empty(local, TensorOptions(DType::kF32).with_device(Device::meta())));
      est.master_bytes += bytes_of(local, DType::kF32);
    }
    est.param_bytes += bytes_of(local, p.dtype());
    est.grad_bytes += bytes_of(local, p.dtype());
    // 8-bit AdamW (optim/adamw8bit.h; plan/ does not see optim/, so its rule is repeated here and
    // tests/optim/test_adamw8bit.cpp checks the two agree): tensors of 4096 elements or more hold
    // two u8 codes per element and an f32 [rows, 2] absmax; smaller ones two f32 moments.
    if (muon && muon_matrix(name, p.shape())) {
      // Muon (optim/muon.h; its rule repeated here as for 8-bit AdamW, and tests/plan/
      // test_estimate.cpp checks the two agree): one f32 momentum buffer per hidden matrix.
      state.push_back(empty(local, TensorOptions(DType::kF32).with_device(Device::meta())));
      est.optimizer_bytes += bytes_of(local, DType::kF32);
      muon_elements += local.numel();
    } else if (eight_bit && p.shape().numel() >= 4096) {
      for (int m = 0; m < 2; ++m) state.push_back(empty(local, TensorOptions(DType::kU8).with_device(Device::meta())));
      const Shape am{local.empty() ? 1 : local[0], 2};
      state.push_back(empty(am, TensorOptions(DType::kF32).with_device(Device::meta())));
      est.optimizer_bytes += 2 * bytes_of(local, DType::kU8) + bytes_of(am, DType::kF32);
    } else {
      for (int m = 0; m < 2; ++m) state.push_back(empty(local, TensorOptions(DType::kF32).with_device(Device::meta())));
      est.optimizer_bytes += 2 * bytes_of(local, DType::kF32);
    }
  }
  for (auto& [name, p] : model->named_parameters())
    est.layouts.emplace_back(p.shape(), dtensor_spec(p, "estimate").placements());
  GradReducerOptions ro;
  ro.bucket_bytes = o.bucket_bytes;
  GradReducer reducer(*model, sim, ro);
  const Placements in_ps = par.input_placements(o.input_module);
  est.layouts.emplace_back(Shape{o.batch, o.seq}, in_ps);
  const TensorOptions ids_opts = TensorOptions(DType::kI64).with_device(Device::meta());

  // One optimizer step: `micro` micro-batches, the last one synchronized, then what the trainer
  // does before the optimizer (16-bit: gradients cast to f32 for the masters), then zero_grad.
  auto step = [&](int64_t micro, const std::function<void()>& after_first) {
    for (int64_t m = 0; m < micro; ++m) {
      reducer.set_sync(m + 1 == micro);
      Tensor ids = distribute_tensor(empty(Shape{o.batch, o.seq}, ids_opts), sim, in_ps);
      Tensor targets = distribute_tensor(empty(Shape{o.batch, o.seq}, ids_opts), sim, in_ps);
      Tensor loss = em.loss(*model, ids, targets);
      loss.backward();
      if (m == 0 && after_first) after_first();
    }
    reducer.finish();
    std::vector<Tensor> master_grads;
    if (master)
      for (auto& [name, p] : model->named_parameters())
        if (p.grad().defined())
          master_grads.push_back(empty(p.local_shape(), TensorOptions(DType::kF32).with_device(Device::meta())));
    master_grads.clear();
    model->zero_grad();
  };

  step(1, nullptr);  // warm-up: the reducer agrees on its bucket layout (first synchronized step)

  est.persistent_bytes = meta_memory_stats().live;
  reset_meta_peak();
  const int64_t micro = std::min<int64_t>(o.accum, 2);  // the rest repeat the first (unsynchronized) one
  CollectiveCounts first_comm;
  KernelCost first_cost;
  {
    CollectiveCountScope comm;
    KernelCostScope cost;
    step(micro, [&] {
      first_comm = CollectiveCountScope::counts();
      first_cost = KernelCostScope::totals();
    });
    est.comm = CollectiveCountScope::counts();
    est.cost = KernelCostScope::totals();
  }
  if (o.accum > micro) {
    add_scaled(est.comm, first_comm, o.accum - micro);
    add_scaled(est.cost, first_cost, o.accum - micro);
  }
  // The optimizer (modelled: the fused AdamW loop reads p, g, m, v and writes p, m, v in f32; a
  // 16-bit model adds the gradient cast and the master-to-model rounding).
  const double n = static_cast<double>(est.local_params);
  // 8-bit AdamW reads p, g (f32) and two u8 codes, writes p and the codes: 14 bytes, not 28.
  // Muon's matrices: p, g and the momentum read, p and the momentum written (20 bytes; the
  // Newton-Schulz GEMMs are not modelled), AdamW for the rest.
  const double adam_n = n - static_cast<double>(muon_elements);
  est.cost.optimizer_bytes += (eight_bit ? 14 : 7 * 4) * adam_n + 5 * 4 * static_cast<double>(muon_elements) +
                          (master ? n * (2 + 4) + n * (4 + 2) : 0);
  est.peak_bytes = meta_memory_stats().peak;
  est.activation_bytes = est.peak_bytes - est.persistent_bytes;
  return est;
}

}  // namespace mt
