// The optimizer path on CUDA against the CPU: AdamW through the multi-tensor kernel (more tensors
// than one launch takes, sizes across its block size, a misaligned contiguous view, f64 beside
// f32), gradient clipping's f64 sum of squares, and the dense 16-byte cast path that moves f32
// master weights to bf16 and gradients back. Skips (exit 77) without a GPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_testing.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "optim/clip.h"
#include "q8_pieces.h"
#include "testing.h"

using namespace mt;
using mt::testing::rand;

namespace {

Tensor on_cuda(const Tensor& t) { return t.to(Device::cuda()); }
Tensor on_cpu(const Tensor& t) { return t.to(Device::cpu()); }

// One parameter per size: more than 48 (one launch), sizes around the 8192-element block and the
// 4-wide vector.
std::vector<Tensor> make_params(DType dt) {
  std::vector<Tensor> ps;
  const int64_t sizes[] = {1, 3, 4, 5, 127, 8191, 8192, 8193, 20000, 65537};
  uint64_t seed = 100;
  for (int rep = 0; rep < 6; ++rep)
    for (int64_t n : sizes) ps.push_back(rand({n}, dt, seed++));
  ps.push_back(rand({3, 1001}, dt, seed++));
  return ps;
}

}  // namespace

TEST_CASE("cuda AdamW (multi-tensor) and clip_grad_norm match the CPU over several steps", "[cuda]") {
  mt::testing::require_cuda();
  for (DType dt : {DType::kF32, DType::kF64}) {
    INFO(fmt::format("dtype {}", dt));
    std::vector<Tensor> init = make_params(dt);
    NamedTensors cpu_params, gpu_params;
    for (size_t i = 0; i < init.size(); ++i) {
      Tensor a = init[i].clone().requires_grad_(true);
      Tensor b = on_cuda(init[i]).requires_grad_(true);
      REQUIRE(a.is_contiguous());
      cpu_params.emplace_back(fmt::format("p{}", i), a);
      gpu_params.emplace_back(fmt::format("p{}", i), b);
    }
    {  // a CUDA parameter that is a contiguous view at an odd offset: the kernel's scalar path
      const Tensor base = rand({4096}, dt, 999);
      init.push_back(base.narrow(0, 1, 4095).clone());
      cpu_params.emplace_back("view", init.back().clone().requires_grad_(true));
      gpu_params.emplace_back("view", on_cuda(base).narrow(0, 1, 4095).detach().requires_grad_(true));
    }
    AdamWOptions o;
    o.lr = 1e-2;
    AdamW cpu_opt(make_param_groups(cpu_params, 0.1), o), gpu_opt(make_param_groups(gpu_params, 0.1), o);
    for (int step = 0; step < 4; ++step) {
      for (size_t i = 0; i < init.size(); ++i) {
        // Parameter 7 has no gradient in step 1: it keeps its own step count.
        if (step == 1 && i == 7) {
          cpu_params[i].second.set_grad(Tensor());
          gpu_params[i].second.set_grad(Tensor());
          continue;
        }
        Tensor g = rand(init[i].shape(), dt, 1000 + 100 * step + i, -3, 3);
        cpu_params[i].second.set_grad(g);
        gpu_params[i].second.set_grad(on_cuda(g));
      }
      const double na = clip_grad_norm(cpu_params, 5.0), nb = clip_grad_norm(gpu_params, 5.0);
      CHECK(std::abs(na - nb) <= 1e-12 * na);
      cpu_opt.step();
      gpu_opt.step();
    }
    // sqrt and division are correctly rounded on both sides: equal up to one rounding step.
    const double rtol = dt == DType::kF32 ? 1e-6 : 1e-14;
    for (size_t i = 0; i < init.size(); ++i) {
      INFO(cpu_params[i].first << " " << init[i].desc());
      REQUIRE_CLOSE(on_cpu(gpu_params[i].second.detach()), cpu_params[i].second.detach(), rtol, rtol * 1e-3);
    }
    const NamedTensors sa = cpu_opt.state_dict(), sb = gpu_opt.state_dict();
    REQUIRE(sa.size() == sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      INFO(sa[i].first);
      REQUIRE_CLOSE(on_cpu(sb[i].second), sa[i].second, rtol, rtol * 1e-3);
    }
  }
}

