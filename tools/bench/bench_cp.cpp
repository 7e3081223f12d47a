// Context-parallel attention: ring attention against gathering the whole sequence, measured in the
// same run (docs/context_parallel.md). One step = forward + backward of causal GQA attention on
// q [B, Hq, T, D], k/v [B, Hkv, T, D] whose sequence is split over every rank, in the load-balanced
// layout ZS(2) (or S(2) with --contiguous). Prints per mode the best step time over the repeats and
// the bytes each rank sent per step (forward k/v, backward dk/dv), and the ratios ring / gather;
// then the one-device fused attention of the whole sequence and the per-rank causal work.
//
// usage: mpirun -np N bench_cp [T=1024] [repeats=5] [--contiguous]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include "bench_world.h"
#include "mesh/dtensor.h"
#include "mesh/ring_attention.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"

using namespace mt;

namespace {

struct Result {
  double seconds = 1e30;
  int64_t bytes = 0;
  int64_t scores = 0;
};

Result run(CpAttentionMode mode, const Tensor& q, const Tensor& k, const Tensor& v, const DeviceMesh& mesh,
           const Placements& pl, int repeats, double scale) {
  set_cp_attention_mode(mode);
  Result r;
  for (int i = 0; i <= repeats; ++i) {  // the first is a warm-up
    Tensor dq = distribute_tensor(q, mesh, pl).requires_grad_();
    Tensor dk = distribute_tensor(k, mesh, pl).requires_grad_();
    Tensor dv = distribute_tensor(v, mesh, pl).requires_grad_();
    bench::world_barrier();
    cp_attention_stats() = {};
    const auto t0 = std::chrono::steady_clock::now();
    Tensor out = scaled_dot_product_attention(dq, dk, dv, Causal::kYes, scale);
    Tensor l = to_local(out);
    backward({sum(l)}, {});
    bench::world_barrier();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) r.seconds = std::min(r.seconds, s);
    r.bytes = cp_attention_stats().bytes_sent;
    r.scores = cp_attention_stats().scores_computed;
  }
  set_cp_attention_mode(CpAttentionMode::kRing);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const bool contiguous = argc > 3 && std::string(argv[3]) == "--contiguous";
  const int P = world().size();
  const int64_t B = 1, Hq = 8, Hkv = 4, D = 64;
  if (T % (2 * P) != 0) {
    fmt::print(stderr, "bench_cp: T = {} must be divisible by 2 x {} ranks\n", T, P);
    return 2;
  }
  DeviceMesh mesh({P}, {"cp"});
  const Placements pl{contiguous ? Placement::shard(2) : Placement::zigzag_shard(2)};
  Generator gen(5);
  Tensor q = normal(Shape{B, Hq, T, D}, 0, 1, DType::kF32, &gen);
  Tensor k = normal(Shape{B, Hkv, T, D}, 0, 1, DType::kF32, &gen);
  Tensor v = normal(Shape{B, Hkv, T, D}, 0, 1, DType::kF32, &gen);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Result ring = run(CpAttentionMode::kRing, q, k, v, mesh, pl, repeats, scale);
  const Result gather = run(CpAttentionMode::kGather, q, k, v, mesh, pl, repeats, scale);
  // One device, the fused kernel on the whole sequence (every rank runs it; rank 0 reports).
  double one = 1e30;
  for (int i = 0; i <= repeats; ++i) {
    Tensor a = q.clone().requires_grad_(), b = k.clone().requires_grad_(), c = v.clone().requires_grad_();
    const auto t0 = std::chrono::steady_clock::now();
    backward({sum(scaled_dot_product_attention(a, b, c, Causal::kYes, scale))}, {});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) one = std::min(one, s);
  }
  // Work balance: the most and least visible scores any rank computed (ring mode).
  Tensor w = from_vector<double>({static_cast<double>(ring.scores), -static_cast<double>(ring.scores)}, Shape{2},
                                 DType::kF64);
  mesh.comm(0).all_reduce(w, CommReduceOp::kMax);
  const std::vector<double> wv = w.to_vector<double>();
  if (world().rank() == 0) {
    fmt::print("bench_cp: causal GQA attention fwd+bwd, B={} Hq={} Hkv={} D={} T={} f32, cp={} ({}), best of {}\n", B,
               Hq, Hkv, D, T, P, placements_str(pl), repeats);
    fmt::print("  ring   : {:8.2f} ms/step, {:10.0f} KiB sent per rank per step\n", ring.seconds * 1e3,
               static_cast<double>(ring.bytes) / 1024);
    fmt::print("  gather : {:8.2f} ms/step, {:10.0f} KiB sent per rank per step\n", gather.seconds * 1e3,
               static_cast<double>(gather.bytes) / 1024);
    fmt::print("  ratio ring/gather: time {:.3f}, bytes {:.3f}\n", ring.seconds / gather.seconds,
               static_cast<double>(ring.bytes) / static_cast<double>(std::max<int64_t>(gather.bytes, 1)));
    fmt::print("  one device (fused kernel, whole sequence, same process): {:8.2f} ms/step\n", one * 1e3);
    fmt::print("  causal work per rank (visible scores): max {:.0f}, min {:.0f} (imbalance {:.3f})\n", wv[0], -wv[1],
               wv[0] / std::max(-wv[1], 1.0));
  }
  return 0;
}
