// DTensor dispatch overhead: the same op on DTensors (propagation-cache hit, local op, wrap)
// minus the op on their plain local shards, both measured in this run on tiny tensors, without
// and with autograd recording. Goal: under 1 us extra per op. Then the bandwidth of redistribute
// S(0) -> R (all_gather) and P -> S(0) (reduce_scatter) against the bare collectives.
// Run as `mpirun -np 2 ./bench_dtensor` (or alone: a world of one).
#include <functional>

#include "mesh/dispatch.h"
#include "mesh/dtensor.h"
#include "mesh/world.h"
#include "tensor/ops.h"
#include "tools/bench/bench_timing.h"

int main() {
  using namespace mt;
  const int n = world().size();
  DeviceMesh mesh({n}, {"x"});
  const bool root = world().rank() == 0;
  const int64_t iters = 100000;
  Tensor ga = ones({8 * n, 4}), gb = ones({8 * n, 4}), gm = ones({4, 4}), gw = ones({4, 4 * n});
  Tensor a = distribute_tensor(ga, mesh, {Placement::shard(0)});
  Tensor b = distribute_tensor(gb, mesh, {Placement::shard(0)});
  Tensor w = distribute_tensor(gw, mesh, {Placement::shard(1)});
  Tensor m = distribute_tensor(gm, mesh, {Placement::replicate()});
  Tensor la = to_local(a), lb = to_local(b), lw = to_local(w), lm = to_local(m);
  struct Row {
    const char* name;
    std::function<void()> dt, local;
  };
  Row rows[] = {
      {"add S(0)+S(0)", [&] { Tensor c = add(a, b); }, [&] { Tensor c = add(la, lb); }},
      {"mul S(0)*S(0)", [&] { Tensor c = mul(a, b); }, [&] { Tensor c = mul(la, lb); }},
      {"exp S(0)", [&] { Tensor c = exp(a); }, [&] { Tensor c = exp(la); }},
      {"sum S(0) -> P", [&] { Tensor c = sum(a, {0}); }, [&] { Tensor c = sum(la, {0}); }},
      {"matmul R@S(1)", [&] { Tensor c = matmul(m, w); }, [&] { Tensor c = matmul(lm, lw); }},
      {"view S(0)", [&] { Tensor c = a.view({-1}); }, [&] { Tensor c = la.view({-1}); }},
  };
  if (root) {
    fmt::print("DTensor dispatch overhead on {} rank(s) (best of 5 x {} iterations)\n", n, iters);
    fmt::print("{:<16} {:>8} {:>10} {:>10} {:>12}\n", "op", "grad", "dtensor ns", "local ns", "overhead ns");
  }
  double worst = 0;
  for (bool grad : {false, true}) {
    a.requires_grad_(grad);
    la = to_local(a.detach());
    la.requires_grad_(grad);
    for (auto& r : rows) {
      double dt = bench::best_ns_per_iter(r.dt, iters), lo = bench::best_ns_per_iter(r.local, iters);
      worst = std::max(worst, dt - lo);
      if (root) fmt::print("{:<16} {:>8} {:>10.1f} {:>10.1f} {:>12.1f}\n", r.name, grad ? "yes" : "no", dt, lo, dt - lo);
    }
  }
  auto st = dispatch_stats();
  if (root) {
    fmt::print("worst overhead: {:.1f} ns per op (goal < 1000 ns): {}\n", worst, worst < 1000 ? "met" : "NOT met");
    fmt::print("propagation cache: {} hits, {} misses\n", st.hits, st.misses);
  }
  if (n == 1) return 0;
  // Redistribute bandwidth against the bare collectives, f32.
  if (root) fmt::print("\n{:<22} {:>10} {:>12} {:>12} {:>7}\n", "redistribute", "MiB", "GB/s", "bare GB/s", "ratio");
  for (int64_t mib : {1, 16, 64}) {
    const int64_t rows_per_rank = mib * 1024 * 1024 / 4 / 1024;
    Tensor g = zeros({rows_per_rank * n, 1024});
    Tensor s = distribute_tensor(g, mesh, {Placement::shard(0)});
    Tensor p = distribute_tensor(g, mesh, {Placement::partial()});
    Tensor local = to_local(s), gathered = empty({rows_per_rank * n, 1024});
    Tensor full = to_local(p).clone(), scattered = empty({rows_per_rank, 1024});
    Communicator comm = mesh.comm(0);
    const double bytes = static_cast<double>(g.numel()) * 4 * (n - 1) / n;  // bus bytes
    struct Case {
      const char* name;
      std::function<void()> dt, bare;
    };
    Case cases[] = {
        {"S(0)->R all_gather", [&] { Tensor r = redistribute(s, {Placement::replicate()}); },
         [&] { comm.all_gather(local, gathered); }},
        {"P->S(0) reduce_scatter", [&] { Tensor r = redistribute(p, {Placement::shard(0)}); },
         [&] { comm.reduce_scatter(full, scattered); }},
    };
    for (auto& c : cases) {
      double dt = bench::best_ns_per_iter(c.dt, 5), bare = bench::best_ns_per_iter(c.bare, 5);
      if (root)
        fmt::print("{:<22} {:>10} {:>12.2f} {:>12.2f} {:>7.2f}\n", c.name, mib * n, bytes / dt, bytes / bare, bare / dt);
    }
  }
  return 0;
}
