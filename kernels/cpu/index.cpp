// Indexing kernels on the CPU. index_select / index_add see contiguous tensors as
// [outer, n, inner] around `dim`; gather / scatter_add walk the positions of the index tensor one
// "line" (all positions that differ only in `dim`) at a time; topk sorts each row partially.
// The accumulating kernels give every thread a disjoint set of output elements and add in index
// order, so their results never depend on the thread count. Indices are trusted: the front ends
// range-check them.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

struct Split3 {  // sizes collapsed around one dim: [outer, n, inner]
  int64_t outer = 1, n = 1, inner = 1;
};

Split3 split3(const Shape& sizes, int dim) {
  Split3 s;
  for (int d = 0; d < dim; ++d) s.outer *= sizes[d];
  s.n = sizes[dim];
  for (int d = dim + 1; d < sizes.size(); ++d) s.inner *= sizes[d];
  return s;
}

// dst += alpha * v, computed in T's compute type and rounded once on store.
template <class T>
inline void add_scaled(T& dst, T v, double alpha) {
  if constexpr (std::is_same_v<T, bool>) {
    dst = dst || (v && alpha != 0);
  } else if constexpr (std::is_floating_point_v<compute_t<T>>) {
    using C = compute_t<T>;
    dst = T(C(dst) + static_cast<C>(alpha) * C(v));
  } else {
    dst = static_cast<T>(dst + static_cast<T>(alpha) * v);
  }
}

template <class T, class I>
void index_select_typed(const IndexSelectParams& p) {
  const Split3 s = split3(p.in.sizes, p.dim);
  const int64_t m = p.index.numel();
  const T* in = p.in.ptr<T>();
  const I* idx = p.index.ptr<I>();
  T* out = p.out.ptr<T>();
  if (s.inner == 0) return;
  parallel_for(s.outer * m, s.inner, [&](int64_t t) {
    const int64_t o = t / m, j = t % m;
    const T* src = in + (o * s.n + static_cast<int64_t>(idx[j])) * s.inner;
    std::copy(src, src + s.inner, out + t * s.inner);
  });
}

template <class T, class I>
void index_add_typed(const IndexAddParams& p) {
  const Split3 s = split3(p.out.sizes, p.dim);
  const int64_t m = p.index.numel();
  if (s.inner == 0 || s.outer == 0 || m == 0) return;
  const T* src = p.src.ptr<T>();
  const I* idx = p.index.ptr<I>();
  T* out = p.out.ptr<T>();
  // Threads split outer rows and column ranges of the inner slice; each walks all indices in
  // order, so two threads never touch one element.
  int64_t chunk = s.inner;
  if (s.outer < 64) chunk = std::min(s.inner, std::max<int64_t>(256, (s.inner + 63) / 64));
  const int64_t nchunks = (s.inner + chunk - 1) / chunk;
  parallel_for(s.outer * nchunks, m * chunk, [&](int64_t t) {
    const int64_t o = t / nchunks, c0 = (t % nchunks) * chunk, c1 = std::min(c0 + chunk, s.inner);
    for (int64_t j = 0; j < m; ++j) {
      T* dst = out + (o * s.n + static_cast<int64_t>(idx[j])) * s.inner;
      const T* sp = src + (o * m + j) * s.inner;
      for (int64_t i = c0; i < c1; ++i) add_scaled(dst[i], sp[i], p.alpha);
    }
  });
}

// Calls line(off_index, off_a, off_b) for every line of `sizes` along `dim` (the positions that
// differ only in `dim`), with element offsets of the line start in three views of given strides.
// Lines are handed to threads in contiguous runs.
template <class F>
void for_each_line(const Shape& sizes, int dim, const std::array<const Shape*, 3>& strides,
                   int64_t cost_per_line, F&& line) {
  int nd = 0;
  int64_t lsz[kMaxDims];
  int64_t lst[3][kMaxDims];
  int64_t lines = 1;
  for (int d = 0; d < sizes.size(); ++d) {
    if (d == dim) continue;
    lsz[nd] = sizes[d];
    for (int k = 0; k < 3; ++k) lst[k][nd] = (*strides[k])[d];
    lines *= sizes[d];
    ++nd;
  }
  if (lines == 0) return;
  const int64_t cost = std::max<int64_t>(cost_per_line, 1);
  const int64_t per_task = std::clamp<int64_t>(4096 / cost, 1, lines);
  const int64_t tasks = (lines + per_task - 1) / per_task;
  parallel_for(tasks, per_task * cost, [&](int64_t t) {
    const int64_t l0 = t * per_task, l1 = std::min(lines, l0 + per_task);
    int64_t c[kMaxDims] = {};
    int64_t off[3] = {0, 0, 0};
    int64_t r = l0;
    for (int e = nd - 1; e >= 0; --e) {
      c[e] = r % lsz[e];
      r /= lsz[e];
      for (int k = 0; k < 3; ++k) off[k] += c[e] * lst[k][e];
    }
    for (int64_t l = l0; l < l1; ++l) {
      line(off[0], off[1], off[2]);
      for (int e = nd - 1; e >= 0; --e) {
        for (int k = 0; k < 3; ++k) off[k] += lst[k][e];
        if (++c[e] < lsz[e]) break;
        for (int k = 0; k < 3; ++k) off[k] -= lsz[e] * lst[k][e];
        c[e] = 0;
      }
    }
  });
}

