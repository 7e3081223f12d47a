// The CUDA core against the CPU: devices, streams and events, the caching allocator, moves
// between devices, and the copy, pointwise, reduce, matmul and random kernel families in f32,
// bf16 and f16 (f64 where it matters), with odd sizes, non-contiguous and broadcast inputs and
// gradients. Every test skips (exit 77) without a GPU. Tolerances: cuda_testing.h.
#include <cmath>
#include <cstdio>
#include <limits>

#include "cuda_testing.h"
#include "kernels/registry.h"
#include "runtime/cuda/check.h"
#include "runtime/cuda/memory.h"
#include "runtime/cuda/stream.h"
#include "tensor/random.h"

using namespace mt;
using namespace mt::testing;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

namespace {
const DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

Tensor leaf(const Shape& s, DType t, uint64_t seed, double lo = -1, double hi = 1) {
  Tensor x = rand(s, t, seed, lo, hi);
  return x.requires_grad_();
}
}  // namespace

// ---- runtime ------------------------------------------------------------------------------------

TEST_CASE("cuda: device count, current device, errors name the device", "[cuda]") {
  require_cuda();
  REQUIRE(cuda::device_count() >= 1);
  REQUIRE(cuda::unavailable_reason().empty());
  cuda::set_device(0);
  REQUIRE(cuda::current_device() == 0);
  const int n = cuda::device_count();
  REQUIRE_THROWS_WITH(zeros({2}, TensorOptions().with_device(Device::cuda(n))),
                      Catch::Contains("no CUDA device") && Catch::Contains(fmt::format("cuda:{}", n)));
}

TEST_CASE("cuda: streams and events order and time work", "[cuda]") {
  require_cuda();
  cuda::Stream comm = cuda::Stream::create(0);
  cuda::Stream compute = cuda::Stream::compute(0);
  REQUIRE(!(comm == compute));
  REQUIRE(cuda::current_stream() == compute.handle());
  Tensor x = ones({1 << 20}, TensorOptions().with_device(gpu()));
  cuda::Event start(cuda::EventTiming::kEnabled), done(cuda::EventTiming::kEnabled);
  start.record(compute);
  Tensor y = mul(x, 3.0);
  done.record(compute);
  done.wait(comm);
  {
    cuda::StreamGuard guard(comm);
    REQUIRE(cuda::current_stream() == comm.handle());
    Tensor z = add(y, 1.0);  // on the communication stream, after y
    cuda::record_stream(y.data_ptr(), comm);
    REQUIRE(sum(z).item() == 4.0 * (1 << 20));
  }
  REQUIRE(cuda::current_stream() == compute.handle());
  done.synchronize();
  REQUIRE(done.query());
  REQUIRE(start.elapsed_ms(done) >= 0.f);
}

TEST_CASE("cuda: CUDA errors carry the error string, expression and location", "[cuda]") {
  require_cuda();
  void* p = nullptr;
  try {
    MT_CUDA_CHECK(cudaMalloc(&p, size_t{1} << 62));
    FAIL("cudaMalloc of 2^62 bytes succeeded");
  } catch (const std::exception& e) {
    std::string m = e.what();
    REQUIRE_THAT(m, Catch::Contains("cudaMalloc(&p") && Catch::Contains("test_cuda_core.cpp:") &&
                        Catch::Contains("cudaErrorMemoryAllocation"));
  }
}

