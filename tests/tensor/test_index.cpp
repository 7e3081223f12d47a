// Tests for the indexing and joining ops: values against naive loops over row-major coordinates
// (odd sizes, negative dims, non-contiguous operands, i32 and i64 indices, duplicate indices),
// f64 finite-difference gradchecks, and the error messages for bad indices and shapes.
#include <algorithm>
#include <numeric>

#include "testing.h"

using namespace mt;
using mt::testing::noncontig;
using mt::testing::rand;

namespace {

std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> c(static_cast<size_t>(s.size()));
  for (int d = s.size() - 1; d >= 0; --d) {
    c[d] = flat % s[d];
    flat /= s[d];
  }
  return c;
}

int64_t ravel(const std::vector<int64_t>& c, const Shape& s) {
  int64_t f = 0;
  for (int d = 0; d < s.size(); ++d) f = f * s[d] + c[d];
  return f;
}

Tensor idx64(const std::vector<int64_t>& v, const Shape& s) { return from_vector<int64_t>(v, s); }
Tensor idx64(const std::vector<int64_t>& v) { return from_vector<int64_t>(v); }

// Random integers in [0, n) as an index tensor of `dtype`.
Tensor rand_index(const Shape& s, int64_t n, DType dtype, uint64_t seed) {
  std::vector<double> v = rand(s, DType::kF64, seed, 0, static_cast<double>(n)).to_vector<double>();
  std::vector<int64_t> iv;
  for (double x : v) iv.push_back(std::min<int64_t>(static_cast<int64_t>(x), n - 1));
  return from_vector<int64_t>(iv, s, TensorOptions(dtype));
}

// ---- naive references ----
std::vector<double> ref_index_select(const Tensor& x, int d, const Tensor& index) {
  auto xv = x.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  Shape os = x.shape();
  os[d] = static_cast<int64_t>(iv.size());
  std::vector<double> out(static_cast<size_t>(os.numel()));
  for (int64_t f = 0; f < os.numel(); ++f) {
    auto c = unravel(f, os);
    c[d] = iv[c[d]];
    out[f] = xv[ravel(c, x.shape())];
  }
  return out;
}

std::vector<double> ref_index_add(const Tensor& x, int d, const Tensor& index, const Tensor& src, double alpha) {
  auto out = x.to_vector<double>();
  auto sv = src.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  for (int64_t f = 0; f < src.numel(); ++f) {
    auto c = unravel(f, src.shape());
    c[d] = iv[c[d]];
    out[ravel(c, x.shape())] += alpha * sv[f];
  }
  return out;
}

std::vector<double> ref_gather(const Tensor& x, int d, const Tensor& index) {
  auto xv = x.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  std::vector<double> out(iv.size());
  for (int64_t f = 0; f < index.numel(); ++f) {
    auto c = unravel(f, index.shape());
    c[d] = iv[f];
    out[f] = xv[ravel(c, x.shape())];
  }
  return out;
}

std::vector<double> ref_scatter_add(const Tensor& x, int d, const Tensor& index, const Tensor& src) {
  auto out = x.to_vector<double>();
  auto sv = src.to_vector<double>();
  auto iv = index.to_vector<int64_t>();
  for (int64_t f = 0; f < index.numel(); ++f) {
    auto c = unravel(f, index.shape());
    double v = sv[ravel(c, src.shape())];
    c[d] = iv[f];
    out[ravel(c, x.shape())] += v;
  }
  return out;
}

}  // namespace

TEST_CASE("index_select matches a naive loop", "[cpu]") {
  Tensor x = noncontig(rand({3, 5, 4}, DType::kF64, 1));
  for (DType it : {DType::kI64, DType::kI32}) {
    Tensor i1 = from_vector<int64_t>({4, 0, 4, 2, 1, 4, 3}, {7}, TensorOptions(it));
    Tensor i0 = from_vector<int64_t>({2, 2, 0}, {3}, TensorOptions(it));
    REQUIRE_CLOSE(index_select(x, 1, i1), ref_index_select(x, 1, i1));
    REQUIRE_CLOSE(index_select(x, -2, i1), ref_index_select(x, 1, i1));
    REQUIRE_CLOSE(index_select(x, 0, i0), ref_index_select(x, 0, i0));
    REQUIRE_CLOSE(index_select(x, -1, i0), ref_index_select(x, 2, i0));
  }
  // Other dtypes are exact copies; a non-contiguous index works too.
  Tensor ni = noncontig(idx64({3, 1, 1, 0}));
  for (DType t : {DType::kF32, DType::kBF16, DType::kI64, DType::kBool}) {
    Tensor xt = noncontig(rand({4, 7}, DType::kF64, 2, -3, 3).to(t));
    Tensor y = index_select(xt, 0, ni);
    REQUIRE(y.dtype() == t);
    REQUIRE_CLOSE(y, ref_index_select(xt, 0, ni), 0, 0);
  }
  REQUIRE(index_select(x, 1, idx64({})).shape() == Shape{3, 0, 4});
}

