// What a trainer embedding meshtrain relies on (issue 18, docs/embedding.md). Every API that reads
// or writes a tensor's memory, on DTensors: each either works (a DTensor result with the same
// spec, or gathered values) or refuses with an error naming the API, the tensor, its placements
// and the fix. ParallelJob. Misuse caught early: unknown input paths, plans that split heads, a
// dropped parallelize() result. Run as a world of one and under mpirun -np 2: a tensor sharded
// over a mesh of one is refused too (the same program must not depend on np). Includes the
// reproduction: write_hf_checkpoint(dir, cfg, hf_state(model, cfg)) on a parallelized model raises
// and writes nothing; with full_tensors it writes the single-device files.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/placement.h"
#include "mesh/world.h"
#include "models/hf_checkpoint.h"
#include "models/llama.h"
#include "models/safetensors.h"
#include "plan/job.h"
#include "plan/parallelize.h"
#include "plan/plan.h"
#include "runtime/error.h"
#include "tensor/autograd.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "mesh_testing.h"
#include "testing.h"

using namespace mt;
using mt::testing::plans_dir;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

int P() { return testing::world_size(); }
DeviceMesh& mesh() { return testing::mesh_1d(); }
// The world as the one dim a plan file names ("tp", "dp"): built once per name.
DeviceMesh& named_mesh(const std::string& name) {
  static std::map<std::string, DeviceMesh> meshes;
  auto it = meshes.find(name);
  if (it == meshes.end()) it = meshes.emplace(name, DeviceMesh({P()}, {name})).first;
  return it->second;
}

// Rows 0..4P-1 of 3 columns, value 0.5 * i: sharded S(0) every rank holds 4 rows.
Tensor global() {
  std::vector<float> v(static_cast<size_t>(4 * P() * 3));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i);
  return from_vector<float>(v, Shape{4 * P(), 3});
}
Tensor sharded() { return distribute_tensor(global(), mesh(), {Placement::shard(0)}); }
Tensor replicated() { return distribute_tensor(global(), mesh(), {Placement::replicate()}); }

// The error every refusal gives: the API, the placements and both fixes.
void require_refused(const std::function<void()>& f, const std::string& api, const std::string& placements = "[S(0)]") {
  REQUIRE_THROWS_WITH(f(), Contains(api) && Contains(placements) && Contains("mt::full_tensor") &&
                               Contains("mt::to_local"));
}

// A fresh directory name under the temp dir, the same on every rank.
std::string temp_dir(const std::string& tag) {
  return (fs::temp_directory_path() / fmt::format("mt_raw_memory_{}_{}", tag, ::getppid())).string();
}

std::shared_ptr<CausalLM> llama(bool meta) {
  manual_seed(77);
  ModelConfig c = builtin_config("llama-tiny");
  if (!meta) return build_causal_lm(c);
  InitDeviceGuard g(Device::meta());
  return build_causal_lm(c);
}

}  // namespace

TEST_CASE("data_ptr and data<T> refuse sharded DTensors, allow replicated ones", "[mpi]") {
  Tensor s = sharded();
  require_refused([&] { (void)s.data_ptr(); }, "data_ptr");
  require_refused([&] { (void)s.data<float>(); }, "data_ptr");
  Tensor r = replicated();
  REQUIRE(r.data_ptr() == to_local(r).data_ptr());
  REQUIRE(r.data<float>()[5] == 2.5f);
  // The shard itself is one to_local away, and view_info (what kernels see) is the local shard.
  REQUIRE(to_local(s).data<float>()[0] == 0.5f * static_cast<float>(4 * 3 * mesh().coordinate(0)));
  REQUIRE(s.view_info().sizes == Shape{4, 3});
}

TEST_CASE("item, item_int and to_vector refuse sharded and Partial DTensors; full_item gathers", "[mpi]") {
  Tensor s = sharded();
  require_refused([&] { (void)s.to_vector<float>(); }, "to_vector");
  Tensor part = sum(s);  // Partial(sum) over the mesh: each rank holds its rows' sum
  require_refused([&] { (void)part.item(); }, "item", "P(sum)");
  require_refused([&] { (void)part.item_int(); }, "item_int", "P(sum)");
  REQUIRE_THROWS_WITH(part.item(), Contains("partial term"));
  const double n = 4.0 * P() * 3;
  REQUIRE(full_item(part) == 0.5 * n * (n - 1) / 2);
  REQUIRE(full_item(scalar_tensor(3.0)) == 3.0);
  REQUIRE(replicated().to_vector<float>() == global().to_vector<float>());
}