TEST_CASE("cuda: caching allocator reuses blocks: no cudaMalloc in the steady state", "[cuda]") {
  require_cuda();
  auto step = [] {
    Tensor a = uniform({257, 129}, -1, 1, TensorOptions().with_device(gpu()));
    Tensor b = uniform({129, 65}, -1, 1, TensorOptions().with_device(gpu()));
    Tensor c = relu(matmul(a, b));
    return sum(c).item();
  };
  step();
  step();
  const MemoryStats s0 = cuda::memory_stats(0);
  for (int i = 0; i < 5; ++i) step();
  const MemoryStats s1 = cuda::memory_stats(0);
  REQUIRE(s1.device_mallocs == s0.device_mallocs);
  REQUIRE(s1.allocations > s0.allocations);
  REQUIRE(s1.current == s0.current);
  REQUIRE(s1.peak >= s1.current);
  REQUIRE(s1.reserved >= s1.peak);
  REQUIRE(memory_stats(gpu()).device_mallocs == s1.device_mallocs);
  {
    Tensor big = empty({3 << 20}, TensorOptions().with_device(gpu()));  // 12 MiB
    REQUIRE(cuda::memory_stats(0).current >= s1.current + (12 << 20));
  }
  cuda::empty_cache();
  REQUIRE(cuda::memory_stats(0).reserved < s1.reserved + (12 << 20));
  REQUIRE(cuda::round_size(1) == 512);
  REQUIRE(cuda::round_size(513) == 1024);
  REQUIRE(cuda::round_size((1 << 20) + 1) == (1 << 20) + (1 << 18));
}

// ---- moves and copies ---------------------------------------------------------------------------

TEST_CASE("cuda: to(device) round trips every dtype, strided sources, item and to_vector", "[cuda]") {
  require_cuda();
  for (DType t : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8,
                  DType::kBool}) {
    Tensor x = rand({7, 13}, DType::kF64, 3, -50, 50).to(t);
    Tensor g = x.to(gpu());
    REQUIRE(g.device() == gpu());
    REQUIRE(g.dtype() == t);
    REQUIRE(same_bits(g, x));
    REQUIRE(same_bits(x.t().to(gpu()), x.t().contiguous()));  // strided source
  }
  Tensor v = from_vector<float>({1.5f, -2.f, 3.f}, {3}, TensorOptions().with_device(gpu()));
  REQUIRE(v.device() == gpu());
  REQUIRE(v.to_vector<float>() == std::vector<float>{1.5f, -2.f, 3.f});
  REQUIRE(v.select(0, 1).item() == -2.0);
  Tensor e = zeros({0, 3}, TensorOptions().with_device(gpu()));
  REQUIRE(e.to(Device::cpu()).numel() == 0);
}

TEST_CASE("cuda: copy_ across devices and dtypes, with broadcast; to(device) is differentiable", "[cuda]") {
  require_cuda();
  Tensor dst = zeros({4, 5}, TensorOptions(DType::kBF16).with_device(gpu()));
  Tensor src = rand({5}, DType::kF32, 4);
  dst.copy_(src);  // cpu f32 [5] -> cuda bf16 [4, 5]
  REQUIRE(same_bits(dst, src.to(DType::kBF16).expand({4, 5}).contiguous()));
  Tensor back = zeros({4, 5}, DType::kF64);
  back.copy_(dst);
  REQUIRE(same_bits(back.to(gpu()), dst.to(DType::kF64)));
  Tensor x = leaf({3, 4}, DType::kF64, 5);
  Tensor y = mul(x.to(gpu()), 2.0);
  sum(y).backward();
  REQUIRE(x.grad().device() == Device::cpu());
  REQUIRE_CLOSE(x.grad(), full({3, 4}, 2.0, DType::kF64));
}

