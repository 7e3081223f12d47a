// Muon (optim/muon.h) against a straightforward double-precision implementation written here
// (naive loops: momentum, Nesterov, Newton-Schulz with Keller Jordan's coefficients, the
// 0.2 sqrt(max(rows, cols)) scale, AdamW for the embedding and the norm), bit-exact resume from
// state_dict, which parameters get Muon, and training a small MLP.
#include "testing.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "optim/adamw.h"
#include "optim/muon.h"
#include "tensor/ops.h"

using namespace mt;

namespace {

using Mat = std::vector<double>;  // row-major

std::vector<double> to_doubles(const Tensor& t) {
  Tensor c = t.detach().to(DType::kF64).contiguous();
  std::vector<double> out(static_cast<size_t>(c.numel()));
  std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(double));
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor x = a.detach().contiguous(), y = b.detach().contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel()) * dtype_size(x.dtype())) == 0;
}

Mat matmul_ref(const Mat& a, const Mat& b, int64_t n, int64_t k, int64_t m) {  // [n,k] x [k,m]
  Mat c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += a[static_cast<size_t>(i * k + l)] * b[static_cast<size_t>(l * m + j)];
      c[static_cast<size_t>(i * m + j)] = s;
    }
  return c;
}

Mat transpose_ref(const Mat& a, int64_t n, int64_t m) {
  Mat t(a.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) t[static_cast<size_t>(j * n + i)] = a[static_cast<size_t>(i * m + j)];
  return t;
}

// Keller Jordan's Newton-Schulz, written out.
Mat ns_ref(Mat g, int64_t rows, int64_t cols) {
  const bool tall = rows > cols;
  if (tall) {
    g = transpose_ref(g, rows, cols);
    std::swap(rows, cols);
  }
  double norm = 0;
  for (double x : g) norm += x * x;
  norm = std::sqrt(norm);
  for (double& x : g) x /= norm + 1e-7;
  for (int k = 0; k < 5; ++k) {
    Mat a = matmul_ref(g, transpose_ref(g, rows, cols), rows, cols, rows);
    Mat aa = matmul_ref(a, a, rows, rows, rows);
    Mat b(a.size());
    for (size_t i = 0; i < a.size(); ++i) b[i] = -4.7750 * a[i] + 2.0315 * aa[i];
    Mat bx = matmul_ref(b, g, rows, rows, cols);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 3.4445 * g[i] + bx[i];
  }
  return tall ? transpose_ref(g, rows, cols) : g;
}

NamedTensors make_params() {
  NamedTensors out;
  std::vector<std::pair<std::string, Shape>> specs = {{"model.layers.0.mlp.up_proj.weight", Shape{48, 40}},
                                                      {"model.layers.0.mlp.down_proj.weight", Shape{24, 48}},
                                                      {"model.embed_tokens.weight", Shape{30, 16}},
                                                      {"model.norm.weight", Shape{16}}};
  uint64_t seed = 21;
  for (auto& [name, shape] : specs) {
    Tensor t = mt::testing::rand(shape, DType::kF32, seed++);
    t.requires_grad_();
    out.emplace_back(name, t);
  }
  return out;
}

Tensor grad_for(const Tensor& p, size_t k, int step) {
  return mt::testing::rand(p.shape(), DType::kF32, 300 + 17 * k + static_cast<uint64_t>(step));
}

void run_steps(Muon& opt, NamedTensors& params, int first, int last) {
  for (int s = first; s < last; ++s) {
    for (size_t k = 0; k < params.size(); ++k) params[k].second.set_grad(grad_for(params[k].second, k, s));
    opt.step();
  }
}

}  // namespace

TEST_CASE("muon: newton_schulz5 equals the written-out iteration and flattens the spectrum") {
  for (Shape shape : {Shape{48, 40}, Shape{24, 48}, Shape{32, 32}}) {
    Tensor g = mt::testing::rand(shape, DType::kF32, 5);
    Tensor o = newton_schulz5(g);
    Mat want = ns_ref(to_doubles(g), shape[0], shape[1]);
    std::vector<double> got = to_doubles(o);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    INFO(fmt::format("{}", shape));
    CHECK(worst <= 2e-5);
    // Orthogonalized: o o^T (wide) or o^T o (tall) has a diagonal near 1 (the quintic's fixed
    // band is about [0.7, 1.2] for every singular value).
    const int64_t m = std::min(shape[0], shape[1]);
    Tensor gram = shape[0] > shape[1] ? matmul(o.t(), o) : matmul(o, o.t());
    std::vector<double> d = to_doubles(gram);
    for (int64_t i = 0; i < m; ++i) {
      CHECK(d[static_cast<size_t>(i * m + i)] > 0.4);
      CHECK(d[static_cast<size_t>(i * m + i)] < 1.5);
    }
  }
}

