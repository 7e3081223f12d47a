// The random kernel on CUDA: one thread per local element computes its global row-major index j
// and draws from Philox block offset + j / E exactly like kernels/cpu/random.cpp, through the same
// header (kernels/philox.h, whose float arithmetic is written unfused). uniform, randint and
// bernoulli therefore equal the CPU bit for bit. normal uses CUDA's double log/cos/sqrt, which
// may differ from glibc's in the last bit of the double before rounding to the output dtype
// (docs/cuda.md: equal to within 1e-15 relative, not guaranteed bit for bit).
#include "kernels/cuda/loops.cuh"
#include "kernels/philox.h"
#include "kernels/registry.h"

namespace mt::cuda {
namespace {

struct RandGeom {
  int nd;
  int64_t size[kMaxDims], stride[kMaxDims], gstride[kMaxDims];
};

template <class T>
__global__ void random_kernel(T* out, int64_t n, RandGeom g, RandomDist dist, uint64_t seed, uint64_t offset,
                              int lanes, double a, double b, int64_t low, uint64_t range, int64_t global_base) {
  const philox::Stream stream{seed, offset, lanes};
  const float lo32 = static_cast<float>(a), hi32 = static_cast<float>(b);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t rem = i, off = 0, j = global_base;
    for (int d = g.nd - 1; d >= 0; --d) {
      const int64_t idx = rem % g.size[d];
      rem /= g.size[d];
      off += idx * g.stride[d];
      j += idx * g.gstride[d];
    }
    const uint64_t uj = static_cast<uint64_t>(j);
    const philox::U32x4 blk = philox::block(seed, stream.block_of(uj));
    const int lane = stream.lane_of(uj);
    const uint32_t x0 = blk.v[lane];
    const uint32_t x1 = lanes == 2 ? blk.v[lane + 1] : 0u;
    constexpr bool kFloat = !std::is_integral_v<T>;
    T v{};
    switch (dist) {
      case RandomDist::kUniform:
        if constexpr (std::is_same_v<T, double>) v = philox::uniform_f64(a, b, x0, x1);
        else if constexpr (kFloat) v = cvt<T>(philox::uniform_f32(lo32, hi32, x0));
        break;
      case RandomDist::kNormal:
        if constexpr (kFloat) v = cvt<T>(philox::normal_f64(a, b, x0, x1));
        break;
      case RandomDist::kRandint:
        v = cvt<T>(philox::randint(low, range, lanes, x0, x1));
        break;
      case RandomDist::kBernoulli:
        v = cvt<T>(philox::bernoulli(a, x0) ? 1 : 0);
        break;
    }
    out[off] = v;
  }
}

void random(const RandomParams& p) {
  MT_ASSERT(p.global_strides.size() == p.out.ndim(), "random: global strides {} for local sizes {}",
            p.global_strides, p.out.sizes);
  const int64_t n = p.out.numel();
  if (n == 0) return;
  RandGeom g{};
  g.nd = p.out.ndim();
  for (int d = 0; d < g.nd; ++d) {
    g.size[d] = p.out.sizes[d];
    g.stride[d] = p.out.strides[d];
    g.gstride[d] = p.global_strides[d];
  }
  const int lanes = philox::lanes_per_element(p.dist, p.out.dtype, p.a, p.b);
  const auto low = static_cast<int64_t>(p.a);
  const auto range = static_cast<uint64_t>(static_cast<int64_t>(p.b) - low);
  MT_CUDA_DISPATCH_ALL(p.out.dtype, "random", {
    random_kernel<scalar_t><<<grid_for(n), 256, 0, current_stream()>>>(
        p.out.ptr<scalar_t>(), n, g, p.dist, p.seed, p.offset, lanes, p.a, p.b, low, range, p.global_base);
    MT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace
}  // namespace mt::cuda

namespace mt {
void register_cuda_random(KernelTable& t) { t.random = cuda::random; }
}  // namespace mt
