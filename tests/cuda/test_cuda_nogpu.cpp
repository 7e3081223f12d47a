// A binary built with the CUDA backend on a machine (or a process) without a GPU: meson runs this
// with CUDA_VISIBLE_DEVICES="" so it checks the same thing on GPU machines. Device count is 0, one
// line says so on the first query, CUDA tensors fail with "no CUDA device", and CPU work is fine.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "config.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/memory.h"
#include "testing.h"
#if MT_HAVE_CUDA
#include "runtime/cuda/cublaslt.h"
#endif

using namespace mt;

namespace {
// Runs f with stderr redirected to a file; returns what was written.
std::string capture_stderr(const std::function<void()>& f) {
  testing::TempDir dir;
  const std::string path = dir.file("stderr.txt");
  std::fflush(stderr);
  const int saved = dup(2);
  FILE* file = std::fopen(path.c_str(), "w");
  dup2(fileno(file), 2);
  f();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::fclose(file);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int count_of(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("no GPU: device count 0, one message on the first query, clear errors", "[cpu]") {
  int n0 = -1, n1 = -1;
  const std::string log = capture_stderr([&] {
    n0 = cuda::device_count();
    n1 = cuda::device_count();
    (void)cuda::is_available();
  });
  REQUIRE(n0 == 0);
  REQUIRE(n1 == 0);
  REQUIRE(!cuda::is_available());
  REQUIRE(!cuda::unavailable_reason().empty());
  if (MT_HAVE_CUDA) {
    REQUIRE(count_of(log, "no GPU found") == 1);
    REQUIRE(count_of(log, "\n") == 1);
  }
  REQUIRE_THROWS_WITH(zeros({2, 3}, TensorOptions().with_device(Device::cuda())),
                      Catch::Contains("no CUDA device") && Catch::Contains("cuda:0"));
  Tensor x = ones({2, 3});
  REQUIRE_THROWS_WITH(x.to(Device::cuda(1)), Catch::Contains("no CUDA device") && Catch::Contains("to(cuda:1)") &&
                                                 Catch::Contains("f32[2, 3] cpu"));
  REQUIRE_THROWS_WITH(x.to(Device::parse("cuda")), Catch::Contains("no CUDA device"));
  REQUIRE_THROWS_WITH(cuda::set_device(0), Catch::Contains("no CUDA device"));
  REQUIRE(cuda::memory_stats(0).current == 0);
  // Nothing else is logged later, and CPU work goes on.
  const std::string later = capture_stderr([&] {
    REQUIRE(cuda::device_count() == 0);
    REQUIRE(sum(mul(x, 2.0)).item() == 12.0);
  });
  REQUIRE(later.empty());
}

#if MT_HAVE_CUDA
// libcublasLt is opened by the first CUDA matmul, not at start-up (runtime/cuda/cublaslt.h): a
// CUDA build's CPU work does not pay its 70 ms of start-up. Loading needs no GPU.
TEST_CASE("cuBLASLt: not loaded at start-up; loaded with every entry point, or an error naming the library",
          "[cpu]") {
  Tensor x = ones({4, 4});
  REQUIRE(sum(matmul(x, x)).item() == 64.0);  // CPU work, the CUDA backend present
  REQUIRE(cuda::device_count() == 0);
  REQUIRE_FALSE(cuda::cublaslt_loaded());
  // A library that cannot be opened, or that is not cuBLASLt: one error naming it; the next call
  // tries again.
  setenv("MT_CUBLASLT_LIBRARY", "/nonexistent/libcublasLt.so.13", 1);
  REQUIRE_THROWS_WITH(cuda::cublaslt(),
                      Catch::Contains("cannot load MT_CUBLASLT_LIBRARY=/nonexistent/libcublasLt.so.13") &&
                          Catch::Contains("No such file"));
  setenv("MT_CUBLASLT_LIBRARY", "libm.so.6", 1);
  REQUIRE_THROWS_WITH(cuda::cublaslt(), Catch::Contains("libm.so.6 has no cublasLtGetVersion"));
  // Stand-ins built beside this test (fake_cublaslt.cpp): one lacking the last entry point bound,
  // one of the next major version with all of them.
  const char* partial = std::getenv("MT_TEST_FAKE_CUBLASLT_PARTIAL");
  const char* old = std::getenv("MT_TEST_FAKE_CUBLASLT_OLD");
  REQUIRE(partial);
  REQUIRE(old);
  setenv("MT_CUBLASLT_LIBRARY", partial, 1);
  REQUIRE_THROWS_WITH(cuda::cublaslt(), Catch::Contains("has no cublasLtMatmulAlgoConfigGetAttribute") &&
                                            Catch::Contains("one older than the build's headers"));
  setenv("MT_CUBLASLT_LIBRARY", old, 1);
  REQUIRE_THROWS_WITH(cuda::cublaslt(),
                      Catch::Contains(fmt::format("reports cuBLASLt version {}", (CUBLAS_VER_MAJOR + 1) * 10000)) &&
                          Catch::Contains(fmt::format("built against major version {}", CUBLAS_VER_MAJOR)));
  unsetenv("MT_CUBLASLT_LIBRARY");
  REQUIRE_FALSE(cuda::cublaslt_loaded());
  const cuda::CublasLt& lt = cuda::cublaslt();
  REQUIRE(cuda::cublaslt_loaded());
  REQUIRE(lt.get_version() / 10000 == CUBLAS_VER_MAJOR);
  // cublaslt() resolved every entry point or threw; these call two of them.
  REQUIRE(std::string(lt.get_status_string(CUBLAS_STATUS_NOT_INITIALIZED)).find("not initialized") !=
          std::string::npos);
  // A descriptor round trip through the loaded library, on the host (no GPU involved).
  cublasLtMatrixLayout_t layout = nullptr;
  REQUIRE(lt.matrix_layout_create(&layout, CUDA_R_32F, 3, 5, 3) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(lt.matrix_layout_destroy(layout) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(&cuda::cublaslt() == &lt);  // loaded once
}
#endif
