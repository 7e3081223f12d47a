// Row-wise normalization and softmax on the CPU: rms_norm, layer_norm (forward and backward) and
// (log-)softmax over the last dim of contiguous [rows, H] data. Rows run in parallel; per-row sums
// accumulate in double (rms_norm's and softmax's in vmath.h's fixed lanes, which vectorize), 16-bit
// values compute in float and round once on store. The weight and
// bias gradients sum over rows: each block of columns is owned by one thread and walks the rows in
// order, so they do not depend on the thread count.
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/vmath.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

// Saved statistics (rstd, mean) are f64 for f64 data, f32 otherwise.
template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

struct RowGeom {
  int64_t rows = 0, h = 0;
};

RowGeom rows_of(const KView& x) {
  RowGeom g;
  g.h = x.ndim() ? x.sizes[x.ndim() - 1] : 1;
  g.rows = 1;
  for (int d = 0; d + 1 < x.ndim(); ++d) g.rows *= x.sizes[d];
  return g;
}

inline constexpr int64_t kColBlock = 64;

// For each column j: acc(j) = sum over rows i in order of f(i, j, acc) (f adds to its slots),
// then store(j, acc). Parallel over blocks of columns, so the summation order is fixed.
template <int NAcc, class Add, class Store>
void column_sums(int64_t rows, int64_t h, Add&& add, Store&& store) {
  const int64_t nblocks = (h + kColBlock - 1) / kColBlock;
  parallel_for(nblocks, rows * kColBlock, [&](int64_t blk) {
    const int64_t j0 = blk * kColBlock, j1 = std::min(h, j0 + kColBlock);
    double acc[NAcc][kColBlock] = {};
    for (int64_t i = 0; i < rows; ++i) add(i, j0, j1, acc);
    for (int64_t j = j0; j < j1; ++j) {
      double col[NAcc];
      for (int k = 0; k < NAcc; ++k) col[k] = acc[k][j - j0];
      store(j, col);
    }
  });
}

// ---- rms_norm ---------------------------------------------------------------------------------

template <class T>
void rms_norm_typed(const RmsNormParams& p) {
  using C = compute_t<T>;
  using S = stat_t<T>;
  // A named struct, not a structured binding: the lambdas below capture rows and h (clang < 16
  // cannot capture structured bindings).
  const RowGeom geom = rows_of(p.x);
  const int64_t rows = geom.rows, h = geom.h;
  const T* x = p.x.ptr<const T>();
  const T* w = p.weight ? p.weight.ptr<const T>() : nullptr;
  T* y = p.out.ptr<T>();
  S* rstd = p.rstd.ptr<S>();
  parallel_for(rows, h * 4, [&](int64_t i) {
    const T* xr = x + i * h;
    T* yr = y + i * h;
    const double ss = lane_sum(h, [xr](int64_t j) {
      const double v = static_cast<double>(C(xr[j]));
      return v * v;
    });
    const double r = 1.0 / std::sqrt((h ? ss / static_cast<double>(h) : 0.0) + p.eps);
    rstd[i] = static_cast<S>(r);
    const C rc = static_cast<C>(r);
    if (w) {
      for (int64_t j = 0; j < h; ++j) yr[j] = T(C(xr[j]) * rc * C(w[j]));
    } else {
      for (int64_t j = 0; j < h; ++j) yr[j] = T(C(xr[j]) * rc);
    }
  });
}

// y = x * r * w with r = (mean(x^2) + eps)^-1/2:
// gx = r * (gy * w) - x * r^3 / H * sum(gy * w * x);  gw = sum over rows of gy * x * r.
template <class T>
void rms_norm_bwd_typed(const RmsNormBwdParams& p) {
  using C = compute_t<T>;
  using S = stat_t<T>;
  const RowGeom geom = rows_of(p.x);
  const int64_t rows = geom.rows, h = geom.h;
  const T* x = p.x.ptr<const T>();
  const T* gy = p.gy.ptr<const T>();
  const T* w = p.weight ? p.weight.ptr<const T>() : nullptr;
  const S* rstd = p.rstd.ptr<const S>();
  T* gx = p.gx.ptr<T>();
  auto wj = [&](int64_t j) { return w ? static_cast<double>(C(w[j])) : 1.0; };
  parallel_for(rows, h * 6, [&](int64_t i) {
    const T* xr = x + i * h;
    const T* gr = gy + i * h;
    T* gxr = gx + i * h;
    const double r = static_cast<double>(rstd[i]);
    const double dot = lane_sum(h, [&](int64_t j) {
      return static_cast<double>(C(gr[j])) * wj(j) * static_cast<double>(C(xr[j]));
    });
    const double c = h ? r * r * r * dot / static_cast<double>(h) : 0.0;
    for (int64_t j = 0; j < h; ++j) {
      const T v = T(static_cast<C>(r * static_cast<double>(C(gr[j])) * wj(j) - static_cast<double>(C(xr[j])) * c));
      gxr[j] = p.accumulate ? T(static_cast<C>(C(gxr[j]) + C(v))) : v;  // accumulate: add()'s bits
    }
  });
  if (p.gw) {
    T* gw = p.gw.ptr<T>();
    column_sums<1>(
        rows, h,
        [&](int64_t i, int64_t j0, int64_t j1, double (*acc)[kColBlock]) {
          const double r = static_cast<double>(rstd[i]);
          const T* xr = x + i * h;
          const T* gr = gy + i * h;
          for (int64_t j = j0; j < j1; ++j)
            acc[0][j - j0] += static_cast<double>(C(gr[j])) * static_cast<double>(C(xr[j])) * r;
        },
        [&](int64_t j, const double* s) { gw[j] = T(static_cast<C>(s[0])); });
  }
}

