// cuBLASLt, opened on first use instead of linked. libcublasLt's start-up (its static
// constructors and 370 thousand relocations) cost every process of a CUDA build about 70 ms of a
// core and 0.17 s of wall time on the 2-core CI machine, whether it ran a GEMM on a GPU or not:
// every `meshtrain` on the CPU, every rank, every test program. Now only a process that runs a
// CUDA GEMM pays it, once (docs/cuda.md, "Build"). The entry points are the library's own
// functions, resolved by name; the library is `libcublasLt.so.<CUBLAS_VER_MAJOR>` of the toolkit
// the build used, looked up as the dynamic linker would (LD_LIBRARY_PATH, libmeshtrain's runpath,
// the system's paths), then beside the libcudart this process runs; or MT_CUBLASLT_LIBRARY, a
// path or a file name taken as given (one toolkit's cuBLASLt among several installed).
#pragma once

#include <cublasLt.h>

namespace mt::cuda {

struct CublasLt {
  decltype(&::cublasLtGetVersion) get_version;
  decltype(&::cublasLtGetStatusString) get_status_string;
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtDestroy) destroy;
  decltype(&::cublasLtMatmul) matmul;
  decltype(&::cublasLtMatmulDescCreate) matmul_desc_create;
  decltype(&::cublasLtMatmulDescDestroy) matmul_desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) matrix_layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) matrix_layout_destroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) matrix_layout_set_attribute;
  decltype(&::cublasLtMatmulPreferenceCreate) matmul_preference_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) matmul_preference_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) matmul_preference_set_attribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) matmul_algo_get_heuristic;
  decltype(&::cublasLtMatmulAlgoConfigGetAttribute) matmul_algo_config_get_attribute;
};

// The entry points, loading the library on the first call (thread-safe). A library that cannot
// be opened, lacks an entry point or has another major version than the build's headers throws
// mt::Error naming the library, the reason and what to do; the next call tries again.
const CublasLt& cublaslt();

// Whether this process has loaded libcublasLt (through cublaslt() or otherwise): read from the
// dynamic linker's list of loaded objects, for the test that start-up does not load it.
bool cublaslt_loaded();

}  // namespace mt::cuda