TEST_CASE("cuda: fill, arange and dtype conversions are bit-identical to the CPU", "[cuda]") {
  require_cuda();
  auto on = [](DType t) { return TensorOptions(t).with_device(gpu()); };
  for (DType t : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8,
                  DType::kBool}) {
    INFO(fmt::format("{}: cuda arange {} vs cpu {}", t,
                     arange(-3.5, 40.0, 0.7, on(t)).to(Device::cpu()).to(DType::kF64).str(),
                     arange(-3.5, 40.0, 0.7, TensorOptions(t)).to(DType::kF64).str()));
    REQUIRE(same_bits(full({3, 5}, 1.0 / 3.0, on(t)), full({3, 5}, 1.0 / 3.0, TensorOptions(t))));
    REQUIRE(same_bits(arange(-3.5, 40.0, 0.7, on(t)), arange(-3.5, 40.0, 0.7, TensorOptions(t))));
  }
  // Every conversion pair, from values that exercise rounding (ties, overflow, NaN, negatives).
  std::vector<double> vals = {0.0, -0.0, 1.0 / 3.0, 1.00390625, 1.001953125, 65520.0, 1e6, -7.5, 300.0, 255.0,
                              std::numeric_limits<double>::infinity(), std::nan(""), 1e-8, 3.0000001};
  for (DType from : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8,
                     DType::kBool}) {
    Tensor x = from_vector<double>(vals).to(from);
    if (is_integral(from)) x = from_vector<double>({0, 1, -7, 300, 255, 65520, 1000000, 3}).to(from);
    Tensor xn = noncontig(x.unsqueeze(0).expand({2, -1}).contiguous());
    for (DType to : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8,
                     DType::kBool}) {
      if (is_floating(from) && !is_floating(to)) continue;  // float -> int of NaN/inf is undefined
      INFO(fmt::format("{} -> {}", from, to));
      REQUIRE(same_bits(x.to(gpu()).to(to), x.to(to)));
      REQUIRE(same_bits(to_cuda_like(xn).to(to), xn.to(to)));
    }
  }
}

// ---- pointwise ----------------------------------------------------------------------------------

TEST_CASE("cuda: unary ops match the CPU (values and gradients)", "[cuda]") {
  require_cuda();
  const std::vector<std::pair<const char*, Fn>> ops = {
      {"neg", [](const auto& x) { return neg(x[0]); }},
      {"exp", [](const auto& x) { return exp(x[0]); }},
      {"log", [](const auto& x) { return log(add(abs(x[0]), 0.5)); }},
      {"sqrt", [](const auto& x) { return sqrt(add(abs(x[0]), 0.1)); }},
      {"rsqrt", [](const auto& x) { return rsqrt(add(abs(x[0]), 0.1)); }},
      {"abs", [](const auto& x) { return abs(x[0]); }},
      {"sign", [](const auto& x) { return sign(x[0]); }},
      {"sin", [](const auto& x) { return sin(x[0]); }},
      {"cos", [](const auto& x) { return cos(x[0]); }},
      {"reciprocal", [](const auto& x) { return reciprocal(add(abs(x[0]), 0.5)); }},
      {"square", [](const auto& x) { return square(x[0]); }},
      {"pow 3", [](const auto& x) { return pow(x[0], 3.0); }},
      {"pow 0.5", [](const auto& x) { return pow(add(abs(x[0]), 0.1), 0.5); }},
      {"pow 1.7", [](const auto& x) { return pow(add(abs(x[0]), 0.1), 1.7); }},
      {"clamp", [](const auto& x) { return clamp(x[0], -0.3, 0.4); }},
      {"relu", [](const auto& x) { return relu(x[0]); }},
      {"gelu", [](const auto& x) { return gelu(x[0]); }},
      {"gelu tanh", [](const auto& x) { return gelu(x[0], GeluApprox::kTanh); }},
      {"silu", [](const auto& x) { return silu(x[0]); }},
      {"sigmoid", [](const auto& x) { return sigmoid(x[0]); }},
      {"tanh", [](const auto& x) { return tanh(x[0]); }},
      {"affine", [](const auto& x) { return add(mul(x[0], 1.5), -0.25); }},
  };
  for (const auto& [name, fn] : ops) {
    for (DType t : kFloatTypes) {
      INFO(fmt::format("{} {}", name, t));
      Tensor x = leaf({37, 19}, t, 7, -2, 2);
      REQUIRE_CPU_CUDA(fn, {x});
      REQUIRE_CPU_CUDA(fn, {noncontig(x.detach()).requires_grad_()});
    }
    INFO(fmt::format("{} f64", name));
    REQUIRE_CPU_CUDA(fn, {leaf({5, 3, 7}, DType::kF64, 8, -2, 2)});
  }
}

