// 8-bit AdamW (optim/adamw8bit.h): the 8-bit codes' round-trip bound, the kernel against a
// straightforward per-block loop written here, its two-phase form on pieces that share blocks
// against its one-call form, convergence next to f32 AdamW on a small MLP
// regression, bit-exact resume from state_dict, the state's size, and bad state.
#include "testing.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant8.h"
#include "q8_pieces.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "tensor/ops.h"

using namespace mt;

namespace {

std::vector<float> values(const Tensor& t) {
  Tensor c = t.detach().contiguous();
  std::vector<float> out(static_cast<size_t>(c.numel()));
  std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(float));
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor x = a.detach().contiguous(), y = b.detach().contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel()) * dtype_size(x.dtype())) == 0;
}

NamedTensors make_params() {
  // A quantized matrix whose last block is short (70 rows: 32 + 32 + 6), a quantized 1-D tensor
  // (5000 elements: blocks of 256, the last 136), a small matrix and a small vector (f32 moments).
  NamedTensors out;
  std::vector<std::pair<std::string, Shape>> specs = {
      {"w", Shape{70, 64}}, {"long_bias", Shape{5000}}, {"small", Shape{8, 9}}, {"norm", Shape{12}}};
  uint64_t seed = 11;
  for (auto& [name, shape] : specs) {
    Tensor t = mt::testing::rand(shape, DType::kF32, seed++);
    t.requires_grad_();
    out.emplace_back(name, t);
  }
  return out;
}

Tensor grad_for(const Tensor& p, size_t k, int step) {
  // Gradients over several orders of magnitude, so the codes' dynamic range matters.
  Tensor g = mt::testing::rand(p.shape(), DType::kF32, 1000 + 37 * k + static_cast<uint64_t>(step));
  Tensor s = mt::testing::rand(p.shape(), DType::kF32, 5000 + 37 * k + static_cast<uint64_t>(step), -4, 0);
  return mul(g, exp(mul(s, std::log(10.0)))).contiguous();
}

void run_steps(AdamW8bit& opt, NamedTensors& params, int first, int last) {
  for (int s = first; s < last; ++s) {
    for (size_t k = 0; k < params.size(); ++k) params[k].second.set_grad(grad_for(params[k].second, k, s));
    opt.step();
  }
}

}  // namespace

TEST_CASE("adamw8bit: code round trip within the stated bound") {
  const float absmax = 3.5f;
  for (int i = 0; i <= 20000; ++i) {
    // r from 0 to 1, denser near 0 (the interesting end).
    const double r = std::pow(static_cast<double>(i) / 20000.0, 4.0);
    for (float sign : {1.0f, -1.0f}) {
      const float x = sign * static_cast<float>(r) * absmax;
      const float m = quant8::decode_m(quant8::encode_m(x, absmax), absmax);
      const double a = std::min(1.0, std::sqrt(r) + 0.5 / 127);
      REQUIRE(std::fabs(m - x) <= absmax * (a * a - r) * (1 + 1e-5) + 1e-6 * absmax);
      REQUIRE((m == 0 || (m < 0) == (x < 0)));
    }
    const float v = static_cast<float>(r) * absmax;
    const float vd = quant8::decode_v(quant8::encode_v(v, absmax), absmax);
    const double a = std::min(1.0, std::max(std::pow(r, 0.25) + 0.5 / 255, 1.0 / 255));
    REQUIRE(std::fabs(vd - v) <= absmax * (a * a * a * a - r) * (1 + 1e-5) + 1e-6 * absmax);
    REQUIRE((v > 0 ? vd >= v * (1 - 1e-6) || vd >= absmax * std::pow(0.5 / 255, 4) : vd == 0));
    if (v > 0) REQUIRE(vd > 0);
  }
  // The block's largest value decodes exactly; zeros stay zero; an all-zero block has codes 0.
  CHECK(quant8::decode_m(quant8::encode_m(-absmax, absmax), absmax) == -absmax);
  CHECK(quant8::decode_v(quant8::encode_v(absmax, absmax), absmax) == absmax);
  CHECK(quant8::encode_m(0.0f, absmax) == 0);
  CHECK(quant8::encode_m(1.0f, 0.0f) == 0);
  CHECK(quant8::encode_v(0.0f, absmax) == 0);
  // Relative precision where it matters: v at 1e-6 of the absmax keeps its order of magnitude,
  // so sqrt(v) in AdamW's denominator is never rounded to 0 while m is not.
  const float tiny = 1e-6f * absmax;
  const float tiny_d = quant8::decode_v(quant8::encode_v(tiny, absmax), absmax);
  CHECK(tiny_d > 0.5f * tiny);
  CHECK(tiny_d < 2.0f * tiny);
}

