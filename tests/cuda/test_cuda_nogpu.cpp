// A binary built with the CUDA backend on a machine (or a process) without a GPU: meson runs this
// with CUDA_VISIBLE_DEVICES="" so it checks the same thing on GPU machines. Device count is 0, one
// line says so on the first query, CUDA tensors fail with "no CUDA device", and CPU work is fine.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "config.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/memory.h"
#include "testing.h"

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