TEST_CASE("cuda dense casts f32 <-> bf16/f16 and same-dtype copies give the CPU's bits", "[cuda]") {
  mt::testing::require_cuda();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{1000003}}) {
    const Tensor x = rand({n}, DType::kF32, 7, -1e3, 1e3);
    const Tensor xg = on_cuda(x);
    for (DType to : {DType::kBF16, DType::kF16, DType::kF64}) {
      INFO(fmt::format("n {} to {}", n, to));
      const Tensor a = x.to(to), b = xg.to(to);
      REQUIRE_CLOSE(on_cpu(b), a, 0, 0);
      REQUIRE_CLOSE(on_cpu(b.to(DType::kF32)), a.to(DType::kF32), 0, 0);  // and back
    }
    // copy_ into an existing buffer, dense, and from a misaligned contiguous view.
    Tensor dst = empty({n}, TensorOptions(DType::kBF16).with_device(Device::cuda()));
    dst.copy_(xg);
    REQUIRE_CLOSE(on_cpu(dst), x.to(DType::kBF16), 0, 0);
    if (n > 1) {
      Tensor view = xg.narrow(0, 1, n - 1), d2 = empty({n - 1}, TensorOptions(DType::kF32).with_device(Device::cuda()));
      d2.copy_(view);
      REQUIRE_CLOSE(on_cpu(d2), x.narrow(0, 1, n - 1), 0, 0);
    }
  }
}

TEST_CASE("cuda mixed-precision AdamW in one pass (bf16 grads, scale, bf16 copies) matches the CPU", "[cuda]") {
  mt::testing::require_cuda();
  std::vector<Tensor> init = make_params(DType::kF32);
  NamedTensors ca, cb, copies_a, copies_b;
  for (size_t i = 0; i < init.size(); ++i) {
    const std::string name = fmt::format("p{}", i);
    ca.emplace_back(name, init[i].clone().requires_grad_(true));
    cb.emplace_back(name, on_cuda(init[i]).requires_grad_(true));
    copies_a.emplace_back(name, init[i].to(DType::kBF16));
    copies_b.emplace_back(name, on_cuda(init[i].to(DType::kBF16)));
  }
  AdamWOptions o;
  o.lr = 1e-2;
  AdamW oa(make_param_groups(ca, 0.1), o), ob(make_param_groups(cb, 0.1), o);
  oa.set_param_copies(copies_a);
  ob.set_param_copies(copies_b);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < init.size(); ++i) {
      const Tensor g = rand(init[i].shape(), DType::kBF16, 5000 + 100 * step + i, -3, 3);
      ca[i].second.set_grad(g);
      cb[i].second.set_grad(on_cuda(g));
    }
    oa.set_grad_scale(0.37);
    ob.set_grad_scale(0.37);
    oa.step();
    ob.step();
  }
  for (size_t i = 0; i < init.size(); ++i) {
    INFO(ca[i].first << " " << init[i].desc());
    REQUIRE_CLOSE(on_cpu(cb[i].second.detach()), ca[i].second.detach(), 1e-6, 1e-9);
    REQUIRE_CLOSE(on_cpu(copies_b[i].second), cb[i].second.detach().to(Device::cpu()).to(DType::kBF16), 0, 0);
  }
}

