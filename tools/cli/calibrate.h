// `meshtrain plan --calibrate --out FILE`: times a GEMM (f32 and bf16), a large copy and, under
// mpirun with 2+ ranks, all_reduce at a small and a large size on this machine, and writes a
// hardware profile (plan/roofline.h) that --estimate --hardware FILE reads. docs/estimate.md.
#pragma once

#include <string>

namespace mt::cli {

int run_calibrate(const std::string& out);

}  // namespace mt::cli