TEST_CASE("index_add accumulates duplicates", "[cpu]") {
  for (DType it : {DType::kI64, DType::kI32}) {
    Tensor x = noncontig(rand({4, 5, 3}, DType::kF64, 3));
    Tensor idx = from_vector<int64_t>({1, 4, 1, 0, 1, 4, 2}, {7}, TensorOptions(it));
    Tensor src = noncontig(rand({4, 7, 3}, DType::kF64, 4));
    REQUIRE_CLOSE(index_add(x, 1, idx, src, 0.5), ref_index_add(x, 1, idx, src, 0.5), 1e-12, 1e-12);
    REQUIRE_CLOSE(index_add(x, -2, idx, src), ref_index_add(x, 1, idx, src, 1.0), 1e-12, 1e-12);
    Tensor src0 = rand({7, 5, 3}, DType::kF64, 5);
    Tensor idx0 = from_vector<int64_t>({3, 3, 3, 0, 2, 1, 3}, {7}, TensorOptions(it));
    REQUIRE_CLOSE(index_add(x, 0, idx0, src0, -2), ref_index_add(x, 0, idx0, src0, -2), 1e-12, 1e-12);
    Tensor src2 = rand({4, 5, 7}, DType::kF64, 6);
    Tensor idx2 = from_vector<int64_t>({2, 0, 0, 1, 2, 2, 0}, {7}, TensorOptions(it));
    REQUIRE_CLOSE(index_add(x, -1, idx2, src2), ref_index_add(x, 2, idx2, src2, 1), 1e-12, 1e-12);
  }
  // f32, bf16 and integers; x itself is untouched (out of place).
  Tensor idx = idx64({2, 0, 2, 2});
  Tensor x32 = rand({3, 6}, DType::kF32, 7), s32 = rand({4, 6}, DType::kF32, 8);
  std::vector<double> before = x32.to_vector<double>();
  REQUIRE_CLOSE(index_add(x32, 0, idx, s32), ref_index_add(x32, 0, idx, s32, 1), 1e-5, 1e-6);
  REQUIRE_CLOSE(x32, before, 0, 0);
  Tensor xb = rand({3, 6}, DType::kBF16, 7), sb = rand({4, 6}, DType::kBF16, 8);
  REQUIRE_CLOSE(index_add(xb, 0, idx, sb), ref_index_add(xb, 0, idx, sb, 1), 2e-2, 2e-2);
  Tensor xi = from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor si = from_vector<int64_t>({10, 20, 30, 40, 50, 60, 70, 80}, {4, 2});
  REQUIRE_CLOSE(index_add(xi, 0, idx, si, 2), ref_index_add(xi, 0, idx, si, 2), 0, 0);
}

TEST_CASE("index_add on a large problem matches the naive loop (parallel path)", "[cpu]") {
  // Embedding-backward shaped: [V, C] with many duplicate row indices.
  Tensor x = zeros({37, 1500}, DType::kF64);
  Tensor idx = rand_index({600}, 37, DType::kI64, 9);
  Tensor src = rand({600, 1500}, DType::kF64, 10);
  Tensor y = index_add(x, 0, idx, src);
  REQUIRE_CLOSE(y, ref_index_add(x, 0, idx, src, 1), 1e-12, 1e-12);
  // Deterministic: bit-identical on a second run.
  REQUIRE_CLOSE(index_add(x, 0, idx, src), y, 0, 0);
  // Many outer rows.
  Tensor x2 = zeros({300, 7, 20}, DType::kF32);
  Tensor idx2 = rand_index({50}, 7, DType::kI32, 11);
  Tensor src2 = rand({300, 50, 20}, DType::kF32, 12);
  REQUIRE_CLOSE(index_add(x2, 1, idx2, src2), ref_index_add(x2, 1, idx2, src2, 1), 1e-5, 1e-5);
}