TEST_CASE("cuda 8-bit AdamW gives the CPU's weights, codes and absmax bit for bit", "[cuda]") {
  mt::testing::require_cuda();
  // Quantized: [100, 64] (4 blocks of 32 rows, the last one partial), [8192] (32 blocks of 256),
  // [3000, 7] (94 blocks); [50]: f32 moments through the adamw kernel.
  const Shape shapes[] = {{100, 64}, {8192}, {3000, 7}, {50}};
  NamedTensors cpu_params, gpu_params;
  uint64_t seed = 500;
  for (const Shape& s : shapes) {
    const Tensor init = rand(s, DType::kF32, seed++);
    const std::string name = fmt::format("p{}", cpu_params.size());
    cpu_params.emplace_back(name, init.clone().requires_grad_(true));
    gpu_params.emplace_back(name, on_cuda(init).requires_grad_(true));
  }
  AdamWOptions o;
  o.lr = 1e-2;
  AdamW8bit cpu_opt(make_param_groups(cpu_params, 0.1), o), gpu_opt(make_param_groups(gpu_params, 0.1), o);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      const Tensor g = rand(cpu_params[i].second.shape(), DType::kF32, 2000 + 10 * step + i, -3, 3);
      cpu_params[i].second.set_grad(g);
      gpu_params[i].second.set_grad(on_cuda(g));
    }
    cpu_opt.step();
    gpu_opt.step();
  }
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    INFO(cpu_params[i].first << " " << cpu_params[i].second.desc());
    const Tensor a = on_cpu(gpu_params[i].second.detach()), b = cpu_params[i].second.detach();
    if (AdamW8bit::quantized(b.shape()))
      REQUIRE(mt::testing::same_bits(a, b));
    else  // the adamw kernel: equal up to one rounding step (the test above)
      REQUIRE_CLOSE(a, b, 1e-6, 1e-9);
  }
  const NamedTensors sa = cpu_opt.state_dict(), sb = gpu_opt.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first << " " << sa[i].second.desc());
    REQUIRE(sa[i].first == sb[i].first);
    if (sa[i].second.dtype() == DType::kU8 || sa[i].first.find("absmax") != std::string::npos)
      REQUIRE(mt::testing::same_bits(sb[i].second, sa[i].second));
    else
      REQUIRE_CLOSE(on_cpu(sb[i].second), sa[i].second, 1e-6, 1e-9);
  }
}

TEST_CASE("cuda 8-bit AdamW codes a tiny positive v 1, as the CPU does, bit for bit", "[cuda]") {
  // The schedule of tests/optim/test_adamw8bit.cpp ("a v rounded below its block's smallest
  // code"): after step 0, row 0's v (about 1e9) is the block's absmax and rows 1..31's v (1e-3)
  // lies below half its smallest code, so q8_encode_v's clamp to code 1 runs on every such row
  // (random gradients almost never reach it, so the test above cannot tell the clamp is there).
  mt::testing::require_cuda();
  NamedTensors pc = {{"w", zeros(Shape{32, 128}, TensorOptions(DType::kF32))}};
  NamedTensors pg = {{"w", on_cuda(zeros(Shape{32, 128}, TensorOptions(DType::kF32)))}};
  pc[0].second.requires_grad_();
  pg[0].second.requires_grad_();
  AdamWOptions o;
  o.lr = 1e-3;
  AdamW8bit oc(make_param_groups(pc, 0.0), o), og(make_param_groups(pg, 0.0), o);
  bool clamped = false;
  for (int step = 0; step < 40; ++step) {
    Tensor g = zeros(Shape{32, 128}, TensorOptions(DType::kF32));
    if (step == 0) g.narrow(0, 0, 1).fill_(1e6);
    else if (step < 35) g.narrow(0, 1, 31).fill_(1.0);
    pc[0].second.set_grad(g);
    pg[0].second.set_grad(on_cuda(g));
    oc.step();
    og.step();
    for (const auto& [name, t] : oc.state_dict())  // rows 1..31 hold v's code 1 (the clamp)
      if (name.rfind("exp_avg_sq_q.", 0) == 0) {
        const std::vector<int64_t> codes = t.to(DType::kI64).to_vector<int64_t>();
        clamped |= std::count(codes.begin(), codes.end(), int64_t{1}) > 0;
      }
  }
  CHECK(clamped);
  REQUIRE(mt::testing::same_bits(on_cpu(pg[0].second.detach()), pc[0].second.detach()));
  const NamedTensors sa = oc.state_dict(), sb = og.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first << " " << sa[i].second.desc());
    if (sa[i].second.dtype() == DType::kU8 || sa[i].first.find("absmax") != std::string::npos)
      REQUIRE(mt::testing::same_bits(sb[i].second, sa[i].second));
  }
}

TEST_CASE("cuda 8-bit AdamW's two-phase kernel on pieces that share blocks gives the one-call bits", "[cuda]") {
  // What the optimizer runs for shards that cut blocks (optim/adamw8bit.h): kMax on each piece,
  // the blocks' absmax reduced, kApply (tests/common/q8_pieces.h); the CPU test runs the same.
  mt::testing::require_cuda();
  CHECK(mt::testing::q8_pieces_match(Device::cuda(), 70, 24, mt::testing::q8_test_pieces(), 6));
  CHECK(mt::testing::q8_pieces_match(Device::cuda(), 32, 8, {{0, 5, 0, 8}, {5, 0, 0, 8}, {5, 20, 0, 8}, {25, 7, 0, 8}},
                                     3));
}
