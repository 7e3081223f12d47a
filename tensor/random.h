// Philox-based random numbers with single-device semantics (docs/rng.md): a Generator is a seed
// plus a block offset; every random op reads the offset at its start and advances it by an amount
// that depends only on the global element count, so sharded generation can match one device.
#pragma once

#include <cstdint>

#include "kernels/params.h"
#include "tensor/tensor.h"

namespace mt {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_seed(uint64_t seed) { seed_ = seed; offset_ = 0; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Returns the offset at the start and advances by `blocks`.
  uint64_t reserve(uint64_t blocks) {
    uint64_t at = offset_;
    offset_ += blocks;
    return at;
  }

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

Generator& default_generator();
void manual_seed(uint64_t seed);  // resets the default generator: seed, offset 0

// Philox blocks a random op over `numel` global elements of `dist` consumes. (a, b) are the
// distribution's parameters: randint with high - low >= 2^32 draws two lanes per element.
uint64_t random_blocks(RandomDist dist, DType dtype, int64_t numel, double a = 0, double b = 1);

Tensor uniform(const Shape& shape, double lo = 0, double hi = 1, TensorOptions opts = {},
               Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean = 0, double std = 1, TensorOptions opts = {},
              Generator* gen = nullptr);
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = DType::kI64,
               Generator* gen = nullptr);
Tensor bernoulli(const Shape& shape, double p, TensorOptions opts = {}, Generator* gen = nullptr);

// In place, for parameter init (not recorded by autograd).
Tensor& uniform_(Tensor& t, double lo, double hi, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean, double std, Generator* gen = nullptr);

// The general form: fill `local`, whose element at local index i has global row-major index
// global_base + sum_d i_d * global_strides[d] in a tensor of `global_numel` elements, using the
// Philox stream at `offset`. Callers advance the generator by random_blocks(global_numel).
void fill_random(Tensor& local, RandomDist dist, double a, double b, uint64_t seed, uint64_t offset,
                 int64_t global_base, const Shape& global_strides);

}  // namespace mt
