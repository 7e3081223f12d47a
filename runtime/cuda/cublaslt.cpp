// cuBLASLt opened on first use (cublaslt.h).
#include "runtime/cuda/cublaslt.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <string>

#include "runtime/error.h"

namespace mt::cuda {
namespace {

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

// `given`: named by MT_CUBLASLT_LIBRARY, opened as given, without the search beside libcudart.
void* open_library(const std::string& name, bool given) {
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib) return lib;
  const std::string first = last_dl_error();
  if (given)
    MT_FAIL("CUDA: cannot load MT_CUBLASLT_LIBRARY={} for the GPU matmuls ({})", name, first);
  const std::string dir = cudart_dir();
  if (!dir.empty()) {
    lib = dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) return lib;
  }
  MT_FAIL("CUDA: cannot load {} for the GPU matmuls ({}{}): it ships with the CUDA toolkit (lib64/); "
          "add that directory to LD_LIBRARY_PATH, or name the library in MT_CUBLASLT_LIBRARY",
          name, first, dir.empty() ? "" : ", nor from " + dir);
}

template <class F>
void bind(void* lib, const std::string& name, const char* symbol, F& f) {
  dlerror();
  void* p = dlsym(lib, symbol);
  if (!p)
    MT_FAIL("CUDA: {} has no {} ({}): not cuBLASLt, or one older than the build's headers", name, symbol,
            last_dl_error());
  f = reinterpret_cast<F>(p);
}

CublasLt load() {
  // MT_CUBLASLT_LIBRARY (a path or a file name) if set, else the soname of the build's major version.
  const char* env = std::getenv("MT_CUBLASLT_LIBRARY");
  const bool given = env && *env;
  const std::string name = given ? std::string(env) : "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lib = open_library(name, given);
  struct CloseUnlessKept {  // a library refused below is closed again
    void* lib;
    bool keep = false;
    ~CloseUnlessKept() {
      if (!keep) dlclose(lib);
    }
  } guard{lib};
  CublasLt lt{};
  bind(lib, name, "cublasLtGetVersion", lt.get_version);
  bind(lib, name, "cublasLtGetStatusString", lt.get_status_string);
  bind(lib, name, "cublasLtCreate", lt.create);
  bind(lib, name, "cublasLtDestroy", lt.destroy);
  bind(lib, name, "cublasLtMatmul", lt.matmul);
  bind(lib, name, "cublasLtMatmulDescCreate", lt.matmul_desc_create);
  bind(lib, name, "cublasLtMatmulDescDestroy", lt.matmul_desc_destroy);
  bind(lib, name, "cublasLtMatmulDescSetAttribute", lt.matmul_desc_set_attribute);
  bind(lib, name, "cublasLtMatrixLayoutCreate", lt.matrix_layout_create);
  bind(lib, name, "cublasLtMatrixLayoutDestroy", lt.matrix_layout_destroy);
  bind(lib, name, "cublasLtMatrixLayoutSetAttribute", lt.matrix_layout_set_attribute);
  bind(lib, name, "cublasLtMatmulPreferenceCreate", lt.matmul_preference_create);
  bind(lib, name, "cublasLtMatmulPreferenceDestroy", lt.matmul_preference_destroy);
  bind(lib, name, "cublasLtMatmulPreferenceSetAttribute", lt.matmul_preference_set_attribute);
  bind(lib, name, "cublasLtMatmulAlgoGetHeuristic", lt.matmul_algo_get_heuristic);
  bind(lib, name, "cublasLtMatmulAlgoConfigGetAttribute", lt.matmul_algo_config_get_attribute);
  // Descriptor layouts and enum values may change between major versions.
  const size_t version = lt.get_version();
  MT_CHECK(version / 10000 == CUBLAS_VER_MAJOR,
           "CUDA: {} reports cuBLASLt version {}, but meshtrain was built against major version {}: "
           "put the toolkit it was built with first on LD_LIBRARY_PATH",
           name, version, CUBLAS_VER_MAJOR);
  guard.keep = true;
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