TEST_CASE("gather matches a naive loop", "[cpu]") {
  Tensor x = noncontig(rand({4, 6, 5}, DType::kF64, 13));
  for (DType it : {DType::kI64, DType::kI32}) {
    Tensor i1 = rand_index({3, 8, 4}, 6, it, 14);  // smaller than x outside dim 1, larger in dim 1
    REQUIRE_CLOSE(gather(x, 1, i1), ref_gather(x, 1, i1), 0, 0);
    REQUIRE_CLOSE(gather(x, -2, noncontig(i1)), ref_gather(x, 1, i1), 0, 0);
    Tensor i2 = rand_index({4, 6, 3}, 5, it, 15);
    REQUIRE_CLOSE(gather(x, -1, i2), ref_gather(x, 2, i2), 0, 0);
    Tensor i0 = rand_index({9, 2, 5}, 4, it, 16);
    REQUIRE_CLOSE(gather(x, 0, i0), ref_gather(x, 0, i0), 0, 0);
  }
  Tensor xb = rand({3, 7}, DType::kBF16, 17);
  Tensor ib = rand_index({3, 2}, 7, DType::kI64, 18);
  REQUIRE_CLOSE(gather(xb, 1, ib), ref_gather(xb, 1, ib), 0, 0);
  // Large enough for threads.
  Tensor xl = rand({400, 300}, DType::kF32, 19);
  Tensor il = rand_index({400, 250}, 300, DType::kI64, 20);
  REQUIRE_CLOSE(gather(xl, 1, il), ref_gather(xl, 1, il), 0, 0);
}

TEST_CASE("scatter_add accumulates duplicates", "[cpu]") {
  Tensor x = noncontig(rand({4, 6, 5}, DType::kF64, 21));
  for (DType it : {DType::kI64, DType::kI32}) {
    Tensor i1 = rand_index({3, 8, 4}, 6, it, 22);  // 8 > 6: duplicates guaranteed
    Tensor src = noncontig(rand({4, 9, 5}, DType::kF64, 23));  // larger than the index
    REQUIRE_CLOSE(scatter_add(x, 1, i1, src), ref_scatter_add(x, 1, i1, src), 1e-12, 1e-12);
    REQUIRE_CLOSE(scatter_add(x, -2, noncontig(i1), src), ref_scatter_add(x, 1, i1, src), 1e-12, 1e-12);
    Tensor i0 = rand_index({10, 6, 5}, 4, it, 24);
    Tensor src0 = rand({10, 6, 5}, DType::kF64, 25);
    REQUIRE_CLOSE(scatter_add(x, 0, i0, src0), ref_scatter_add(x, 0, i0, src0), 1e-12, 1e-12);
    Tensor i2 = rand_index({4, 6, 11}, 5, it, 26);
    Tensor src2 = rand({4, 6, 11}, DType::kF64, 27);
    REQUIRE_CLOSE(scatter_add(x, -1, i2, src2), ref_scatter_add(x, 2, i2, src2), 1e-12, 1e-12);
  }
  Tensor xb = rand({3, 7}, DType::kBF16, 28), sb = rand({3, 9}, DType::kBF16, 29);
  Tensor ib = rand_index({3, 9}, 7, DType::kI64, 30);
  REQUIRE_CLOSE(scatter_add(xb, 1, ib, sb), ref_scatter_add(xb, 1, ib, sb), 2e-2, 2e-2);
  // Large, many duplicates, threads: exact for integer-valued f32 sums, and deterministic.
  Tensor xl = zeros({200, 50}, DType::kF32);
  Tensor il = rand_index({200, 400}, 50, DType::kI64, 31);
  Tensor sl = rand({200, 400}, DType::kF32, 32);
  Tensor yl = scatter_add(xl, 1, il, sl);
  REQUIRE_CLOSE(yl, ref_scatter_add(xl, 1, il, sl), 1e-5, 1e-5);
  REQUIRE_CLOSE(scatter_add(xl, 1, il, sl), yl, 0, 0);
}

