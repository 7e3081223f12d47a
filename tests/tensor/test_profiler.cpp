// The profiler's library API (runtime/profiler.h, docs/profiler.md): op events with module,
// shapes, dtype, FLOPs and bytes; backward ops attributed to the module whose forward made them;
// regions; nesting with KernelCostScope; the hooks disarmed when no Profiler lives; the trace file.
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cost.h"
#include "runtime/profiler.h"
#include "tensor/module.h"
#include "tensor/ops.h"
#include "testing.h"

using namespace mt;

namespace {

struct Proj : Module {
  Tensor weight;
  Proj(int64_t in, int64_t out) { weight = param_uniform("weight", {out, in}, -1, 1); }
  std::vector<Tensor> forward(const std::vector<Tensor>& x) override { return {linear(x[0], weight)}; }
};

struct Net : Module {
  std::shared_ptr<Proj> up, down;
  Net() {
    up = register_module("up", std::make_shared<Proj>(8, 16));
    down = register_module("down", std::make_shared<Proj>(16, 4));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& x) override { return {(*down)(relu((*up)(x[0])))}; }
};

const ProfileEvent* find_op(const Profiler& p, const std::string& name, const std::string& module, bool backward) {
  for (const ProfileEvent& e : p.events())
    if (e.kind == ProfileEvent::Kind::kOp && e.name == name && e.module == module && e.backward == backward) return &e;
  return nullptr;
}

}  // namespace

TEST_CASE("profiler: ops carry module, shapes, dtype, FLOPs and bytes; backward ops their module") {
  manual_seed(0);
  Net net;
  Tensor x = uniform({2, 8});
  REQUIRE_FALSE(kernel_hooks_armed());
  Profiler prof;
  REQUIRE(kernel_hooks_armed());
  REQUIRE(Profiler::current() == &prof);
  {
    ProfileScope step(ProfileEvent::Kind::kRegion, "step 1");
    sum(net(x)).backward();
  }
  prof.stop();
  REQUIRE(Profiler::current() == nullptr);
  REQUIRE_FALSE(kernel_hooks_armed());

  const ProfileEvent* mm = find_op(prof, "matmul", "up", false);
  REQUIRE(mm != nullptr);
  CHECK(mm->shapes == "[2,8] [8,16] [2,16]");
  CHECK(mm->dtype == "f32");
  CHECK(mm->device == "cpu");
  CHECK(mm->flops == 2.0 * 2 * 8 * 16);               // 2 per multiply-add
  CHECK(mm->bytes == 4.0 * (2 * 8 + 8 * 16 + 2 * 16));  // a, b, out once each
  CHECK(find_op(prof, "matmul", "down", true) != nullptr);  // the gradient products of down's forward
  CHECK(find_op(prof, "unary", "(root)", false) != nullptr);  // relu ran in the root module's forward
  bool root_span = false, up_span = false;
  double op_us = 0, step_us = 0;
  for (const ProfileEvent& e : prof.events()) {
    root_span |= e.kind == ProfileEvent::Kind::kModule && e.name == "(root)";
    up_span |= e.kind == ProfileEvent::Kind::kModule && e.name == "up";
    if (e.kind == ProfileEvent::Kind::kOp) op_us += e.dur_us;
    if (e.kind == ProfileEvent::Kind::kRegion) step_us += e.dur_us;
  }
  CHECK(root_span);
  CHECK(up_span);
  CHECK(op_us <= step_us);
  const std::string table = prof.summary();
  CHECK_THAT(table, Catch::Contains("matmul"));
  CHECK_THAT(table, Catch::Contains("up [bwd]"));

  mt::testing::TempDir dir;
  const std::string path = dir.file("trace.json");
  prof.write_chrome_trace(path, 3);
  nlohmann::json doc = nlohmann::json::parse(std::ifstream(path));
  REQUIRE(doc["traceEvents"].size() == prof.events().size());
  for (const auto& e : doc["traceEvents"]) {
    CHECK(e["pid"] == 3);
    CHECK(e.contains("ts"));
    CHECK(e.contains("dur"));
  }
}

TEST_CASE("profiler: KernelCostScope inside a Profiler counts as before; one Profiler per thread") {
  Tensor a = uniform({4, 6}), b = uniform({6, 5});
  Profiler prof;
  {
    KernelCostScope cost;
    Tensor c = matmul(a, b);
    CHECK(KernelCostScope::totals().matmul_flops == 2.0 * 4 * 6 * 5);
    CHECK(KernelCostScope::totals().matmuls == 1);
  }
  CHECK(kernel_hooks_armed());  // the Profiler still holds the hooks
  CHECK_THROWS_WITH([] { Profiler second; }(), Catch::Contains("already has a recording Profiler"));
  prof.stop();
  prof.stop();  // idempotent
  CHECK_FALSE(kernel_hooks_armed());
  const size_t n = prof.events().size();
  Tensor c = matmul(a, b);
  CHECK(prof.events().size() == n);  // stopped: nothing more recorded
}