TEST_CASE("printing a sharded DTensor labels its local shard", "[mpi]") {
  std::string p = sharded().str();
  REQUIRE_THAT(p, Contains("local shard [4, 3]") && Contains("[S(0)]"));
  REQUIRE_THAT(sum(sharded()).str(), Contains("local term"));
  REQUIRE(replicated().str().find("local") == std::string::npos);
  REQUIRE(fmt::format("{}", sharded()) == sharded().desc());
}

TEST_CASE("to(Device), to(DType), contiguous and clone of a DTensor keep the spec", "[mpi]") {
  Tensor s = sharded();
  REQUIRE(s.to(Device::cpu()).same(s));
  Tensor m = s.to(Device::meta());
  REQUIRE(m.is_distributed());
  REQUIRE(m.dist_spec() == s.dist_spec());
  REQUIRE(m.local_shape() == Shape{4, 3});
  Tensor d = s.to(DType::kF64);
  REQUIRE(d.is_distributed());
  REQUIRE(full_tensor(d).to_vector<float>() == global().to_vector<float>());
  Tensor c = s.clone();
  REQUIRE(c.dist_spec() == s.dist_spec());
  REQUIRE(full_tensor(c).to_vector<float>() == global().to_vector<float>());
  Tensor t = distribute_tensor(global().t().contiguous(), mesh(), {Placement::shard(1)}).t();  // not contiguous
  REQUIRE(!to_local(t).is_contiguous());
  Tensor tc = t.contiguous();
  REQUIRE(tc.is_distributed());
  REQUIRE(to_local(tc).is_contiguous());
  REQUIRE(full_tensor(tc).to_vector<float>() == global().to_vector<float>());
}

TEST_CASE("copy_ between a DTensor and a plain tensor is refused; same spec works", "[mpi]") {
  NoGradGuard ng;
  Tensor s = sharded();
  Tensor plain = zeros({4 * P(), 3});
  REQUIRE_THROWS_WITH(s.copy_(plain), Contains("copy_") && Contains("[S(0)]") && Contains("(local)"));
  REQUIRE_THROWS_WITH(plain.copy_(s), Contains("copy_") && Contains("[S(0)]"));
  Tensor dst = zeros_like(s);
  dst.copy_(s);
  REQUIRE(full_tensor(dst).to_vector<float>() == global().to_vector<float>());
}

TEST_CASE("write_safetensors refuses a sharded DTensor by name and writes a replicated one", "[mpi]") {
  const std::string path = temp_dir("st") + ".safetensors";
  REQUIRE_THROWS_WITH(write_safetensors(path, {{"w", sharded()}}),
                      Contains("write_safetensors") && Contains("tensor 'w'") && Contains("[S(0)]"));
  REQUIRE(!fs::exists(path));
  mesh().comm().barrier();
  if (world().rank() == 0) {
    write_safetensors(path, {{"w", replicated()}});
    SafetensorsFile f = read_safetensors(path);
    REQUIRE(f.tensors.at(0).second.to_vector<float>() == global().to_vector<float>());
    fs::remove(path);
  }
  mesh().comm().barrier();
}

TEST_CASE("write_hf_checkpoint(hf_state) of a parallelized model raises; full_tensors writes the single-device files",
          "[mpi]") {
  const std::string dir = temp_dir("hf"), ref_dir = dir + "_ref";
  ModelConfig cfg = builtin_config("llama-tiny");
  auto model = llama(/*meta=*/true);
  Parallelized par = parallelize(*model, load_plan(plans_dir() + "/llama_tp.plan"), named_mesh("tp"));
  // The reproduction of issue 18: it used to write full shapes filled from past the local shards.
  REQUIRE_THROWS_WITH(write_hf_checkpoint(dir, cfg, hf_state(*model, cfg)),
                      Contains("write_hf_checkpoint") && Contains("model.layers.0.self_attn.q_proj.weight") &&
                          Contains("[S(0)]") && Contains("mt::full_tensor"));
  REQUIRE(!fs::exists(dir));
  // Loading full tensors into the shards is refused too (load before parallelize).
  HfCheckpoint ck{cfg, hf_state(*llama(false), cfg)};
  REQUIRE_THROWS_WITH(load_into_module(*model, ck), Contains("load_into_module") && Contains("before parallelize"));

  auto state = full_tensors(hf_state(*model, cfg));  // collective: every rank
  mesh().comm().barrier();
  if (world().rank() == 0) {
    write_hf_checkpoint(dir, cfg, state);
    write_hf_checkpoint(ref_dir, cfg, hf_state(*llama(false), cfg));
    HfCheckpoint a = read_hf_checkpoint(dir), b = read_hf_checkpoint(ref_dir);
    REQUIRE(a.tensors.size() == b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      REQUIRE(a.tensors[i].first == b.tensors[i].first);
      REQUIRE(a.tensors[i].second.to_vector<float>() == b.tensors[i].second.to_vector<float>());
    }
    fs::remove_all(dir);
    fs::remove_all(ref_dir);
  }
  mesh().comm().barrier();
}