namespace {
// Reference top-k of each line along d: values and indices, ties to the lower index.
std::pair<std::vector<double>, std::vector<int64_t>> ref_topk(const Tensor& x, int64_t k, int d, bool largest) {
  auto xv = x.to_vector<double>();
  Shape os = x.shape();
  os[d] = k;
  std::vector<double> vals(static_cast<size_t>(os.numel()));
  std::vector<int64_t> ids(vals.size());
  const int64_t n = x.shape()[d];
  for (int64_t f = 0; f < os.numel(); ++f) {
    auto c = unravel(f, os);
    if (c[d] != 0) continue;
    std::vector<std::pair<double, int64_t>> line;
    for (int64_t j = 0; j < n; ++j) {
      auto cc = c;
      cc[d] = j;
      line.push_back({xv[ravel(cc, x.shape())], j});
    }
    std::stable_sort(line.begin(), line.end(), [&](const auto& a, const auto& b) {
      return largest ? a.first > b.first : a.first < b.first;
    });
    for (int64_t j = 0; j < k; ++j) {
      auto cc = c;
      cc[d] = j;
      vals[ravel(cc, os)] = line[j].first;
      ids[ravel(cc, os)] = line[j].second;
    }
  }
  return {vals, ids};
}

// Small integers so that ties are common.
Tensor tie_heavy(const Shape& s, DType t, uint64_t seed) {
  auto v = rand(s, DType::kF64, seed, 0, 4).to_vector<double>();
  for (auto& e : v) e = static_cast<double>(static_cast<int>(e));
  return from_vector<double>(v, s, TensorOptions(t));
}
}  // namespace

TEST_CASE("topk matches a stable sort, ties to the lower index", "[cpu]") {
  for (DType t : {DType::kF64, DType::kF32, DType::kBF16, DType::kI32}) {
    Tensor x = noncontig(tie_heavy({5, 9, 7}, t, 33));
    for (int d : {0, 1, 2}) {
      for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{3}, x.shape()[d]}) {
        for (bool largest : {true, false}) {
          auto [v, i] = topk(x, k, d - 3, largest ? TopkOrder::kLargest : TopkOrder::kSmallest);
          auto [rv, ri] = ref_topk(x, k, d, largest);
          INFO("dtype " << dtype_name(t) << " dim " << d << " k " << k << " largest " << largest);
          REQUIRE(v.dtype() == t);
          REQUIRE(i.dtype() == DType::kI64);
          REQUIRE_CLOSE(v, rv, 0, 0);
          REQUIRE(i.to_vector<int64_t>() == ri);
        }
      }
    }
  }
  // Continuous values, one long row (a partial sort) with the default arguments.
  Tensor x = rand({3, 1001}, DType::kF32, 34);
  auto [v, i] = topk(x, 10);
  auto [rv, ri] = ref_topk(x, 10, 1, true);
  REQUIRE_CLOSE(v, rv, 0, 0);
  REQUIRE(i.to_vector<int64_t>() == ri);
}

TEST_CASE("one_hot", "[cpu]") {
  for (DType it : {DType::kI64, DType::kI32}) {
    Tensor idx = from_vector<int64_t>({2, 0, 3, 3, 1, 0}, {2, 3}, TensorOptions(it));
    Tensor y = one_hot(noncontig(idx), 5);
    REQUIRE(y.dtype() == DType::kI64);
    REQUIRE(y.shape() == Shape{2, 3, 5});
    auto iv = idx.to_vector<int64_t>();
    std::vector<double> ref(30, 0.0);
    for (size_t k = 0; k < iv.size(); ++k) ref[k * 5 + iv[k]] = 1;
    REQUIRE_CLOSE(y, ref, 0, 0);
    REQUIRE(one_hot(idx, -1).shape() == Shape{2, 3, 4});
  }
}

