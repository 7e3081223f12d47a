// The adamw8bit kernel's two-phase form (kernels/params.h, Q8Phase) checked against its one-call
// form: a [rows, cols] f32 parameter cut into rectangular pieces (rows off the 32-row block edges,
// columns), each piece a contiguous local tensor as a rank would hold it; per step every piece
// runs kMax, the blocks' absmax are reduced by max over the pieces (what the optimizer's
// all-reduce does), then every piece runs kApply. Used by tests/optim/test_adamw8bit.cpp (CPU)
// and tests/cuda/test_cuda_optim.cpp (the same on a GPU).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/registry.h"
#include "tensor/ops.h"
#include "testing.h"

namespace mt::testing {

struct Q8Piece {
  int64_t r0, nr, c0, nc;
};

// Steps `steps` of the kernel both ways on `device`; true when the parameter, codes and absmax of
// the pieces, put back together, equal the one-call form's bit for bit after every step.
inline bool q8_pieces_match(Device device, int64_t rows, int64_t cols, const std::vector<Q8Piece>& pieces,
                            int steps) {
  const int64_t br = 32, global_blocks = (rows + br - 1) / br;
  auto on = [&](const Tensor& t) { return t.to(device); };
  auto same = [](const Tensor& a, const Tensor& b) {
    Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
    return x.dtype() == y.dtype() && x.shape() == y.shape() &&
           std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel()) * dtype_size(x.dtype())) == 0;
  };
  const TensorOptions u8 = TensorOptions(DType::kU8).with_device(device);
  const TensorOptions f32 = TensorOptions(DType::kF32).with_device(device);
  Tensor w = on(rand(Shape{rows, cols}, DType::kF32, 7)), mq = zeros(Shape{rows, cols}, u8),
         vq = zeros(Shape{rows, cols}, u8), am = zeros(Shape{rows, 2}, f32);
  Tensor w2 = w.clone(), mq2 = mq.clone(), vq2 = vq.clone(), am2 = am.clone();
  for (int s = 0; s < steps; ++s) {
    Tensor g = on(mul(rand(Shape{rows, cols}, DType::kF32, 100 + static_cast<uint64_t>(s)),
                      exp(rand(Shape{rows, cols}, DType::kF32, 200 + static_cast<uint64_t>(s), -6, 0))))
                   .contiguous();
    AdamW8bitParams base;
    base.row_numel = cols;
    base.block_rows = br;
    base.decay = 0.999;
    base.beta1 = 0.9;
    base.beta2 = 0.95;
    base.step_size = 1e-2 / (1 - std::pow(0.9, s + 1));
    base.bc2_sqrt = std::sqrt(1 - std::pow(0.95, s + 1));
    base.eps = 1e-8;
    AdamW8bitParams one = base;
    one.param = w.view_info();
    one.grad = g.view_info();
    one.exp_avg = mq.view_info();
    one.exp_avg_sq = vq.view_info();
    one.absmax = am.view_info();
    kernels(device.type).adamw8bit(one);
    // The pieces: local copies, kMax, the blocks' absmax reduced, kApply, copied back.
    struct Local {
      Tensor w, g, mq, vq, am, bam;
      AdamW8bitParams p;
      int64_t first_block;
    };
    std::vector<Local> locals;
    std::vector<float> bam(static_cast<size_t>(2 * global_blocks), 0.f);
    for (const Q8Piece& q : pieces) {
      Local l;
      // Fresh copies (contiguous() of a piece that is already contiguous would be a view): a rank
      // holds its own absmax rows, which the other pieces of those rows must not see change.
      auto cut = [&](const Tensor& t) { return t.narrow(0, q.r0, q.nr).narrow(1, q.c0, q.nc).contiguous().clone(); };
      l.w = cut(w2);
      l.g = cut(g);
      l.mq = cut(mq2);
      l.vq = cut(vq2);
      l.am = am2.narrow(0, q.r0, q.nr).contiguous().clone();
      const int64_t local_blocks = q.nr == 0 ? 0 : (q.nr + q.r0 % br + br - 1) / br;
      l.first_block = q.r0 / br;
      l.bam = zeros(Shape{local_blocks, 2}, f32);
      l.p = base;
      l.p.row_numel = q.nc;
      l.p.row_offset = q.r0;
      l.p.param = l.w.view_info();
      l.p.grad = l.g.view_info();
      l.p.exp_avg = l.mq.view_info();
      l.p.exp_avg_sq = l.vq.view_info();
      l.p.absmax = l.am.view_info();
      l.p.block_absmax = l.bam.view_info();
      l.p.phase = Q8Phase::kMax;
      kernels(device.type).adamw8bit(l.p);
      const std::vector<float> part = l.bam.to(Device::cpu()).to_vector<float>();
      for (int64_t b = 0; b < local_blocks; ++b)
        for (int k = 0; k < 2; ++k) {
          float& dst = bam[static_cast<size_t>(2 * (l.first_block + b) + k)];
          dst = std::max(dst, part[static_cast<size_t>(2 * b + k)]);
        }
      locals.push_back(std::move(l));
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
      Local& l = locals[i];
      const Q8Piece& q = pieces[i];
      const int64_t local_blocks = l.bam.shape()[0];
      std::vector<float> mine(bam.begin() + 2 * l.first_block, bam.begin() + 2 * (l.first_block + local_blocks));
      l.bam.copy_(on(from_vector<float>(mine, Shape{local_blocks, 2})));
      l.p.phase = Q8Phase::kApply;
      kernels(device.type).adamw8bit(l.p);
      auto put = [&](Tensor& whole, const Tensor& part) {
        Tensor dst = whole.narrow(0, q.r0, q.nr).narrow(1, q.c0, q.nc);
        dst.copy_(part);
      };
      put(w2, l.w);
      put(mq2, l.mq);
      put(vq2, l.vq);
      Tensor arows = am2.narrow(0, q.r0, q.nr);
      arows.copy_(l.am);
    }
    if (!same(w, w2) || !same(mq, mq2) || !same(vq, vq2) || !same(am, am2)) return false;
  }
  return true;
}

// Pieces of a [70, 24] parameter (blocks [0, 32), [32, 64), [64, 70)): rows [0, 20) whole, and
// rows [20, 70) cut into columns [0, 10) and [10, 24), so every block is shared.
inline std::vector<Q8Piece> q8_test_pieces() { return {{0, 20, 0, 24}, {20, 50, 0, 10}, {20, 50, 10, 14}}; }

}  // namespace mt::testing