TEST_CASE("cuda: exact pointwise ops give the CPU's bits", "[cuda]") {
  require_cuda();
  for (DType t : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor a = rand({33, 17}, t, 9, -3, 3), b = rand({17}, t, 10, 0.5, 3);
    REQUIRE(same_bits(add(a.to(gpu()), b.to(gpu())), add(a, b)));
    REQUIRE(same_bits(sub(a.to(gpu()), b.to(gpu())), sub(a, b)));
    REQUIRE(same_bits(mul(a.to(gpu()), b.to(gpu())), mul(a, b)));
    REQUIRE(same_bits(div(a.to(gpu()), b.to(gpu())), div(a, b)));
    REQUIRE(same_bits(sqrt(abs(a.to(gpu()))), sqrt(abs(a))));
    REQUIRE(same_bits(add(mul(a.to(gpu()), 1.7), 0.3), add(mul(a, 1.7), 0.3)));
    REQUIRE(same_bits(clamp(a.to(gpu()), -1, 1), clamp(a, -1, 1)));
  }
  for (DType t : {DType::kI64, DType::kI32, DType::kU8, DType::kBool}) {
    Tensor a = from_vector<double>({0, 1, 5, 7, 200, 3, 1, 0}).to(t), b = from_vector<double>({1, 1, 2, 0, 3, 9, 0, 0}).to(t);
    for (auto f : std::vector<std::function<Tensor(const Tensor&, const Tensor&)>>{
             [](auto& x, auto& y) { return add(x, y); }, [](auto& x, auto& y) { return mul(x, y); },
             [](auto& x, auto& y) { return maximum(x, y); }, [](auto& x, auto& y) { return eq(x, y); },
             [](auto& x, auto& y) { return lt(x, y); }, [](auto& x, auto& y) { return logical_or(x, y); }}) {
      REQUIRE(same_bits(f(a.to(gpu()), b.to(gpu())), f(a, b)));
    }
    if (t != DType::kBool) REQUIRE(same_bits(neg(a.to(gpu())), neg(a)));  // neg of bool: refused, as torch
    REQUIRE(same_bits(logical_not(a.to(gpu())), logical_not(a)));
    REQUIRE(same_bits(mul(add(a.to(gpu()), 3.0), 2.0), mul(add(a, 3.0), 2.0)));
  }
}

TEST_CASE("cuda: binary ops, comparisons and where with broadcast and strided inputs", "[cuda]") {
  require_cuda();
  const std::vector<std::pair<const char*, Fn>> ops = {
      {"add", [](const auto& x) { return add(x[0], x[1]); }},
      {"sub", [](const auto& x) { return sub(x[0], x[1]); }},
      {"mul", [](const auto& x) { return mul(x[0], x[1]); }},
      {"div", [](const auto& x) { return div(x[0], add(abs(x[1]), 0.5)); }},
      {"maximum", [](const auto& x) { return maximum(x[0], x[1]); }},
      {"minimum", [](const auto& x) { return minimum(x[0], x[1]); }},
      {"pow", [](const auto& x) { return pow(add(abs(x[0]), 0.5), x[1]); }},
      {"where", [](const auto& x) { return where(gt(x[0], x[1]), x[0], x[1]); }},
      {"lt", [](const auto& x) { return lt(x[0], x[1]); }},
      {"ge", [](const auto& x) { return ge(x[0], x[1]); }},
      {"ne", [](const auto& x) { return ne(x[0], x[1]); }},
      {"and", [](const auto& x) { return logical_and(gt(x[0], 0.0), lt(x[1], 0.0)); }},
  };
  for (const auto& [name, fn] : ops) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
      INFO(fmt::format("{} {}", name, t));
      REQUIRE_CPU_CUDA(fn, {leaf({9, 31}, t, 11), leaf({9, 31}, t, 12)});
      REQUIRE_CPU_CUDA(fn, {leaf({5, 1, 31}, t, 13), leaf({7, 1}, t, 14)});  // broadcast both ways
      REQUIRE_CPU_CUDA(fn, {noncontig(rand({6, 11}, t, 15)).requires_grad_(), leaf({11}, t, 16)});
      REQUIRE_CPU_CUDA(fn, {leaf({4, 9}, t, 17), leaf({}, t, 18)});  // scalar tensor
    }
  }
}

