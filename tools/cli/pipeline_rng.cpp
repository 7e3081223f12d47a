// Generator offsets of the pipeline units (pipeline_rng.h).
#include "tools/cli/pipeline_rng.h"

#include "kernels/registry.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/random.h"

namespace mt::cli {

PipelineRng::PipelineRng(const ModelConfig& config) {
  Generator& g = default_generator();
  const uint64_t keep = g.offset();  // building reserves the init blocks: put the offset back
  {
    InitDeviceGuard meta(Device::meta());
    meta_ = build_causal_lm(config);
  }
  g.set_offset(keep);
  meta_->train();
}

const PipelineRng::Offsets& PipelineRng::at(const Shape& shape) {
  std::vector<int64_t> key(shape.begin(), shape.end());
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  Generator& g = default_generator();
  const uint64_t keep = g.offset();
  g.set_offset(0);
  Offsets o;
  std::vector<HookHandle> probes;
  const auto units = meta_->pipeline_units();
  o.unit_start.assign(units.size(), 0);
  for (size_t i = 0; i < units.size(); ++i)
    probes.push_back(meta_->get_module(units[i].first)->register_forward_pre_hook(
        [&o, i](Module&, std::vector<Tensor>&) { o.unit_start[i] = default_generator().offset(); }));
  try {
    MetaKernelsGuard no_kernels;
    NoGradGuard no_grad;
    (void)(*meta_)(std::vector<Tensor>{empty(shape, TensorOptions(DType::kI64).with_device(Device::meta()))});
  } catch (...) {
    for (auto& h : probes) h.remove();
    g.set_offset(keep);
    throw;
  }
  for (auto& h : probes) h.remove();
  o.forward = g.offset();
  g.set_offset(keep);
  return cache_.emplace(key, std::move(o)).first->second;
}

}  // namespace mt::cli