TEST_CASE("cat along any dim, with promotion", "[cpu]") {
  Tensor a = noncontig(rand({2, 3, 4}, DType::kF64, 35));
  Tensor b = noncontig(rand({2, 1, 4}, DType::kF64, 36));
  Tensor c = rand({2, 5, 4}, DType::kF64, 37);
  for (int64_t dim : {int64_t{1}, int64_t{-2}}) {
    Tensor y = cat({a, b, c}, dim);
    REQUIRE(y.shape() == Shape{2, 9, 4});
    auto av = a.to_vector<double>(), bv = b.to_vector<double>(), cv = c.to_vector<double>();
    std::vector<double> ref;
    for (int i = 0; i < 2; ++i) {
      ref.insert(ref.end(), av.begin() + i * 12, av.begin() + (i + 1) * 12);
      ref.insert(ref.end(), bv.begin() + i * 4, bv.begin() + (i + 1) * 4);
      ref.insert(ref.end(), cv.begin() + i * 20, cv.begin() + (i + 1) * 20);
    }
    REQUIRE_CLOSE(y, ref, 0, 0);
  }
  // Last dim and first dim.
  Tensor p = rand({3, 2}, DType::kF64, 38), q = rand({3, 3}, DType::kF64, 39);
  Tensor y = cat({p, q}, -1);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) {
      double want = j < 2 ? p.to_vector<double>()[i * 2 + j] : q.to_vector<double>()[i * 3 + j - 2];
      REQUIRE(y.to_vector<double>()[i * 5 + j] == want);
    }
  Tensor z = cat({p, noncontig(p)}, 0);
  REQUIRE(z.shape() == Shape{6, 2});
  REQUIRE_CLOSE(z.narrow(0, 3, 3), p, 0, 0);
  // Promotion: f32 + i64 -> f32, f32 + f64 -> f64; a single input and an empty piece work.
  Tensor f = from_vector<float>({1.5f, 2.5f}), i = from_vector<int64_t>({3, 4, 5});
  Tensor fi = cat({f, i});
  REQUIRE(fi.dtype() == DType::kF32);
  REQUIRE_CLOSE(fi, {1.5, 2.5, 3, 4, 5}, 0, 0);
  REQUIRE(cat({f, f.to(DType::kF64)}).dtype() == DType::kF64);
  REQUIRE_CLOSE(cat({f, zeros({0}), f}), {1.5, 2.5, 1.5, 2.5}, 0, 0);
  REQUIRE_CLOSE(cat({f}), {1.5, 2.5}, 0, 0);
}