// ---- reductions ---------------------------------------------------------------------------------

TEST_CASE("cuda: reductions match the CPU for every op, layout and size regime", "[cuda]") {
  require_cuda();
  const std::vector<std::pair<const char*, Fn>> ops = {
      {"sum all", [](const auto& x) { return sum(x[0]); }},
      {"sum last", [](const auto& x) { return sum(x[0], {-1}); }},
      {"sum first", [](const auto& x) { return sum(x[0], {0}, KeepDim::kYes); }},
      {"mean", [](const auto& x) { return mean(x[0], {0, 2}); }},
      {"var", [](const auto& x) { return var(x[0], {-1}); }},
      {"max", [](const auto& x) { return max(x[0], 1); }},
      {"min all", [](const auto& x) { return min(x[0]); }},
  };
  // Shapes: tiny reductions (a thread per output), warp-sized, block-sized, split across blocks.
  const std::vector<Shape> shapes = {{3, 5, 7}, {2, 33, 129}, {2, 3, 3001}, {1, 3, 70001}};
  for (const auto& [name, fn] : ops) {
    for (const Shape& s : shapes) {
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
        INFO(fmt::format("{} {} {}", name, s, t));
        DTypeTols tols;
        tols.bf16 = {3e-2, 3e-2};
        tols.f16 = {5e-3, 5e-3};
        REQUIRE_CPU_CUDA(fn, {leaf(s, t, 21)}, tols);
        REQUIRE_CPU_CUDA(fn, {noncontig(rand(s, t, 22)).requires_grad_()}, tols);
      }
    }
  }
}

TEST_CASE("cuda: argmax/argmin/max pick the CPU's element (ties and NaN); integer sums are exact", "[cuda]") {
  require_cuda();
  Tensor x = from_vector<float>({1, 5, 5, 2, -1, -1, 3, 0, std::nanf(""), 4, std::nanf(""), 9}, {3, 4});
  for (int64_t d : {0, 1}) {
    REQUIRE(same_bits(argmax(x.to(gpu()), d), argmax(x, d)));
    REQUIRE(same_bits(argmin(x.to(gpu()), d), argmin(x, d)));
    REQUIRE(same_bits(max(x.to(gpu()), d), max(x, d)));
  }
  Tensor big = rand({5, 50003}, DType::kF32, 23);
  REQUIRE(same_bits(argmax(big.to(gpu()), 1), argmax(big, 1)));
  REQUIRE(same_bits(argmin(big.t().to(gpu()), 0), argmin(big.t(), 0)));
  Tensor ints = randint(-1000, 1000, {7, 40001});
  REQUIRE(same_bits(sum(ints.to(gpu()), {1}), sum(ints, {1})));
  REQUIRE(same_bits(max(ints.to(gpu()), 1), max(ints, 1)));
}

// ---- matmul -------------------------------------------------------------------------------------