template <class T, class I>
void gather_typed(const GatherParams& p) {
  const int d = p.dim;
  const int64_t m = p.index.sizes[d];
  const int64_t si = p.index.strides[d], so = p.out.strides[d], sx = p.in.strides[d];
  const T* in = p.in.ptr<T>();
  const I* idx = p.index.ptr<I>();
  T* out = p.out.ptr<T>();
  for_each_line(p.index.sizes, d, {&p.index.strides, &p.out.strides, &p.in.strides}, m,
                [&](int64_t oi, int64_t oo, int64_t ox) {
                  for (int64_t j = 0; j < m; ++j)
                    out[oo + j * so] = in[ox + static_cast<int64_t>(idx[oi + j * si]) * sx];
                });
}

template <class T, class I>
void scatter_add_typed(const ScatterAddParams& p) {
  const int d = p.dim;
  const int64_t m = p.index.sizes[d];
  const int64_t si = p.index.strides[d], ss = p.src.strides[d], so = p.out.strides[d];
  const T* src = p.src.ptr<T>();
  const I* idx = p.index.ptr<I>();
  T* out = p.out.ptr<T>();
  // Positions on different lines write different output elements (they differ outside `dim`);
  // within a line the adds run in index order.
  for_each_line(p.index.sizes, d, {&p.index.strides, &p.src.strides, &p.out.strides}, m,
                [&](int64_t oi, int64_t os, int64_t oo) {
                  for (int64_t j = 0; j < m; ++j)
                    add_scaled(out[oo + static_cast<int64_t>(idx[oi + j * si]) * so], src[os + j * ss], 1.0);
                });
}

template <class T>
void topk_typed(const TopkParams& p) {
  using C = compute_t<T>;
  const int64_t n = p.in.sizes.back();
  const int64_t k = p.k;
  if (n == 0 || k == 0) return;
  const int64_t rows = p.in.numel() / n;
  const T* in = p.in.ptr<T>();
  T* values = p.values.ptr<T>();
  int64_t* indices = p.indices.ptr<int64_t>();
  const bool largest = p.largest;
  auto is_nan = [](C v) {
    if constexpr (std::is_floating_point_v<C>) {
      return std::isnan(v);
    } else {
      (void)v;
      return false;
    }
  };
  parallel_for(rows, n * 4, [&](int64_t r) {
    const T* x = in + r * n;
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    // A total order: NaN counts as the largest value (like PyTorch), ties go to the lower index.
    auto before = [&](int64_t a, int64_t b) {
      const C va = C(x[a]), vb = C(x[b]);
      const bool na = is_nan(va), nb = is_nan(vb);
      if (na || nb) {
        if (na && nb) return a < b;
        return largest ? na : nb;
      }
      if (va != vb) return largest ? va > vb : va < vb;
      return a < b;
    };
    if (k < n)
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    else
      std::sort(order.begin(), order.end(), before);
    for (int64_t i = 0; i < k; ++i) {
      values[r * k + i] = x[order[static_cast<size_t>(i)]];
      indices[r * k + i] = order[static_cast<size_t>(i)];
    }
  });
}

void index_select(const IndexSelectParams& p) {
  MT_DISPATCH_ALL(p.in.dtype, "index_select", {
    using T = scalar_t;
    MT_DISPATCH_INDEX(p.index.dtype, "index_select", { index_select_typed<T, scalar_t>(p); });
  });
}

void index_add(const IndexAddParams& p) {
  MT_DISPATCH_ALL(p.out.dtype, "index_add", {
    using T = scalar_t;
    MT_DISPATCH_INDEX(p.index.dtype, "index_add", { index_add_typed<T, scalar_t>(p); });
  });
}

void gather(const GatherParams& p) {
  MT_DISPATCH_ALL(p.in.dtype, "gather", {
    using T = scalar_t;
    MT_DISPATCH_INDEX(p.index.dtype, "gather", { gather_typed<T, scalar_t>(p); });
  });
}

void scatter_add(const ScatterAddParams& p) {
  MT_DISPATCH_ALL(p.out.dtype, "scatter_add", {
    using T = scalar_t;
    MT_DISPATCH_INDEX(p.index.dtype, "scatter_add", { scatter_add_typed<T, scalar_t>(p); });
  });
}

void topk(const TopkParams& p) { MT_DISPATCH_ALL(p.in.dtype, "topk", { topk_typed<scalar_t>(p); }); }

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_index(KernelTable& t) {
  t.index_select = cpu::index_select;
  t.index_add = cpu::index_add;
  t.gather = cpu::gather;
  t.scatter_add = cpu::scatter_add;
  t.topk = cpu::topk;
}
}  // namespace mt