TEST_CASE("adamw8bit: the kernel equals a per-block reference loop, bit for bit") {
  NamedTensors params = make_params();
  NamedTensors ref;
  for (auto& [n, p] : params) ref.emplace_back(n, p.detach().clone());
  AdamWOptions o;
  o.lr = 1e-2;
  o.beta2 = 0.95;
  std::vector<ParamGroup> groups(2);
  groups[0].params = {params[0], params[1]};
  groups[0].weight_decay = 0.1;
  groups[1].params = {params[2], params[3]};
  AdamW8bit opt(groups, o);
  // The reference: f32 moments for the small tensors, codes + per-block absmax for the others,
  // the same f32 operations in the same order (the build has -ffp-contract=off).
  struct RefState {
    std::vector<float> m, v;            // f32 (small) or decoded scratch
    std::vector<uint8_t> mq, vq;
    std::vector<float> am_m, am_v;      // per block
  };
  std::vector<RefState> st(ref.size());
  for (size_t k = 0; k < ref.size(); ++k) {
    const size_t n = static_cast<size_t>(ref[k].second.numel());
    st[k].m.assign(n, 0);
    st[k].v.assign(n, 0);
    st[k].mq.assign(n, 0);
    st[k].vq.assign(n, 0);
    st[k].am_m.assign(n, 0);
    st[k].am_v.assign(n, 0);
  }
  for (int s = 0; s < 6; ++s) {
    for (size_t k = 0; k < params.size(); ++k) params[k].second.set_grad(grad_for(params[k].second, k, s));
    opt.step();
    const double t = s + 1;
    for (size_t k = 0; k < ref.size(); ++k) {
      const Shape shape = ref[k].second.shape();
      const double wd = k < 2 ? 0.1 : 0.0;
      const float decay = static_cast<float>(1 - o.lr * wd), b1 = 0.9f, b2 = 0.95f;
      const float one_b1 = static_cast<float>(1 - 0.9), one_b2 = static_cast<float>(1 - 0.95);
      const float step_size = static_cast<float>(o.lr / (1 - std::pow(0.9, t)));
      const float bc2 = static_cast<float>(std::sqrt(1 - std::pow(0.95, t))), eps = 1e-8f;
      std::vector<float> w = values(ref[k].second), g = values(grad_for(ref[k].second, k, s));
      RefState& r = st[k];
      const bool q = shape.numel() >= 4096;
      const int64_t n = shape.numel(), rn = q ? n / shape[0] : n, br = shape.size() == 1 ? 256 : 32;
      const int64_t block = q ? br * rn : n;
      for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
        const int64_t b1e = std::min(n, b0 + block);
        float nm = 0, nv = 0;
        for (int64_t i = b0; i < b1e; ++i) {
          const float mo = q ? quant8::decode_m(r.mq[i], r.am_m[bi]) : r.m[i];
          const float vo = q ? quant8::decode_v(r.vq[i], r.am_v[bi]) : r.v[i];
          const float mi = b1 * mo + one_b1 * g[i];
          const float vi = b2 * vo + one_b2 * g[i] * g[i];
          w[i] = w[i] * decay - step_size * (mi / (std::sqrt(vi) / bc2 + eps));
          r.m[i] = mi;
          r.v[i] = vi;
          nm = std::max(nm, std::fabs(mi));
          nv = std::max(nv, vi);
        }
        if (!q) continue;
        for (int64_t i = b0; i < b1e; ++i) {
          r.mq[i] = quant8::encode_m(r.m[i], nm);
          r.vq[i] = quant8::encode_v(r.v[i], nv);
        }
        r.am_m[bi] = nm;
        r.am_v[bi] = nv;
      }
      ref[k].second = from_vector<float>(w, shape);
    }
  }
  for (size_t k = 0; k < params.size(); ++k) {
    INFO(params[k].first);
    CHECK(bitwise_equal(params[k].second, ref[k].second));
  }
  // The codes in the state_dict are the reference's.
  NamedTensors sd = opt.state_dict();
  auto find = [&](const std::string& key) {
    for (auto& [k, t] : sd)
      if (k == key) return t;
    FAIL("no key " << key);
    return Tensor();
  };
  CHECK(bitwise_equal(find("exp_avg_q.w"), from_vector<uint8_t>(st[0].mq, Shape{70, 64}, DType::kU8)));
  CHECK(bitwise_equal(find("exp_avg_sq_q.long_bias"), from_vector<uint8_t>(st[1].vq, Shape{5000}, DType::kU8)));
  std::vector<float> am = values(find("absmax.w"));
  for (int64_t row = 0; row < 70; ++row) {
    CHECK(am[static_cast<size_t>(2 * row)] == st[0].am_m[static_cast<size_t>(row / 32)]);
    CHECK(am[static_cast<size_t>(2 * row + 1)] == st[0].am_v[static_cast<size_t>(row / 32)]);
  }
  CHECK(bitwise_equal(find("exp_avg.small"), from_vector<float>(st[2].m, Shape{8, 9})));
}