TEST_CASE("muon: matches a straightforward implementation; AdamW for embeddings and norms") {
  CHECK(Muon::uses_muon("model.layers.0.mlp.up_proj.weight", Shape{48, 40}));
  CHECK_FALSE(Muon::uses_muon("model.embed_tokens.weight", Shape{30, 16}));
  CHECK_FALSE(Muon::uses_muon("lm_head.weight", Shape{30, 16}));
  CHECK_FALSE(Muon::uses_muon("model.norm.weight", Shape{16}));
  CHECK_FALSE(Muon::uses_muon("experts.w1", Shape{4, 8, 8}));
  CHECK(Muon::shape_scale(24, 48) == 0.2 * std::sqrt(48.0));

  NamedTensors params = make_params();
  std::vector<std::vector<double>> ref, buf, m, v;
  for (auto& [n, p] : params) {
    ref.push_back(to_doubles(p));
    buf.emplace_back(ref.back().size(), 0.0);
    m.emplace_back(ref.back().size(), 0.0);
    v.emplace_back(ref.back().size(), 0.0);
  }
  MuonOptions o;
  o.lr = 0.01;
  const double wd = 0.1;
  Muon opt(make_param_groups(params, wd), o);
  for (int s = 0; s < 4; ++s) {
    for (size_t k = 0; k < params.size(); ++k) params[k].second.set_grad(grad_for(params[k].second, k, s));
    opt.step();
    for (size_t k = 0; k < params.size(); ++k) {
      const Shape shape = params[k].second.shape();
      const std::vector<double> g = to_doubles(grad_for(params[k].second, k, s));
      const double decay = 1 - o.lr * (shape.size() >= 2 ? wd : 0.0);  // make_param_groups: matrices decay
      if (Muon::uses_muon(params[k].first, shape)) {
        Mat u(g.size());
        for (size_t i = 0; i < g.size(); ++i) {
          buf[k][i] = 0.95 * buf[k][i] + g[i];
          u[i] = g[i] + 0.95 * buf[k][i];
        }
        Mat ortho = ns_ref(u, shape[0], shape[1]);
        const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(shape[0], shape[1])));
        for (size_t i = 0; i < g.size(); ++i) ref[k][i] = ref[k][i] * decay - o.lr * scale * ortho[i];
      } else {
        const double t = s + 1;
        for (size_t i = 0; i < g.size(); ++i) {
          m[k][i] = 0.9 * m[k][i] + 0.1 * g[i];
          v[k][i] = 0.95 * v[k][i] + 0.05 * g[i] * g[i];
          const double mh = m[k][i] / (1 - std::pow(0.9, t)), vh = v[k][i] / (1 - std::pow(0.95, t));
          ref[k][i] = ref[k][i] * decay - o.lr * mh / (std::sqrt(vh) + 1e-8);
        }
      }
    }
  }
  for (size_t k = 0; k < params.size(); ++k) {
    std::vector<double> got = to_doubles(params[k].second);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[k][i]));
    INFO(params[k].first << ": max |f32 Muon - f64 reference| = " << worst);
    CHECK(worst <= 1e-5);  // stated tolerance: f32 rounding over 4 steps (parameters of order 1)
  }
}

TEST_CASE("muon: state_dict resumes bit for bit") {
  MuonOptions o;
  o.lr = 0.01;
  NamedTensors straight = make_params();
  Muon a(make_param_groups(straight, 0.1), o);
  run_steps(a, straight, 0, 6);
  NamedTensors first = make_params();
  Muon b(make_param_groups(first, 0.1), o);
  run_steps(b, first, 0, 3);
  NamedTensors saved;
  for (auto& [k, t] : b.state_dict()) saved.emplace_back(k, t.clone());
  NamedTensors resumed = make_params();
  {
    NoGradGuard ng;
    for (size_t i = 0; i < resumed.size(); ++i) resumed[i].second.copy_(first[i].second.detach());
  }
  Muon c(make_param_groups(resumed, 0.1), o);
  c.load_state_dict(saved);
  run_steps(c, resumed, 3, 6);
  for (size_t i = 0; i < straight.size(); ++i) {
    INFO(straight[i].first);
    CHECK(bitwise_equal(straight[i].second, resumed[i].second));
  }
  std::vector<std::string> keys;
  for (auto& [k, t] : a.state_dict()) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"step", "momentum_buffer.model.layers.0.mlp.up_proj.weight",
                                         "momentum_buffer.model.layers.0.mlp.down_proj.weight",
                                         "exp_avg.model.embed_tokens.weight", "exp_avg_sq.model.embed_tokens.weight",
                                         "exp_avg.model.norm.weight", "exp_avg_sq.model.norm.weight",
                                         "step.model.layers.0.mlp.up_proj.weight",
                                         "step.model.layers.0.mlp.down_proj.weight",
                                         "step.model.embed_tokens.weight", "step.model.norm.weight"});
  NamedTensors bad = saved;
  bad.erase(bad.begin() + 1);
  CHECK_THROWS_WITH(c.load_state_dict(bad), Catch::Contains("missing keys: momentum_buffer.model.layers.0.mlp.up_proj"));
}

TEST_CASE("muon: trains a small MLP") {
  const Tensor x = mt::testing::rand(Shape{256, 64}, DType::kF32, 1);
  const Tensor w1t = mt::testing::rand(Shape{128, 64}, DType::kF32, 2, -0.3, 0.3);
  const Tensor w2t = mt::testing::rand(Shape{32, 128}, DType::kF32, 4, -0.3, 0.3);
  const Tensor y = matmul(tanh(matmul(x, w1t.t())), w2t.t()).detach();
  NamedTensors ps = {{"w1", mt::testing::rand(Shape{128, 64}, DType::kF32, 5, -0.3, 0.3)},
                     {"w2", mt::testing::rand(Shape{32, 128}, DType::kF32, 7, -0.3, 0.3)}};
  for (auto& [n, p] : ps) p.requires_grad_();
  MuonOptions o;
  o.lr = 3e-3;
  Muon opt(make_param_groups(ps, 0), o);
  double first = 0, last = 0;
  for (int s = 0; s < 200; ++s) {
    Tensor d = sub(matmul(tanh(matmul(x, ps[0].second.t())), ps[1].second.t()), y);
    Tensor loss = mean(mul(d, d));
    (s == 0 ? first : last) = loss.item();
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  WARN("Muon MLP regression: loss " << first << " -> " << last << " in 200 steps");
  CHECK(last < first / 20);
}