TEST_CASE("cuda: matmul matches the CPU: odd sizes, transposed views, batch broadcast, gradients", "[cuda]") {
  require_cuda();
  DTypeTols tols;
  tols.f32 = {1e-4, 1e-4};  // cuBLAS sums in another order
  tols.bf16 = {2e-2, 2e-2};
  tols.f16 = {4e-3, 4e-3};
  const Fn mm = [](const auto& x) { return matmul(x[0], x[1]); };
  const Fn mm_t = [](const auto& x) { return matmul(x[0].transpose(-1, -2), x[1].transpose(-1, -2)); };
  const Fn lin = [](const auto& x) { return linear(x[0], x[1], x[2]); };
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    INFO(fmt::format("{}", t));
    REQUIRE_CPU_CUDA(mm, {leaf({37, 61}, t, 31), leaf({61, 29}, t, 32)}, tols);
    REQUIRE_CPU_CUDA(mm_t, {leaf({61, 37}, t, 33), leaf({29, 61}, t, 34)}, tols);
    REQUIRE_CPU_CUDA(mm, {leaf({3, 1, 17, 9}, t, 35), leaf({4, 9, 11}, t, 36)}, tols);  // batch broadcast
    REQUIRE_CPU_CUDA(mm, {noncontig(rand({2, 5, 13}, t, 37)).requires_grad_(), leaf({13, 7}, t, 38)}, tols);
    REQUIRE_CPU_CUDA(mm, {leaf({13}, t, 39), leaf({2, 13, 5}, t, 40)}, tols);  // vector @ batch
    REQUIRE_CPU_CUDA(mm, {leaf({4, 0}, t, 41), leaf({0, 3}, t, 42)}, tols);    // empty inner dim
    REQUIRE_CPU_CUDA(lin, {leaf({2, 3, 24}, t, 43), leaf({10, 24}, t, 44), leaf({10}, t, 45)}, tols);
  }
  // Outer batch dims that do not collapse into one stride: a permuted batch.
  Tensor a = rand({3, 4, 8, 5}, DType::kF32, 46).permute({1, 0, 2, 3});
  REQUIRE_CPU_CUDA(mm, {a, leaf({4, 3, 5, 6}, DType::kF32, 47)}, tols);
}

TEST_CASE("cuda: matmul kernel with bf16/f16 inputs and f32 out, and TF32 opt-in", "[cuda]") {
  require_cuda();
  for (DType t : {DType::kBF16, DType::kF16}) {
    Tensor a = rand({65, 33}, t, 51), b = rand({33, 47}, t, 52);
    Tensor ref = matmul(a.to(DType::kF32), b.to(DType::kF32));
    for (DType out_t : {t, DType::kF32}) {
      Tensor ag = a.to(gpu()), bg = b.to(gpu());
      Tensor out = empty({65, 47}, TensorOptions(out_t).with_device(gpu()));
      MatmulParams p;
      p.a = ag.view_info();
      p.b = bg.view_info();
      p.out = out.view_info();
      MT_KERNEL(DeviceType::kCUDA, matmul, p);
      REQUIRE_CLOSE(out.to(Device::cpu()), ref, out_t == DType::kF32 ? 1e-5 : 1e-2, 1e-2);
    }
  }
  Tensor a = rand({128, 256}, DType::kF32, 53), b = rand({256, 64}, DType::kF32, 54);
  cuda::set_allow_tf32(true);
  Tensor c = matmul(a.to(gpu()), b.to(gpu()));
  cuda::set_allow_tf32(false);
  REQUIRE(cuda::allow_tf32() == false);
  REQUIRE_CLOSE(c.to(Device::cpu()), matmul(a, b), 5e-3, 5e-3);  // TF32: 10-bit mantissa inputs
}