TEST_CASE("adamw8bit: the two-phase kernel on pieces that share blocks gives the one-call bits") {
  // Rows off the 32-row block edges and a column cut (tests/common/q8_pieces.h), 6 steps.
  CHECK(mt::testing::q8_pieces_match(Device::cpu(), 70, 24, mt::testing::q8_test_pieces(), 6));
  // A piece with no rows, and one 32-row block cut into three row pieces.
  CHECK(mt::testing::q8_pieces_match(Device::cpu(), 32, 8, {{0, 5, 0, 8}, {5, 0, 0, 8}, {5, 20, 0, 8}, {25, 7, 0, 8}},
                                     3));
}

TEST_CASE("adamw8bit: trains a small MLP like f32 AdamW") {
  // Teacher-student regression: y = W2* tanh(W1* x + b1*), the student starts elsewhere. W1 [128, 64]
  // and W2 [32, 128] get 8-bit moments, b1 [128] keeps f32 moments.
  const Tensor x = mt::testing::rand(Shape{256, 64}, DType::kF32, 1);
  const Tensor w1t = mt::testing::rand(Shape{128, 64}, DType::kF32, 2, -0.3, 0.3);
  const Tensor b1t = mt::testing::rand(Shape{128}, DType::kF32, 3);
  const Tensor w2t = mt::testing::rand(Shape{32, 128}, DType::kF32, 4, -0.3, 0.3);
  auto forward = [&](const Tensor& w1, const Tensor& b1, const Tensor& w2) {
    return matmul(tanh(add(matmul(x, w1.t()), b1)), w2.t());
  };
  const Tensor y = forward(w1t, b1t, w2t).detach();
  auto train = [&](bool eight, int steps, int64_t* state_bytes) {
    NamedTensors ps = {{"w1", mt::testing::rand(Shape{128, 64}, DType::kF32, 5, -0.3, 0.3)},
                       {"b1", mt::testing::rand(Shape{128}, DType::kF32, 6)},
                       {"w2", mt::testing::rand(Shape{32, 128}, DType::kF32, 7, -0.3, 0.3)}};
    for (auto& [n, p] : ps) p.requires_grad_();
    AdamWOptions o;
    o.lr = 1e-2;
    o.beta2 = 0.95;
    std::unique_ptr<Optimizer> opt;
    if (eight)
      opt = std::make_unique<AdamW8bit>(make_param_groups(ps, 0.01), o);
    else
      opt = std::make_unique<AdamW>(make_param_groups(ps, 0.01), o);
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
      Tensor d = sub(forward(ps[0].second, ps[1].second, ps[2].second), y);
      Tensor loss = mean(mul(d, d));
      losses.push_back(loss.item());
      loss.backward();
      opt->step();
      opt->zero_grad();
    }
    if (state_bytes) {
      int64_t b = 0;
      if (eight) {
        b = static_cast<AdamW8bit&>(*opt).state_bytes();
      } else {
        for (auto& [k, t] : opt->state_dict())
          if (k.rfind("exp_avg", 0) == 0) b += t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
      }
      *state_bytes = b;
    }
    return losses;
  };
  int64_t bytes8 = 0, bytes32 = 0;
  const std::vector<double> l8 = train(true, 300, &bytes8), l32 = train(false, 300, &bytes32);
  const double first = l32.front(), last8 = l8.back(), last32 = l32.back();
  WARN("MLP regression, 300 steps: f32 AdamW loss " << first << " -> " << last32 << ", 8-bit " << l8.front()
                                                     << " -> " << last8 << "; optimizer state " << bytes32
                                                     << " bytes (f32) vs " << bytes8 << " (8-bit)");
  CHECK(l8.front() == first);
  CHECK(last32 < first / 50);
  CHECK(last8 < first / 50);
  // Stated tolerance: the final 8-bit loss is within 50% of the f32 run's (measured: 1.73e-4 vs 1.45e-4,
  // from 2.76), and every step's loss within 2% of the starting loss.
  CHECK(std::fabs(last8 - last32) <= 0.5 * last32);
  for (size_t s = 0; s < l8.size(); ++s) CHECK(std::fabs(l8[s] - l32[s]) <= 0.02 * first);
  // Memory: 2 bytes per quantized element + 8 per row, against 8 bytes per element.
  CHECK(bytes32 == (128 * 64 + 128 + 32 * 128) * 8);
  CHECK(bytes8 == (128 * 64 + 32 * 128) * 2 + (128 + 32) * 8 + 128 * 8);
}

