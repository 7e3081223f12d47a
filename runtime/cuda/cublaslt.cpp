// cuBLASLt opened on first use (cublaslt.h).
#include "runtime/cuda/cublaslt.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>

#include <string>

#include "runtime/error.h"

namespace mt::cuda {
namespace {

const std::string& library_name() {
  static const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  return name;
}

std::string last_dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

// The directory of the libcudart this process runs (the toolkit's lib64, where libcublasLt sits
// beside it), or "" if unknown.
std::string cudart_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) || !info.dli_fname) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

void* open_library() {
  const std::string& name = library_name();
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib) return lib;
  const std::string first = last_dl_error();
  const std::string dir = cudart_dir();
  if (!dir.empty()) {
    lib = dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) return lib;
  }
  MT_FAIL("CUDA: cannot load {} for the GPU matmuls ({}{}): it ships with the CUDA toolkit (lib64/); "
          "add that directory to LD_LIBRARY_PATH",
          name, first, dir.empty() ? "" : ", nor from " + dir);
}

template <class F>
void bind(void* lib, const char* symbol, F& f) {
  dlerror();
  void* p = dlsym(lib, symbol);
  if (!p)
    MT_FAIL("CUDA: {} has no {} ({}): a cuBLASLt older than the build's headers?", library_name(), symbol,
            last_dl_error());
  f = reinterpret_cast<F>(p);
}

CublasLt load() {
  void* lib = open_library();
  CublasLt lt{};
  bind(lib, "cublasLtGetVersion", lt.get_version);
  bind(lib, "cublasLtGetStatusString", lt.get_status_string);
  bind(lib, "cublasLtCreate", lt.create);
  bind(lib, "cublasLtDestroy", lt.destroy);
  bind(lib, "cublasLtMatmul", lt.matmul);
  bind(lib, "cublasLtMatmulDescCreate", lt.matmul_desc_create);
  bind(lib, "cublasLtMatmulDescDestroy", lt.matmul_desc_destroy);
  bind(lib, "cublasLtMatmulDescSetAttribute", lt.matmul_desc_set_attribute);
  bind(lib, "cublasLtMatrixLayoutCreate", lt.matrix_layout_create);
  bind(lib, "cublasLtMatrixLayoutDestroy", lt.matrix_layout_destroy);
  bind(lib, "cublasLtMatrixLayoutSetAttribute", lt.matrix_layout_set_attribute);
  bind(lib, "cublasLtMatmulPreferenceCreate", lt.matmul_preference_create);
  bind(lib, "cublasLtMatmulPreferenceDestroy", lt.matmul_preference_destroy);
  bind(lib, "cublasLtMatmulPreferenceSetAttribute", lt.matmul_preference_set_attribute);
  bind(lib, "cublasLtMatmulAlgoGetHeuristic", lt.matmul_algo_get_heuristic);
  bind(lib, "cublasLtMatmulAlgoConfigGetAttribute", lt.matmul_algo_config_get_attribute);
  // Descriptor layouts and enum values may change between major versions.
  const size_t version = lt.get_version();
  MT_CHECK(version / 10000 == CUBLAS_VER_MAJOR,
           "CUDA: {} reports cuBLASLt version {}, but meshtrain was built against major version {}: "
           "put the toolkit it was built with first on LD_LIBRARY_PATH",
           library_name(), version, CUBLAS_VER_MAJOR);
  return lt;  // the library stays open for the life of the process
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt = load();
  return lt;
}

bool cublaslt_loaded() {
  bool found = false;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        const std::string path = info->dlpi_name ? info->dlpi_name : "";
        const size_t slash = path.rfind('/');
        const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
        if (base.rfind("libcublasLt.so", 0) == 0) *static_cast<bool*>(data) = true;
        return 0;
      },
      &found);
  return found;
}

}  // namespace mt::cuda