// MT_GEMM_TUNE (kernels/cuda/matmul.cu): the call that times cuBLASLt's candidates, and every
// call after it with the algorithm it chose, give the bits of the first choice, in linear's three
// layouts (x W^T, gY W, gY^T x; shapes large enough to be tuned: 1M outputs, as a 16-bit output
// needs) and with an f32 output. Level 3 takes another same-bits candidate whatever its time, so
// that the calls after the tuning one run a swapped algorithm (at level 1 the first choice is
// often kept, and the test would only show that the timing runs' writes are overwritten).
TEST_CASE("cuda: GEMM algorithms chosen by timing keep the first choice's bits", "[cuda]") {
  require_cuda();
  Tensor x = rand({1024, 1024}, DType::kBF16, 61).to(gpu()), w = rand({1024, 1024}, DType::kBF16, 62).to(gpu());
  Tensor gy = rand({1024, 1024}, DType::kBF16, 63).to(gpu());
  const std::vector<std::pair<Tensor, Tensor>> cases = {{x, w.t()}, {gy, w}, {gy.t(), x}};
  auto f32_out = [&](const Tensor& a, const Tensor& b) {
    Tensor out = empty({a.size(0), b.size(1)}, TensorOptions(DType::kF32).with_device(gpu()));
    MatmulParams p;
    p.a = a.view_info();
    p.b = b.view_info();
    p.out = out.view_info();
    MT_KERNEL(DeviceType::kCUDA, matmul, p);
    return out;
  };
  cuda::set_gemm_tune_level(0);
  std::vector<Tensor> first, first32;
  for (const auto& [a, b] : cases) {
    first.push_back(matmul(a, b));  // each geometry's plan, not tuned
    first32.push_back(f32_out(a, b));
  }
  cuda::set_gemm_tune_level(3);
  const int64_t taken_before = cuda::gemm_tune_taken();
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO(i);
    const auto& [a, b] = cases[i];
    CHECK(same_bits(matmul(a, b), first[i]));  // this call times the candidates
    CHECK(same_bits(matmul(a, b), first[i]));  // the chosen algorithm
    CHECK(same_bits(f32_out(a, b), first32[i]));
    CHECK(same_bits(f32_out(a, b), first32[i]));
  }
  // How many of the 6 geometries ran another algorithm after tuning (0: cuBLASLt offered no
  // other candidate with the same bits, and only the timing path ran: the checks above then
  // compared the first choice with itself). Printed, not WARNed (Catch2 shows a passing case's
  // WARN only under -s); tools/gpu_check.sh copies the line into its summary.
  const int64_t taken = cuda::gemm_tune_taken() - taken_before;
  std::printf("gemm tune test: another algorithm taken for %lld of 6 geometries%s\n", static_cast<long long>(taken),
              taken == 0 ? " (none: the same-bits checks compared the first choice with itself)" : "");
  cuda::set_gemm_tune_level(0);
  CHECK(cuda::gemm_tune_level() == 0);
}

// ---- random -------------------------------------------------------------------------------------

TEST_CASE("cuda: Philox random numbers equal the CPU bit for bit", "[cuda]") {
  require_cuda();
  auto on = [](DType t) { return TensorOptions(t).with_device(gpu()); };
  for (DType t : {DType::kF64, DType::kF32, DType::kBF16, DType::kF16}) {
    INFO(fmt::format("{}", t));
    Generator gc(1234), gg(1234);
    REQUIRE(same_bits(uniform({7, 1001}, -2, 3, on(t), &gg), uniform({7, 1001}, -2, 3, TensorOptions(t), &gc)));
    REQUIRE(same_bits(bernoulli({3, 333}, 0.3, on(t), &gg), bernoulli({3, 333}, 0.3, TensorOptions(t), &gc)));
    // normal: CUDA's log/cos may differ from glibc's in the last bit of a double.
    REQUIRE_CLOSE(normal({999}, 1, 2, on(t), &gg).to(Device::cpu()), normal({999}, 1, 2, TensorOptions(t), &gc),
                  t == DType::kF64 ? 1e-13 : 1e-2, 1e-12);
  }
  for (DType t : {DType::kI64, DType::kI32, DType::kF32}) {
    Generator gc(99), gg(99);
    REQUIRE(same_bits(randint(-5, 1000, {17, 65}, on(t), &gg), randint(-5, 1000, {17, 65}, TensorOptions(t), &gc)));
  }
  Generator gc(7), gg(7);
  REQUIRE(same_bits(randint(0, int64_t{1} << 40, {1001}, on(DType::kI64), &gg),
                    randint(0, int64_t{1} << 40, {1001}, TensorOptions(DType::kI64), &gc)));
  // A shard of a larger tensor (global base and strides) and a non-contiguous destination.
  Tensor cpu_t = empty({6, 10}, TensorOptions(DType::kF32));
  Tensor gpu_t = empty({10, 6}, TensorOptions(DType::kF32).with_device(gpu())).t();
  fill_random(cpu_t, RandomDist::kUniform, 0, 1, 5, 17, 40, Shape{20, 1});
  fill_random(gpu_t, RandomDist::kUniform, 0, 1, 5, 17, 40, Shape{20, 1});
  REQUIRE(same_bits(gpu_t, cpu_t));
}