TEST_CASE("adamw8bit: a v rounded below its block's smallest code never divides m by eps") {
  // One 32-row block. Row 0 gets one huge gradient (its v then dominates the block's absmax for
  // hundreds of steps, its m for a few dozen); rows 1..31 then get gradients 1e6 times smaller,
  // whose v is under half the smallest nonzero code (absmax (1/255)^4), and finally none (an
  // embedding row of an absent token). Once row 0's m has decayed, the rows' m codes are nonzero;
  // a v coded 0 would make the step m / eps. Positive v is coded at least 1 (never smaller than
  // it was), so no step is larger than f32 AdamW's largest on the same gradients.
  auto run = [](bool eight) {
    NamedTensors ps = {{"w", zeros(Shape{32, 128}, TensorOptions(DType::kF32))}};
    ps[0].second.requires_grad_();
    AdamWOptions o;
    o.lr = 1e-3;
    std::unique_ptr<Optimizer> opt;
    if (eight)
      opt = std::make_unique<AdamW8bit>(make_param_groups(ps, 0.0), o);
    else
      opt = std::make_unique<AdamW>(make_param_groups(ps, 0.0), o);
    double largest = 0;
    bool clamped = false;  // a v coded 1 by the clamp (tests/cuda/test_cuda_optim.cpp runs this schedule)
    for (int s = 0; s < 45; ++s) {
      Tensor g = zeros(Shape{32, 128}, TensorOptions(DType::kF32));
      if (s == 0) g.narrow(0, 0, 1).fill_(1e6);
      else if (s < 35) g.narrow(0, 1, 31).fill_(1.0);
      const Tensor before = ps[0].second.detach().clone();
      ps[0].second.set_grad(g);
      opt->step();
      largest = std::max(largest, max(abs(sub(ps[0].second.detach(), before))).item());
      for (const auto& [name, t] : opt->state_dict())
        if (name.rfind("exp_avg_sq_q.", 0) == 0) {
          const std::vector<int64_t> codes = t.to(DType::kI64).to_vector<int64_t>();
          clamped |= std::count(codes.begin(), codes.end(), int64_t{1}) > 0;
        }
    }
    if (eight) CHECK(clamped);
    return largest;
  };
  const double f32 = run(false), q8 = run(true);
  INFO("largest step: f32 AdamW " << f32 << ", 8-bit " << q8);
  CHECK(f32 <= 1.1e-3);  // AdamW steps about lr at most
  CHECK(q8 <= 2 * f32);
}

