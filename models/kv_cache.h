// Keys and values of the positions decoded so far, one pair of buffers per decoder layer, for
// incremental decoding (models/generate.h): each forward of CausalLM with a cache set
// (CausalLM::set_kv_cache) feeds only the new tokens, appends their keys and values, and attends
// over every position held. Buffers are [B, kv heads, capacity, head dim], made at a layer's
// first append in the keys' dtype and device, and written in place afterwards.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace mt {

class KvCache {
 public:
  // `capacity` positions at most (the prompt and every generated token).
  explicit KvCache(int64_t capacity);

  int64_t capacity() const { return capacity_; }
  // Positions every layer holds (advance() moves it once all layers have appended).
  int64_t length() const { return length_; }

  // Writes this step's k, v [B, kv heads, T, D] of `layer` at positions [length, length + T) and
  // returns views of positions [0, length + T). Throws naming the layer when the step would pass
  // the capacity or its shapes differ from the layer's earlier steps.
  std::pair<Tensor, Tensor> append(int64_t layer, const Tensor& k, const Tensor& v);
  // After a forward: every layer has appended T positions.
  void advance(int64_t T);
  // Forgets every position (the buffers stay for the next sequence of the same shape).
  void clear() { length_ = 0; }

 private:
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<std::pair<Tensor, Tensor>> layers_;
};

}  // namespace mt
