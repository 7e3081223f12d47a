// Reductions on the CPU: each output element walks its reduced sub-space (the last n_reduce dims
// of the input view, coalesced) with an odometer. Floating sums accumulate in double, so results
// do not depend on the thread count.
#include <cmath>
#include <limits>

#include "kernels/cpu/loops.h"
#include "kernels/registry.h"
#include "runtime/error.h"

namespace mt::cpu {
namespace {

struct Walk {  // the reduced sub-space of one output, coalesced
  int nd = 0;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];
  int64_t count = 1;
};

Walk make_walk(const KView& in, int n_reduce) {
  Walk w;
  for (int d = in.ndim() - 1; d >= in.ndim() - n_reduce; --d) {
    if (in.sizes[d] == 1) continue;
    if (w.nd > 0 && in.strides[d] == w.stride[w.nd - 1] * w.size[w.nd - 1]) {
      w.size[w.nd - 1] *= in.sizes[d];
    } else {
      w.size[w.nd] = in.sizes[d];
      w.stride[w.nd] = in.strides[d];
      ++w.nd;
    }
  }
  for (int d = in.ndim() - n_reduce; d < in.ndim(); ++d) w.count *= in.sizes[d];
  return w;
}

// Calls f(x, linear_index) for every element of the sub-space starting at p.
template <class T, class F>
void walk(const Walk& w, const T* p, F&& f) {
  if (w.count == 0) return;
  if (w.nd == 0) {
    f(p[0], int64_t{0});
    return;
  }
  int64_t idx[kMaxDims] = {};
  int64_t n0 = w.size[0], s0 = w.stride[0];
  int64_t linear = 0;
  while (true) {
    const T* q = p;
    for (int d = 1; d < w.nd; ++d) q += idx[d] * w.stride[d];
    for (int64_t i = 0; i < n0; ++i) f(q[i * s0], linear + i);
    linear += n0;
    int d = 1;
    for (; d < w.nd; ++d) {
      if (++idx[d] < w.size[d]) break;
      idx[d] = 0;
    }
    if (d == w.nd) return;
  }
}

template <class T>
void reduce_typed(const ReduceParams& p) {
  using C = compute_t<T>;
  using Acc = std::conditional_t<std::is_floating_point_v<C>, double, int64_t>;
  const KView& in = p.in;
  const int nkeep = in.ndim() - p.n_reduce;
  Walk w = make_walk(in, p.n_reduce);
  const int64_t nout = p.out.numel();
  const DType odt = p.out.dtype;

  parallel_for(nout, std::max<int64_t>(w.count, 1), [&](int64_t o) {
    int64_t in_off = 0, out_off = 0, rem = o;
    for (int d = nkeep - 1; d >= 0; --d) {
      int64_t i = rem % in.sizes[d];
      rem /= in.sizes[d];
      in_off += i * in.strides[d];
      out_off += i * p.out.strides[d];
    }
    // An empty reduction may have no input storage (null): no pointer arithmetic on it.
    const T* base = w.count ? in.ptr<T>() + in_off : in.ptr<T>();
    auto store = [&](auto v) {
      MT_DISPATCH_ALL(odt, "reduce", { p.out.ptr<scalar_t>()[out_off] = convert<scalar_t>(v); });
    };
    switch (p.op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: {
        Acc acc = 0;
        walk(w, base, [&](T x, int64_t) { acc += static_cast<Acc>(C(x)); });
        if (p.op == ReduceOp::kMean)
          store(static_cast<double>(acc) / static_cast<double>(w.count));
        else
          store(acc);
        break;
      }
      case ReduceOp::kProd: {
        double acc = 1;
        walk(w, base, [&](T x, int64_t) { acc *= static_cast<double>(C(x)); });
        store(acc);
        break;
      }
      case ReduceOp::kVar: {
        double mean = 0;
        walk(w, base, [&](T x, int64_t) { mean += static_cast<double>(C(x)); });
        mean /= static_cast<double>(w.count);
        double ss = 0;
        walk(w, base, [&](T x, int64_t) {
          double d = static_cast<double>(C(x)) - mean;
          ss += d * d;
        });
        double denom = static_cast<double>(w.count - p.correction);
        store(denom > 0 ? ss / denom : std::numeric_limits<double>::quiet_NaN());
        break;
      }
      case ReduceOp::kMax:
      case ReduceOp::kMin:
      case ReduceOp::kArgmax:
      case ReduceOp::kArgmin: {
        bool want_max = p.op == ReduceOp::kMax || p.op == ReduceOp::kArgmax;
        C best = C(base[0]);
        int64_t best_i = 0;
        bool nan = false;
        walk(w, base, [&](T x, int64_t i) {
          C v = C(x);
          if (nan) return;
          if (v != v) {  // NaN wins, like PyTorch
            nan = true;
            best = v;
            best_i = i;
          } else if (want_max ? v > best : v < best) {
            best = v;
            best_i = i;
          }
        });
        if (p.op == ReduceOp::kMax || p.op == ReduceOp::kMin)
          store(best);
        else
          store(best_i);
        break;
      }
    }
  });
}

void reduce(const ReduceParams& p) { MT_DISPATCH_ALL(p.in.dtype, "reduce", { reduce_typed<scalar_t>(p); }); }

}  // namespace
}  // namespace mt::cpu

namespace mt {
void register_cpu_reduce(KernelTable& t) { t.reduce = cpu::reduce; }
}  // namespace mt
