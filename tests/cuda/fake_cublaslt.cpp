// A stand-in for libcublasLt, loaded through MT_CUBLASLT_LIBRARY by test_cuda_nogpu to check the
// loader's errors (runtime/cuda/cublaslt.cpp): built with FAKE_OTHER_MAJOR as a library of the
// next major version after the toolkit's that has every entry point, or with FAKE_PARTIAL as one
// of the toolkit's version that lacks the last entry point the loader binds. Nothing here is ever
// called except cublasLtGetVersion.
#include <cublas_api.h>  // CUBLAS_VER_MAJOR only

#include <cstddef>

extern "C" {
#ifdef FAKE_OTHER_MAJOR
size_t cublasLtGetVersion() { return (CUBLAS_VER_MAJOR + 1) * 10000; }
#else
size_t cublasLtGetVersion() { return CUBLAS_VER_MAJOR * 10000; }
#endif
#define MT_FAKE_ENTRY(name) \
  int name() { return 0; }
MT_FAKE_ENTRY(cublasLtGetStatusString)
MT_FAKE_ENTRY(cublasLtCreate)
MT_FAKE_ENTRY(cublasLtDestroy)
MT_FAKE_ENTRY(cublasLtMatmul)
MT_FAKE_ENTRY(cublasLtMatmulDescCreate)
MT_FAKE_ENTRY(cublasLtMatmulDescDestroy)
MT_FAKE_ENTRY(cublasLtMatmulDescSetAttribute)
MT_FAKE_ENTRY(cublasLtMatrixLayoutCreate)
MT_FAKE_ENTRY(cublasLtMatrixLayoutDestroy)
MT_FAKE_ENTRY(cublasLtMatrixLayoutSetAttribute)
MT_FAKE_ENTRY(cublasLtMatmulPreferenceCreate)
MT_FAKE_ENTRY(cublasLtMatmulPreferenceDestroy)
MT_FAKE_ENTRY(cublasLtMatmulPreferenceSetAttribute)
MT_FAKE_ENTRY(cublasLtMatmulAlgoGetHeuristic)
#ifndef FAKE_PARTIAL
MT_FAKE_ENTRY(cublasLtMatmulAlgoConfigGetAttribute)
#endif
}