TEST_CASE("ParallelJob: full_state equals the single-device parameters", "[mpi]") {
  auto model = llama(/*meta=*/true);
  ParallelJob job = parallelize_from_file(*model, plans_dir() + "/llama_tp.plan");
  REQUIRE(job.input_module == "model");
  REQUIRE(job.mesh.size() == P());
  auto full = job.full_state();
  auto ref = llama(false)->named_parameters();
  REQUIRE(full.size() == ref.size());
  for (size_t i = 0; i < full.size(); ++i) {
    REQUIRE(full[i].first == ref[i].first);
    REQUIRE(!full[i].second.is_distributed());
    REQUIRE(full[i].second.to_vector<float>() == ref[i].second.to_vector<float>());
  }
}

TEST_CASE("input_placements: unknown paths and the root are errors when the plan places 'model'", "[mpi]") {
  auto model = llama(/*meta=*/true);
  Parallelized par = parallelize(*model, load_plan(plans_dir() + "/llama_dp.plan"), named_mesh("dp"));
  REQUIRE(par.input_placements("model") == Placements{Placement::shard(0)});
  REQUIRE(par.input_placements("lm_head") == Placements{Placement::replicate()});  // a module the plan leaves alone
  REQUIRE_THROWS_WITH(par.input_placements(""), Contains("root module") && Contains("'model'"));
  REQUIRE_THROWS_WITH(par.input_placements("modle"), Contains("no module 'modle'") && Contains("'model'"));
  auto model2 = llama(/*meta=*/true);  // outlives the job, which holds hooks on it
  auto job = parallelize_from_file(*model2, plans_dir() + "/llama_dp.plan");
  REQUIRE(job.input_module == "model");
  REQUIRE(job.input_placements() == Placements{Placement::shard(0)});
  Tensor ids = arange(8 * P()).view({2 * P(), 4});
  Tensor placed = job.place_input(ids);
  REQUIRE(placed.local_shape() == Shape{2, 4});
  REQUIRE(full_tensor(placed).to_vector<int64_t>() == ids.to_vector<int64_t>());
  ParallelJobOptions bad;
  bad.input_module = "modle";
  REQUIRE_THROWS_WITH(parallelize_from_file(*llama(true), plans_dir() + "/llama_dp.plan", bad), Contains("modle"));
}

TEST_CASE("a plan that splits attention heads unevenly fails at parallelize time", "[mpi]") {
  ModelConfig c = builtin_config("llama-tiny");
  c.num_key_value_heads = 1;  // k_proj / v_proj: one head of 16 rows
  manual_seed(5);
  std::shared_ptr<CausalLM> model;
  {
    InitDeviceGuard g(Device::meta());
    model = build_causal_lm(c);
  }
  Plan plan = load_plan(plans_dir() + "/llama_tp.plan");
  if (P() == 1) {
    Parallelized par = parallelize(*model, plan, named_mesh("tp"));
    REQUIRE(par.num_hooks() > 0);
  } else {
    REQUIRE_THROWS_WITH(parallelize(*model, plan, named_mesh("tp")),
                        Contains("model.layers.0.self_attn.k_proj.weight") && Contains("attention head") &&
                            Contains("'tp' must divide 1") && Contains("llama_tp.plan:"));
    // Nothing was sharded: the model is still whole (on meta).
    REQUIRE(!model->get_parameter("model.layers.0.self_attn.q_proj.weight").is_distributed());
  }
}

TEST_CASE("a dropped parallelize() result: the DTensor op error says to keep it alive", "[mpi]") {
  auto model = llama(/*meta=*/true);
  { Parallelized dropped = parallelize(*model, load_plan(plans_dir() + "/llama_tp.plan"), named_mesh("tp")); }
  Tensor ids = arange(8).view({2, 4});
  REQUIRE_THROWS_WITH(model->loss(ids, ids), Contains("keep the returned Parallelized or ParallelJob alive"));
  auto kept = llama(/*meta=*/true);
  Parallelized par = parallelize(*kept, load_plan(plans_dir() + "/llama_tp.plan"), named_mesh("tp"));
  REQUIRE(std::isfinite(full_item(kept->loss(ids, ids))));
}