TEST_CASE("adamw8bit: state_dict resumes bit for bit") {
  AdamWOptions o;
  o.lr = 3e-3;
  NamedTensors straight = make_params();
  AdamW8bit a(make_param_groups(straight, 0.1), o);
  run_steps(a, straight, 0, 6);

  NamedTensors first = make_params();
  AdamW8bit b(make_param_groups(first, 0.1), o);
  run_steps(b, first, 0, 3);
  NamedTensors saved_state, saved_params;
  for (auto& [k, t] : b.state_dict()) saved_state.emplace_back(k, t.clone());
  for (auto& [k, t] : first) saved_params.emplace_back(k, t.detach().clone());

  NamedTensors resumed = make_params();
  {
    NoGradGuard ng;
    for (size_t i = 0; i < resumed.size(); ++i) resumed[i].second.copy_(saved_params[i].second);
  }
  AdamW8bit c(make_param_groups(resumed, 0.1), o);
  c.load_state_dict(saved_state);
  CHECK(c.step_count() == 3);
  run_steps(c, resumed, 3, 6);
  for (size_t i = 0; i < straight.size(); ++i) {
    INFO(straight[i].first);
    CHECK(bitwise_equal(straight[i].second, resumed[i].second));
  }
  NamedTensors sa = a.state_dict(), sc = c.state_dict();
  REQUIRE(sa.size() == sc.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(sa[i].first == sc[i].first);
    CHECK(bitwise_equal(sa[i].second, sc[i].second));
  }
  // The keys: codes and absmax for the large tensors, f32 moments for the small ones.
  std::vector<std::string> keys;
  for (auto& [k, t] : sa) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"step", "exp_avg_q.w", "exp_avg_sq_q.w", "absmax.w",
                                         "exp_avg.small", "exp_avg_sq.small", "exp_avg_q.long_bias",
                                         "exp_avg_sq_q.long_bias", "absmax.long_bias", "exp_avg.norm",
                                         "exp_avg_sq.norm", "step.w", "step.small", "step.long_bias",
                                         "step.norm"});
}

TEST_CASE("adamw8bit: bad state and parameters") {
  NamedTensors params = make_params();
  AdamW8bit opt(make_param_groups(params, 0.1), AdamWOptions{});
  NamedTensors sd;
  for (auto& [k, t] : opt.state_dict())
    if (k != "absmax.w") sd.emplace_back(k, k == "exp_avg_q.long_bias" ? zeros(Shape{4999}, DType::kU8) : t.clone());
  CHECK_THROWS_WITH(opt.load_state_dict(sd), Catch::Contains("missing keys: absmax.w") &&
                                                 Catch::Contains("'exp_avg_q.long_bias' is"));
  Tensor f64 = mt::testing::rand(Shape{64, 64}, DType::kF64, 1);
  f64.requires_grad_();
  CHECK_THROWS_WITH(AdamW8bit(make_param_groups({{"x", f64}}, 0), AdamWOptions{}),
                    Catch::Contains("takes contiguous f32 parameters"));
}