// ---- layer_norm -------------------------------------------------------------------------------

template <class T>
void layer_norm_typed(const LayerNormParams& p) {
  using C = compute_t<T>;
  using S = stat_t<T>;
  const RowGeom geom = rows_of(p.x);
  const int64_t rows = geom.rows, h = geom.h;
  const T* x = p.x.ptr<const T>();
  const T* w = p.weight ? p.weight.ptr<const T>() : nullptr;
  const T* b = p.bias ? p.bias.ptr<const T>() : nullptr;
  T* y = p.out.ptr<T>();
  S* mean_out = p.mean.ptr<S>();
  S* rstd_out = p.rstd.ptr<S>();
  parallel_for(rows, h * 6, [&](int64_t i) {
    const T* xr = x + i * h;
    T* yr = y + i * h;
    double sum = 0;
    for (int64_t j = 0; j < h; ++j) sum += static_cast<double>(C(xr[j]));
    const double mean = h ? sum / static_cast<double>(h) : 0.0;
    double ss = 0;  // two passes: no cancellation in the variance
    for (int64_t j = 0; j < h; ++j) {
      double d = static_cast<double>(C(xr[j])) - mean;
      ss += d * d;
    }
    const double r = 1.0 / std::sqrt((h ? ss / static_cast<double>(h) : 0.0) + p.eps);
    mean_out[i] = static_cast<S>(mean);
    rstd_out[i] = static_cast<S>(r);
    const C mc = static_cast<C>(mean), rc = static_cast<C>(r);
    for (int64_t j = 0; j < h; ++j) {
      C v = (C(xr[j]) - mc) * rc;
      if (w) v *= C(w[j]);
      if (b) v += C(b[j]);
      yr[j] = T(v);
    }
  });
}

// xhat = (x - mean) * r, y = xhat * w + b:
// gx = r * (gy*w - mean(gy*w) - xhat * mean(gy*w*xhat));  gw = sum gy*xhat;  gb = sum gy.
template <class T>
void layer_norm_bwd_typed(const LayerNormBwdParams& p) {
  using C = compute_t<T>;
  using S = stat_t<T>;
  const RowGeom geom = rows_of(p.x);
  const int64_t rows = geom.rows, h = geom.h;
  const T* x = p.x.ptr<const T>();
  const T* gy = p.gy.ptr<const T>();
  const T* w = p.weight ? p.weight.ptr<const T>() : nullptr;
  const S* mean = p.mean.ptr<const S>();
  const S* rstd = p.rstd.ptr<const S>();
  T* gx = p.gx.ptr<T>();
  auto wj = [&](int64_t j) { return w ? static_cast<double>(C(w[j])) : 1.0; };
  parallel_for(rows, h * 8, [&](int64_t i) {
    const T* xr = x + i * h;
    const T* gr = gy + i * h;
    T* gxr = gx + i * h;
    const double m = static_cast<double>(mean[i]), r = static_cast<double>(rstd[i]);
    double s1 = 0, s2 = 0;
    for (int64_t j = 0; j < h; ++j) {
      double g = static_cast<double>(C(gr[j])) * wj(j);
      double xh = (static_cast<double>(C(xr[j])) - m) * r;
      s1 += g;
      s2 += g * xh;
    }
    const double inv_h = h ? 1.0 / static_cast<double>(h) : 0.0;
    s1 *= inv_h;
    s2 *= inv_h;
    for (int64_t j = 0; j < h; ++j) {
      double g = static_cast<double>(C(gr[j])) * wj(j);
      double xh = (static_cast<double>(C(xr[j])) - m) * r;
      gxr[j] = T(static_cast<C>(r * (g - s1 - xh * s2)));
    }
  });
  if (p.gw || p.gb) {
    T* gw = p.gw ? p.gw.ptr<T>() : nullptr;
    T* gb = p.gb ? p.gb.ptr<T>() : nullptr;
    column_sums<2>(
        rows, h,
        [&](int64_t i, int64_t j0, int64_t j1, double (*acc)[kColBlock]) {
          const double m = static_cast<double>(mean[i]), r = static_cast<double>(rstd[i]);
          const T* xr = x + i * h;
          const T* gr = gy + i * h;
          for (int64_t j = j0; j < j1; ++j) {
            double g = static_cast<double>(C(gr[j]));
            acc[0][j - j0] += g * (static_cast<double>(C(xr[j])) - m) * r;
            acc[1][j - j0] += g;
          }
        },
        [&](int64_t j, const double* s) {
          if (gw) gw[j] = T(static_cast<C>(s[0]));
          if (gb) gb[j] = T(static_cast<C>(s[1]));
        });
  }
}

