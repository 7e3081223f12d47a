// Implementation of the shared test helpers.
#include "testing.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "runtime/error.h"

namespace mt::testing {

TempDir::TempDir() {
  static int counter = 0;
  path = std::filesystem::temp_directory_path() /
         fmt::format("mt_test_{}_{}_{}", static_cast<long>(::getpid()), counter++, std::random_device{}());
  std::filesystem::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string TempDir::write(const std::string& name, const std::string& text) const {
  std::ofstream(file(name)) << text;
  return file(name);
}

std::vector<std::string> TempDir::listing() const {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

Tensor rand(const Shape& shape, DType dtype, uint64_t seed, double lo, double hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (auto& x : v) x = dist(gen);
  return from_vector<double>(v, shape, TensorOptions(dtype));
}

Tensor noncontig(const Tensor& t) {
  if (t.dim() == 0) return t;
  NoGradGuard no_grad;
  Shape wide = t.shape();
  wide[wide.size() - 1] *= 2;
  Tensor big = full(wide, 12345.0, t.options());
  Tensor v = big.slice(-1, 0, wide.back(), 2);
  v.copy_(t);
  Tensor out = v.detach();
  if (t.requires_grad()) out.requires_grad_();
  return out;
}

namespace {
std::string where_str(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (int d = shape.size() - 1; d >= 0; --d) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}
}  // namespace

bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel()) * dtype_size(x.dtype())) == 0;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

CloseReport allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  CloseReport r;
  if (a.shape() != b.shape()) {
    r.ok = false;
    r.msg = fmt::format("shape mismatch: {} vs {}", a.desc(), b.desc());
    return r;
  }
  std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double worst = 0;
  int64_t worst_i = -1, bad = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    double d = std::fabs(va[i] - vb[i]);
    bool nan_ok = std::isnan(va[i]) && std::isnan(vb[i]);
    bool inf_ok = std::isinf(va[i]) && va[i] == vb[i];
    if (nan_ok || inf_ok) continue;
    if (!(d <= atol + rtol * std::fabs(vb[i]))) {
      ++bad;
      if (!(d <= worst)) {
        worst = d;
        worst_i = static_cast<int64_t>(i);
      }
    }
  }
  if (bad) {
    r.ok = false;
    r.msg = fmt::format("{} of {} elements differ (rtol {}, atol {}); worst at {}: {} vs {} (diff {})", bad,
                        va.size(), rtol, atol, where_str(a.shape(), worst_i), va[worst_i], vb[worst_i], worst);
  }
  return r;
}

CloseReport allclose(const Tensor& a, const std::vector<double>& b, double rtol, double atol) {
  return allclose(a, from_vector<double>(b, a.shape()), rtol, atol);
}

CloseReport gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                      const std::vector<Tensor>& inputs, double eps, double atol, double rtol) {
  CloseReport r;
  for (auto& x : inputs) {
    if (x.requires_grad() && x.dtype() != DType::kF64) {
      r.ok = false;
      r.msg = fmt::format("gradcheck needs f64 inputs, got {}", x.desc());
      return r;
    }
  }
  Tensor out0 = fn(inputs);
  Tensor w = rand(out0.shape(), DType::kF64, 99);
  auto objective = [&]() {
    NoGradGuard no_grad;
    return sum(mul(fn(inputs).to(DType::kF64), w)).item();
  };
  for (auto& x : inputs)
    if (x.requires_grad()) x.set_grad(Tensor());
  Tensor loss = sum(mul(out0.to(DType::kF64), w));
  loss.backward();
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    Tensor analytic = x.grad().defined() ? x.grad() : zeros_like(x);
    std::vector<double> num(static_cast<size_t>(x.numel()));
    auto* base = static_cast<double*>(x.data_ptr());
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t off = 0, rem = i;
      for (int d = x.dim() - 1; d >= 0; --d) {
        off += (rem % x.shape()[d]) * x.strides()[d];
        rem /= x.shape()[d];
      }
      double orig = base[off];
      base[off] = orig + eps;
      double fp = objective();
      base[off] = orig - eps;
      double fm = objective();
      base[off] = orig;
      num[static_cast<size_t>(i)] = (fp - fm) / (2 * eps);
    }
    CloseReport c = allclose(analytic, from_vector<double>(num, x.shape()), rtol, atol);
    if (!c.ok) {
      r.ok = false;
      r.msg += fmt::format("input {} ({}): analytic vs numeric: {}\n", k, x.desc(), c.msg);
    }
  }
  return r;
}

std::string plans_dir() {
  const char* d = std::getenv("MT_PLANS_DIR");
  return d ? d : "plans";
}

int training_steps(int steps) { return std::getenv("MT_SANITIZER_RUN") ? std::min(steps, 5) : steps; }

}  // namespace mt::testing
