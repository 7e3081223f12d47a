// Helpers shared by the model tests: fixed token ids, random weights, and a bit-for-bit
// comparison of two models' parameters and logits.
#pragma once

#include <string>
#include <vector>

#include "testing.h"
#include "tensor/module.h"

namespace mt::testing {

inline const std::vector<int64_t> kIds = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};  // B = 2, T = 5
inline const std::vector<int64_t> kTargets = {1, 4, 1, 5, 9, 2, 6, 5, 3, 5};

inline Tensor ids_tensor(const std::vector<int64_t>& v, int64_t B, int64_t T) {
  return from_vector<int64_t>(v, Shape{B, T});
}

// Overwrites every parameter with values in [-scale, scale) (norm weights around 1).
inline void randomize(Module& m, uint64_t seed, double scale = 0.5) {
  NoGradGuard ng;
  for (auto& [n, t] : m.named_parameters()) {
    Tensor r = rand(t.shape(), t.dtype(), seed++, -scale, scale);
    if (n.find("norm") != std::string::npos) r = add(r, 1.0);
    Tensor tt = t;
    tt.copy_(r);
  }
}

// Same parameter names and values, bit for bit, and the same logits on kIds.
inline void require_same_model(Module& a, Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    REQUIRE(pa[i].first == pb[i].first);
    REQUIRE(pa[i].second.to_vector<float>() == pb[i].second.to_vector<float>());
  }
  Tensor ids = ids_tensor(kIds, 2, 5);
  REQUIRE(a.forward({ids})[0].to_vector<float>() == b.forward({ids})[0].to_vector<float>());
}

}  // namespace mt::testing