TEST_CASE("stack, split and chunk", "[cpu]") {
  Tensor a = rand({2, 3}, DType::kF64, 40), b = noncontig(rand({2, 3}, DType::kF64, 41));
  auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  Tensor s0 = stack({a, b});
  REQUIRE(s0.shape() == Shape{2, 2, 3});
  std::vector<double> ref0 = av;
  ref0.insert(ref0.end(), bv.begin(), bv.end());
  REQUIRE_CLOSE(s0, ref0, 0, 0);
  Tensor s2 = stack({a, b}, -1);
  REQUIRE(s2.shape() == Shape{2, 3, 2});
  std::vector<double> ref2;
  for (size_t k = 0; k < av.size(); ++k) {
    ref2.push_back(av[k]);
    ref2.push_back(bv[k]);
  }
  REQUIRE_CLOSE(s2, ref2, 0, 0);

  Tensor x = rand({3, 10}, DType::kF64, 42);
  auto xv = x.to_vector<double>();
  auto check_pieces = [&](const std::vector<Tensor>& ps, const std::vector<int64_t>& sizes) {
    REQUIRE(ps.size() == sizes.size());
    int64_t off = 0;
    for (size_t k = 0; k < ps.size(); ++k) {
      REQUIRE(ps[k].shape() == Shape{3, sizes[k]});
      REQUIRE(ps[k].data_ptr() == static_cast<void*>(x.data<double>() + off));  // a view
      std::vector<double> ref;
      for (int i = 0; i < 3; ++i)
        for (int64_t j = 0; j < sizes[k]; ++j) ref.push_back(xv[i * 10 + off + j]);
      REQUIRE_CLOSE(ps[k], ref, 0, 0);
      off += sizes[k];
    }
  };
  check_pieces(split(x, 3, 1), {3, 3, 3, 1});
  check_pieces(split(x, 10, -1), {10});
  check_pieces(split(x, 20, -1), {10});
  check_pieces(split(x, {4, 0, 5, 1}, 1), {4, 0, 5, 1});
  check_pieces(chunk(x, 4, -1), {3, 3, 3, 1});
  check_pieces(chunk(x, 3, 1), {4, 4, 2});
  check_pieces(chunk(x, 10, 1), {1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  check_pieces(chunk(x, 12, 1), {1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  check_pieces(chunk(x.narrow(1, 0, 6), 4, 1), {2, 2, 2});  // torch.chunk: fewer chunks
  auto rows = chunk(x, 2, 0);
  REQUIRE(rows.size() == 2);
  REQUIRE(rows[0].shape() == Shape{2, 10});
  REQUIRE(rows[1].shape() == Shape{1, 10});
}

TEST_CASE("embedding looks up rows for ids of any shape", "[cpu]") {
  Tensor w = noncontig(rand({7, 4}, DType::kF64, 43));
  auto wv = w.to_vector<double>();
  for (DType it : {DType::kI64, DType::kI32}) {
    Tensor ids = from_vector<int64_t>({6, 0, 3, 3, 1, 6}, {2, 3}, TensorOptions(it));
    Tensor y = embedding(w, ids);
    REQUIRE(y.shape() == Shape{2, 3, 4});
    std::vector<double> ref;
    for (int64_t id : ids.to_vector<int64_t>())
      for (int c = 0; c < 4; ++c) ref.push_back(wv[id * 4 + c]);
    REQUIRE_CLOSE(y, ref, 0, 0);
    REQUIRE(embedding(w, scalar_tensor(2, it)).shape() == Shape{4});
  }
}

// ---- gradients ----

namespace {
Tensor leaf(const Shape& s, uint64_t seed) {
  Tensor t = noncontig(rand(s, DType::kF64, seed));
  t.requires_grad_();
  return t;
}
}  // namespace

TEST_CASE("gradcheck index_select, index_add, gather, scatter_add", "[cpu]") {
  Tensor idx = from_vector<int64_t>({3, 0, 3, 1, 3}, {5}, TensorOptions(DType::kI32));
  REQUIRE_GRADCHECK([&](const auto& in) { return index_select(in[0], 1, idx); }, {leaf({3, 4, 2}, 50)});
  REQUIRE_GRADCHECK([&](const auto& in) { return index_add(in[0], -2, idx, in[1], 0.7); },
                    {leaf({3, 4, 2}, 51), leaf({3, 5, 2}, 52)});
  Tensor gi = rand_index({2, 5, 3}, 4, DType::kI64, 53);
  REQUIRE_GRADCHECK([&](const auto& in) { return gather(in[0], 1, gi); }, {leaf({3, 4, 3}, 54)});
  REQUIRE_GRADCHECK([&](const auto& in) { return scatter_add(in[0], 1, gi, in[1]); },
                    {leaf({3, 4, 3}, 55), leaf({2, 6, 4}, 56)});  // src larger than the index
  REQUIRE_GRADCHECK([&](const auto& in) { return scatter_add(in[0], -1, gi, in[1]); },
                    {leaf({2, 5, 4}, 57), leaf({2, 5, 3}, 58)});
}

TEST_CASE("gradcheck topk values", "[cpu]") {
  REQUIRE_GRADCHECK([](const auto& in) { return topk(in[0], 3, 1).first; }, {leaf({3, 6, 2}, 60)});
  REQUIRE_GRADCHECK([](const auto& in) { return topk(in[0], 2, -1, TopkOrder::kSmallest).first; },
                    {leaf({4, 5}, 61)});
}

TEST_CASE("gradcheck cat, stack, split, chunk, embedding", "[cpu]") {
  REQUIRE_GRADCHECK([](const auto& in) { return cat({in[0], in[1], in[2]}, 1); },
                    {leaf({2, 3, 2}, 70), leaf({2, 1, 2}, 71), leaf({2, 4, 2}, 72)});
  // Mixed: an input without grad and one of another dtype.
  Tensor c = rand({2, 2}, DType::kF32, 73);
  REQUIRE_GRADCHECK([&](const auto& in) { return cat({c, in[0]}, 0); }, {leaf({3, 2}, 74)});
  REQUIRE_GRADCHECK([](const auto& in) { return stack({in[0], in[1]}, -1); }, {leaf({3, 2}, 75), leaf({3, 2}, 76)});
  REQUIRE_GRADCHECK(
      [](const auto& in) {
        auto ps = split(in[0], 2, 1);  // pieces 2, 2, 1
        return cat({mul(ps[2], 3.0), ps[0], mul(ps[1], -2.0)}, 1);
      },
      {leaf({3, 5}, 77)});
  REQUIRE_GRADCHECK([](const auto& in) { return mul(split(in[0], {1, 3}, 0)[1], 2.0); }, {leaf({4, 3}, 78)});
  REQUIRE_GRADCHECK([](const auto& in) { return mul(chunk(in[0], 3, -1)[2], 5.0); }, {leaf({2, 7}, 79)});
  Tensor ids = from_vector<int64_t>({4, 0, 4, 2, 4, 1}, {3, 2});
  REQUIRE_GRADCHECK([&](const auto& in) { return embedding(in[0], ids); }, {leaf({5, 3}, 80)});
}

TEST_CASE("embedding backward accumulates duplicate ids into weight.grad", "[cpu]") {
  Tensor w = rand({4, 2}, DType::kF64, 81);
  w.requires_grad_();
  Tensor ids = from_vector<int64_t>({1, 3, 1, 1}, {4}, TensorOptions(DType::kI32));
  sum(embedding(w, ids)).backward();
  REQUIRE_CLOSE(w.grad(), {0, 0, 3, 3, 0, 0, 1, 1}, 0, 0);
}

// ---- errors ----

TEST_CASE("out-of-range indices name the op, the value and the range", "[cpu]") {
  using Catch::Contains;
  Tensor x = rand({3, 5}, DType::kF64, 90);
  REQUIRE_THROWS_WITH(index_select(x, 1, idx64({0, 7, 2})),
                      Contains("index_select") && Contains("index 7") && Contains("[0, 5)"));
  REQUIRE_THROWS_WITH(index_select(x, 0, idx64({-1})), Contains("index_select") && Contains("index -1") &&
                                                           Contains("[0, 3)"));
  REQUIRE_THROWS_WITH(index_add(x, 0, idx64({3}), rand({1, 5}, DType::kF64, 91)),
                      Contains("index_add") && Contains("index 3") && Contains("[0, 3)"));
  REQUIRE_THROWS_WITH(gather(x, 1, idx64({0, 5}, {1, 2})),
                      Contains("gather") && Contains("index 5") && Contains("[0, 5)"));
  REQUIRE_THROWS_WITH(scatter_add(x, 0, idx64({4, 0}, {1, 2}), x),
                      Contains("scatter_add") && Contains("index 4") && Contains("[0, 3)"));
  REQUIRE_THROWS_WITH(embedding(x, from_vector<int64_t>({0, 3}, {2}, TensorOptions(DType::kI32))),
                      Contains("embedding") && Contains("index 3") && Contains("[0, 3)"));
  REQUIRE_THROWS_WITH(one_hot(idx64({1, 6}), 4), Contains("one_hot") && Contains("index 6") && Contains("[0, 4)"));
}

TEST_CASE("bad shapes and dtypes throw naming the op and the shapes", "[cpu]") {
  using Catch::Contains;
  Tensor x = rand({2, 3}, DType::kF64, 92);
  REQUIRE_THROWS_WITH(cat({x, rand({3, 3}, DType::kF64, 93)}, 1),
                      Contains("cat") && Contains("[3, 3]") && Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(cat({x, rand({2, 3, 1}, DType::kF64, 93)}), Contains("cat") && Contains("[2, 3, 1]"));
  REQUIRE_THROWS_WITH(cat({}), Contains("cat"));
  REQUIRE_THROWS_WITH(stack({x, rand({3, 2}, DType::kF64, 94)}),
                      Contains("stack") && Contains("[3, 2]") && Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(split(x, {1, 1}, 1), Contains("split") && Contains("sum to 2") && Contains("size 3"));
  REQUIRE_THROWS_WITH(chunk(x, 0), Contains("chunk"));
  REQUIRE_THROWS_WITH(topk(x, 4, 1), Contains("topk") && Contains("k = 4"));
  REQUIRE_THROWS_WITH(index_select(x, 0, from_vector<float>({0.f})), Contains("index_select") && Contains("f32"));
  REQUIRE_THROWS_WITH(index_select(x, 0, idx64({0, 1}, {1, 2})), Contains("index_select") && Contains("1-D"));
  REQUIRE_THROWS_WITH(index_add(x, 0, idx64({0}), rand({1, 4}, DType::kF64, 95)),
                      Contains("index_add") && Contains("[1, 4]") && Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(gather(x, 0, idx64({0, 0, 0, 0}, {1, 4})),
                      Contains("gather") && Contains("[1, 4]") && Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(scatter_add(x, 0, idx64({0, 0, 0}, {1, 3}), rand({1, 2}, DType::kF64, 96)),
                      Contains("scatter_add") && Contains("[1, 3]") && Contains("[1, 2]"));
  REQUIRE_THROWS_WITH(embedding(rand({3}, DType::kF64, 97), idx64({0})), Contains("embedding") && Contains("2-D"));
  REQUIRE_THROWS_WITH(index_select(x, 2, idx64({0})), Contains("index_select"));
}
