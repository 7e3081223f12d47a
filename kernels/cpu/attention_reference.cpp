// The scalar attention kernels that the CPU backend ran before the blocked ones (attention.cpp):
// one query row at a time, every dot product and softmax sum in double, single-threaded. Kept as
// the reference that tests compare the blocked kernels with (tests/tensor/test_attention_blocked.cpp);
// not registered in the kernel table. Contiguous f32 or f64 operands only.
#include "kernels/cpu/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/error.h"

namespace mt::cpu {
namespace {

struct RefDims {
  int64_t B, Hq, Hkv, T, S, D, Dv, group;
  explicit RefDims(const KView& q, const KView& v)
      : B(q.sizes[0]), Hq(q.sizes[1]), Hkv(v.sizes[1]), T(q.sizes[2]), S(v.sizes[2]), D(q.sizes[3]),
        Dv(v.sizes[3]), group(q.sizes[1] / v.sizes[1]) {}
  // Keys [0, end) are visible to query t.
  int64_t key_end(int64_t t, bool causal) const { return causal ? std::clamp<int64_t>(t + (S - T) + 1, 0, S) : S; }
};

template <class T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

std::vector<double>& scratch(int64_t n) {
  thread_local std::vector<double> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf;
}

template <class T>
void attention_typed(const AttentionParams& p) {
  const RefDims d(p.q, p.v);
  const T* q = p.q.ptr<T>();
  const T* k = p.k.ptr<T>();
  const T* v = p.v.ptr<T>();
  T* out = p.out.ptr<T>();
  T* lse_out = p.lse.ptr<T>();
  const int64_t rows = d.B * d.Hq * d.T;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % d.T, bh = r / d.T, h = bh % d.Hq, b = bh / d.Hq;
    const int64_t kvh = b * d.Hkv + h / d.group;
    const T* qr = q + r * d.D;
    const T* kh = k + kvh * d.S * d.D;
    const T* vh = v + kvh * d.S * d.Dv;
    T* orow = out + r * d.Dv;
    const int64_t end = d.key_end(t, p.causal);
    if (end == 0) {  // no visible key (causal with S < T): zero output, lse -inf
      for (int64_t j = 0; j < d.Dv; ++j) orow[j] = T(0);
      lse_out[r] = -std::numeric_limits<T>::infinity();
      continue;
    }
    std::vector<double>& buf = scratch(end + d.Dv);
    double* score = buf.data();
    double* acc = buf.data() + end;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < end; ++s) {
      score[s] = p.scale * dot(qr, kh + s * d.D, d.D);
      m = std::max(m, score[s]);
    }
    double sum = 0;
    for (int64_t s = 0; s < end; ++s) {
      score[s] = std::exp(score[s] - m);
      sum += score[s];
    }
    for (int64_t j = 0; j < d.Dv; ++j) acc[j] = 0;
    for (int64_t s = 0; s < end; ++s) {
      const T* vr = vh + s * d.Dv;
      const double w = score[s] / sum;
      for (int64_t j = 0; j < d.Dv; ++j) acc[j] += w * static_cast<double>(vr[j]);
    }
    for (int64_t j = 0; j < d.Dv; ++j) orow[j] = static_cast<T>(acc[j]);
    lse_out[r] = static_cast<T>(m + std::log(sum));
  }
}

template <class T>
void attention_bwd_typed(const AttentionBwdParams& p) {
  const RefDims d(p.q, p.v);
  const T* q = p.q.ptr<T>();
  const T* k = p.k.ptr<T>();
  const T* v = p.v.ptr<T>();
  const T* out = p.out.ptr<T>();
  const T* lse = p.lse.ptr<T>();
  const T* gout = p.gout.ptr<T>();
  T* gq = p.gq.ptr<T>();
  T* gk = p.gk.ptr<T>();
  T* gv = p.gv.ptr<T>();
  const int64_t tasks = d.B * d.Hkv;
  for (int64_t bg = 0; bg < tasks; ++bg) {
    const int64_t b = bg / d.Hkv;
    const T* kh = k + bg * d.S * d.D;
    const T* vh = v + bg * d.S * d.Dv;
    T* gkh = gk + bg * d.S * d.D;
    T* gvh = gv + bg * d.S * d.Dv;
    for (int64_t i = 0; i < d.S * d.D; ++i) gkh[i] = T(0);
    for (int64_t i = 0; i < d.S * d.Dv; ++i) gvh[i] = T(0);
    std::vector<double>& buf = scratch(d.S + d.D);
    double* ds = buf.data();
    double* gqacc = buf.data() + d.S;
    for (int64_t h = (bg % d.Hkv) * d.group; h < (bg % d.Hkv + 1) * d.group; ++h) {
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t r = (b * d.Hq + h) * d.T + t;
        const T* qr = q + r * d.D;
        const T* gor = gout + r * d.Dv;
        T* gqr = gq + r * d.D;
        const int64_t end = d.key_end(t, p.causal);
        for (int64_t j = 0; j < d.D; ++j) gqacc[j] = 0;
        if (end > 0) {
          const double l = static_cast<double>(lse[r]);
          const double di = dot(gor, out + r * d.Dv, d.Dv);  // rowsum(dO * O)
          for (int64_t s = 0; s < end; ++s) {
            const double prob = std::exp(p.scale * dot(qr, kh + s * d.D, d.D) - l);
            T* gvr = gvh + s * d.Dv;
            for (int64_t j = 0; j < d.Dv; ++j) gvr[j] = static_cast<T>(gvr[j] + prob * static_cast<double>(gor[j]));
            const double dp = dot(gor, vh + s * d.Dv, d.Dv);
            ds[s] = prob * (dp - di);
          }
          for (int64_t s = 0; s < end; ++s) {
            const double w = p.scale * ds[s];
            const T* kr = kh + s * d.D;
            T* gkr = gkh + s * d.D;
            for (int64_t j = 0; j < d.D; ++j) {
              gqacc[j] += w * static_cast<double>(kr[j]);
              gkr[j] = static_cast<T>(gkr[j] + w * static_cast<double>(qr[j]));
            }
          }
        }
        for (int64_t j = 0; j < d.D; ++j) gqr[j] = static_cast<T>(gqacc[j]);
      }
    }
  }
}

}  // namespace

void attention_reference(const AttentionParams& p) {
  for (const KView* x : {&p.q, &p.k, &p.v, &p.out, &p.lse})
    MT_CHECK(x->is_contiguous(), "attention_reference: operands must be contiguous");
  switch (p.q.dtype) {
    case DType::kF64: attention_typed<double>(p); break;
    case DType::kF32: attention_typed<float>(p); break;
    default: MT_FAIL("attention_reference: dtype {} is not supported (f32 or f64)", p.q.dtype);
  }
}

void attention_bwd_reference(const AttentionBwdParams& p) {
  for (const KView* x : {&p.q, &p.k, &p.v, &p.out, &p.lse, &p.gout, &p.gq, &p.gk, &p.gv})
    MT_CHECK(x->is_contiguous(), "attention_bwd_reference: operands must be contiguous");
  switch (p.q.dtype) {
    case DType::kF64: attention_bwd_typed<double>(p); break;
    case DType::kF32: attention_bwd_typed<float>(p); break;
    default: MT_FAIL("attention_bwd_reference: dtype {} is not supported (f32 or f64)", p.q.dtype);
  }
}

}  // namespace mt::cpu
