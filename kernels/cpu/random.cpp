// The random kernel on the CPU: every local element computes its global row-major index j and
// draws its value from Philox block offset + j / E (kernels/philox.h, docs/rng.md). Elements are
// independent, so the work is split into fixed chunks of the local index space over OpenMP and
// the result does not depend on the thread count or on the split.
#include "kernels/cpu/loops.h"
#include "kernels/philox.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

inline constexpr int64_t kChunk = 4096;  // local elements per task

// Value of global element j, converted once to the output type.
template <class T>
struct Draw {
  RandomDist dist;
  philox::Stream stream;
  double a, b;
  float lo32, hi32;     // uniform bounds for 32-bit draws
  int64_t low;          // randint
  uint64_t range;       // randint: high - low
  // The last block computed: consecutive elements usually share it.
  uint64_t cached_block = ~uint64_t{0};
  philox::U32x4 cached{};

  T operator()(uint64_t j) {
    const uint64_t blk = stream.block_of(j);
    if (blk != cached_block) {
      cached = philox::block(stream.seed, blk);
      cached_block = blk;
    }
    const int lane = stream.lane_of(j);
    const uint32_t x0 = cached.v[lane];
    const uint32_t x1 = stream.lanes == 2 ? cached.v[lane + 1] : 0u;
    constexpr bool kFloat = !std::is_integral_v<T>;  // double, float, BFloat16, Float16
    switch (dist) {
      case RandomDist::kUniform:
        if constexpr (std::is_same_v<T, double>) return philox::uniform_f64(a, b, x0, x1);
        else if constexpr (kFloat) return T(philox::uniform_f32(lo32, hi32, x0));
        break;
      case RandomDist::kNormal:
        if constexpr (kFloat) return convert<T>(philox::normal_f64(a, b, x0, x1));
        break;
      case RandomDist::kRandint:
        return convert<T>(philox::randint(low, range, stream.lanes, x0, x1));
      case RandomDist::kBernoulli:
        return convert<T>(philox::bernoulli(a, x0) ? 1 : 0);
    }
    return T();  // unreachable: the front end rejects integral uniform/normal outputs
  }
};

template <class T>
void fill_random_typed(const RandomParams& p) {
  const KView& out = p.out;
  const int64_t numel = out.numel();
  if (numel == 0) return;
  const int nd = out.ndim();
  const int lanes = philox::lanes_per_element(p.dist, out.dtype, p.a, p.b);
  const auto low = static_cast<int64_t>(p.a);
  Draw<T> proto{p.dist, philox::Stream{p.seed, p.offset, lanes}, p.a, p.b, static_cast<float>(p.a),
                static_cast<float>(p.b), low, static_cast<uint64_t>(static_cast<int64_t>(p.b) - low)};
  const int64_t n_chunks = (numel + kChunk - 1) / kChunk;
  parallel_for(n_chunks, kChunk * 16, [&](int64_t c) {
    Draw<T> draw = proto;
    const int64_t begin = c * kChunk, end = std::min(numel, begin + kChunk);
    // Multi-index of `begin` (row-major over the local sizes), then an odometer.
    int64_t idx[kMaxDims] = {};
    int64_t rem = begin, off = 0, j = p.global_base;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rem % out.sizes[d];
      rem /= out.sizes[d];
      off += idx[d] * out.strides[d];
      j += idx[d] * p.global_strides[d];
    }
    T* base = out.ptr<T>();
    for (int64_t i = begin; i < end; ++i) {
      base[off] = draw(static_cast<uint64_t>(j));
      for (int d = nd - 1; d >= 0; --d) {
        off += out.strides[d];
        j += p.global_strides[d];
        if (++idx[d] < out.sizes[d]) break;
        off -= idx[d] * out.strides[d];
        j -= idx[d] * p.global_strides[d];
        idx[d] = 0;
      }
    }
  });
}

void random(const RandomParams& p) {
  MT_ASSERT(p.global_strides.size() == p.out.ndim(), "random: global strides {} for local sizes {}",
            p.global_strides, p.out.sizes);
  MT_DISPATCH_ALL(p.out.dtype, "random", { fill_random_typed<scalar_t>(p); });
}

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_random(KernelTable& t) { t.random = cpu::random; }
}  // namespace mt