// ---- softmax ----------------------------------------------------------------------------------

template <class T>
void softmax_typed(const SoftmaxParams& p) {
  using C = compute_t<T>;
  const RowGeom geom = rows_of(p.in);
  const int64_t rows = geom.rows, h = geom.h;
  const T* x = p.in.ptr<const T>();
  T* y = p.out.ptr<T>();
  parallel_for(rows, h * 16, [&](int64_t i) {
    const T* xr = x + i * h;
    T* yr = y + i * h;
    // f64: one running max and sum, libm's exp. Otherwise (float compute) vmath.h's lanes and exp.
    C mx = -std::numeric_limits<C>::infinity();
    if constexpr (std::is_same_v<C, double>)
      for (int64_t j = 0; j < h; ++j) mx = std::max(mx, C(xr[j]));
    else
      mx = lane_max(h, [xr](int64_t j) { return C(xr[j]); });
    const auto sum_of = [&](auto&& e) {
      if constexpr (std::is_same_v<C, double>) {
        double sum = 0;
        for (int64_t j = 0; j < h; ++j) sum += e(j);
        return sum;
      } else {
        return lane_sum(h, [&](int64_t j) { return static_cast<double>(e(j)); });
      }
    };
    if (p.log) {
      const double sum = sum_of([&](int64_t j) { return exp_c(C(xr[j]) - mx); });
      const C lse = mx + static_cast<C>(std::log(sum));
      for (int64_t j = 0; j < h; ++j) yr[j] = T(C(xr[j]) - lse);
    } else if constexpr (std::is_same_v<T, C>) {  // store exp once, then scale in place
      for (int64_t j = 0; j < h; ++j) yr[j] = exp_c(xr[j] - mx);
      const C inv = static_cast<C>(1.0 / sum_of([yr](int64_t j) { return yr[j]; }));
      for (int64_t j = 0; j < h; ++j) yr[j] *= inv;
    } else {  // 16-bit output: recompute exp so that each value rounds once
      const C inv = static_cast<C>(1.0 / sum_of([&](int64_t j) { return exp_c(C(xr[j]) - mx); }));
      for (int64_t j = 0; j < h; ++j) yr[j] = T(exp_c(C(xr[j]) - mx) * inv);
    }
  });
}

void rms_norm(const RmsNormParams& p) { MT_DISPATCH_FLOAT(p.x.dtype, "rms_norm", { rms_norm_typed<scalar_t>(p); }); }
void rms_norm_bwd(const RmsNormBwdParams& p) {
  MT_DISPATCH_FLOAT(p.x.dtype, "rms_norm_bwd", { rms_norm_bwd_typed<scalar_t>(p); });
}
void layer_norm(const LayerNormParams& p) {
  MT_DISPATCH_FLOAT(p.x.dtype, "layer_norm", { layer_norm_typed<scalar_t>(p); });
}
void layer_norm_bwd(const LayerNormBwdParams& p) {
  MT_DISPATCH_FLOAT(p.x.dtype, "layer_norm_bwd", { layer_norm_bwd_typed<scalar_t>(p); });
}
void softmax(const SoftmaxParams& p) { MT_DISPATCH_FLOAT(p.in.dtype, "softmax", { softmax_typed<scalar_t>(p); }); }

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_norm(KernelTable& t) {
  t.rms_norm = cpu::rms_norm;
  t.rms_norm_bwd = cpu::rms_norm_bwd;
  t.layer_norm = cpu::layer_norm;
  t.layer_norm_bwd = cpu::layer_norm_bwd;
  t.softmax = cpu::softmax;
}
}  // namespace mt
