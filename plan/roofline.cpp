// Roofline step time and hardware profiles (roofline.h).
#include "plan/roofline.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plan/pipeline.h"
#include "runtime/error.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

double positive(const nlohmann::json& j, const char* key, double scale, const std::string& source) {
  MT_CHECK(j.contains(key) && j[key].is_number(), "{}: hardware profile field \"{}\" (a number) is missing", source, key);
  const double v = j[key].get<double>();
  MT_CHECK(std::isfinite(v) && v > 0, "{}: hardware profile field \"{}\" must be a positive number, got {}", source,
           key, v);
  return v * scale;
}

// An optional string field (`fallback` when absent).
std::string text_field(const nlohmann::json& j, const char* key, std::string fallback, const std::string& source) {
  if (!j.contains(key)) return fallback;
  MT_CHECK(j[key].is_string(), "{}: hardware profile field \"{}\" must be a string, got {}", source, key,
           j[key].type_name());
  return j[key].get<std::string>();
}

// An optional field (0 when absent).
double non_negative(const nlohmann::json& j, const char* key, double scale, const std::string& source) {
  if (!j.contains(key)) return 0;
  MT_CHECK(j[key].is_number() && j[key].get<double>() >= 0 && std::isfinite(j[key].get<double>()),
           "{}: hardware profile field \"{}\" must be a number >= 0", source, key);
  return j[key].get<double>() * scale;
}

LinkProfile link(const nlohmann::json& j, const char* key, const std::string& source) {
  MT_CHECK(j.contains("links") && j["links"].is_object() && j["links"].contains(key) && j["links"][key].is_object(),
           "{}: hardware profile field \"links.{}\" (an object with alpha_us and bandwidth_gbs) is missing", source,
           key);
  const std::string where = fmt::format("{} (links.{})", source, key);
  return LinkProfile{positive(j["links"][key], "alpha_us", 1e-6, where),
                     positive(j["links"][key], "bandwidth_gbs", 1e9, where)};
}

std::vector<fs::path> profile_dirs() {
  std::vector<fs::path> dirs;
  if (const char* d = std::getenv("MT_HARDWARE_DIR"); d && *d) dirs.emplace_back(d);
  if (const char* d = std::getenv("MT_PLANS_DIR"); d && *d) dirs.push_back(fs::path(d) / "hardware");
  dirs.emplace_back("plans/hardware");
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  // The source tree's plans/ (a build directory inside it), and an installed tree's
  // <prefix>/share/meshtrain/plans (meson install: install_subdir in the top-level meson.build).
  if (!ec)
    for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
      dirs.push_back(p / "plans" / "hardware");
      dirs.push_back(p / "share" / "meshtrain" / "plans" / "hardware");
    }
  return dirs;
}

}  // namespace

HardwareProfile parse_hardware_profile(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    MT_FAIL("{}: not a JSON hardware profile: {}", source, e.what());
  }
  MT_CHECK(j.is_object(), "{}: a hardware profile is a JSON object", source);
  HardwareProfile hw;
  hw.source = source;
  hw.name = text_field(j, "name", fs::path(source).stem().string(), source);
  hw.description = text_field(j, "description", "", source);
  hw.gemm_flops_f32 = positive(j, "gemm_tflops_f32", 1e12, source);
  hw.gemm_flops_bf16 = positive(j, "gemm_tflops_bf16", 1e12, source);
  hw.memory_bandwidth = positive(j, "memory_bandwidth_gbs", 1e9, source);
  hw.memory_bytes = positive(j, "memory_gb", 1e9, source);
  const double dpn = positive(j, "devices_per_node", 1, source);
  MT_CHECK(dpn == std::floor(dpn), "{}: devices_per_node must be an integer, got {}", source, dpn);
  hw.devices_per_node = static_cast<int64_t>(dpn);
  hw.intra = link(j, "intra", source);
  hw.inter = link(j, "inter", source);
  hw.optimizer_bandwidth = non_negative(j, "optimizer_bandwidth_gbs", 1e9, source);
  hw.kernel_overhead_s = non_negative(j, "kernel_overhead_us", 1e-6, source);
  hw.dist_op_overhead_s = non_negative(j, "dist_op_overhead_us", 1e-6, source);
  if (j.contains("local_dist_op_overhead_us"))
    hw.local_dist_op_overhead_s = non_negative(j, "local_dist_op_overhead_us", 1e-6, source);
  hw.kernel_bandwidth = non_negative(j, "kernel_bandwidth_gbs", 1e9, source);
  hw.redistribute_overhead_s = non_negative(j, "redistribute_overhead_us", 1e-6, source);
  hw.collective_overhead_s = non_negative(j, "collective_overhead_us", 1e-6, source);
  if (j.contains("cpu_share")) {
    hw.cpu_share = positive(j, "cpu_share", 1, source);
    MT_CHECK(hw.cpu_share <= 1, "{}: hardware profile field \"cpu_share\" must be in (0, 1], got {}", source, hw.cpu_share);
  }
  if (j.contains("gemm_efficiency_by_min_dim")) {
    const nlohmann::json& e = j["gemm_efficiency_by_min_dim"];
    MT_CHECK(e.is_object(), "{}: hardware profile field \"gemm_efficiency_by_min_dim\" must be an object of "
             "\"dim\": fraction, e.g. {{\"16\": 0.3, \"64\": 0.7}}", source);
    for (const auto& [key, v] : e.items()) {
      int64_t d = 0;
      try {
        size_t used = 0;
        d = std::stoll(key, &used);
        if (used != key.size()) d = 0;
      } catch (const std::exception&) {
        d = 0;
      }
      MT_CHECK(d > 0, "{}: gemm_efficiency_by_min_dim key \"{}\" is not a positive integer dim", source, key);
      MT_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0,
               "{}: gemm_efficiency_by_min_dim[\"{}\"] must be a positive number", source, key);
      hw.gemm_efficiency.emplace_back(d, v.get<double>());
    }
    std::sort(hw.gemm_efficiency.begin(), hw.gemm_efficiency.end());
  }
  if (j.contains("compute_slots")) {
    const double cs = positive(j, "compute_slots", 1, source);
    MT_CHECK(cs == std::floor(cs), "{}: compute_slots must be an integer, got {}", source, cs);
    hw.compute_slots = static_cast<int64_t>(cs);
  }
  return hw;
}

HardwareProfile load_hardware_profile(const std::string& name_or_path) {
  fs::path file;
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 5 && name_or_path.ends_with(".json"));
  std::string searched;
  if (is_path) {
    file = name_or_path;
  } else {
    for (const fs::path& d : profile_dirs()) {
      fs::path f = d / (name_or_path + ".json");
      searched += (searched.empty() ? "" : ", ") + f.string();
      std::error_code ec;
      if (fs::is_regular_file(f, ec)) {
        file = f;
        break;
      }
    }
    MT_CHECK(!file.empty(), "--hardware {}: no profile file found (looked for {}). The stock profiles (h100-nvlink, "
             "h100-ib, h200, a100) are plans/hardware/NAME.json in the source tree and "
             "<prefix>/share/meshtrain/plans/hardware in an install; set MT_HARDWARE_DIR to their directory, or give "
             "a JSON file", name_or_path, searched);
  }
  std::ifstream in(file);
  MT_CHECK(in.good(), "--hardware {}: cannot read {}", name_or_path, file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hardware_profile(ss.str(), file.string());
}

std::string hardware_profile_json(const HardwareProfile& hw) {
  nlohmann::ordered_json j;
  j["name"] = hw.name;
  j["description"] = hw.description;
  j["gemm_tflops_f32"] = hw.gemm_flops_f32 / 1e12;
  j["gemm_tflops_bf16"] = hw.gemm_flops_bf16 / 1e12;
  j["memory_bandwidth_gbs"] = hw.memory_bandwidth / 1e9;
  j["memory_gb"] = hw.memory_bytes / 1e9;
  j["devices_per_node"] = hw.devices_per_node;
  j["links"]["intra"] = {{"alpha_us", hw.intra.alpha_s * 1e6}, {"bandwidth_gbs", hw.intra.bandwidth / 1e9}};
  j["links"]["inter"] = {{"alpha_us", hw.inter.alpha_s * 1e6}, {"bandwidth_gbs", hw.inter.bandwidth / 1e9}};
  if (hw.optimizer_bandwidth > 0) j["optimizer_bandwidth_gbs"] = hw.optimizer_bandwidth / 1e9;
  if (hw.kernel_overhead_s > 0) j["kernel_overhead_us"] = hw.kernel_overhead_s * 1e6;
  if (hw.dist_op_overhead_s > 0) j["dist_op_overhead_us"] = hw.dist_op_overhead_s * 1e6;
  if (hw.local_dist_op_overhead_s >= 0) j["local_dist_op_overhead_us"] = hw.local_dist_op_overhead_s * 1e6;
  if (hw.kernel_bandwidth > 0) j["kernel_bandwidth_gbs"] = hw.kernel_bandwidth / 1e9;
  if (hw.redistribute_overhead_s > 0) j["redistribute_overhead_us"] = hw.redistribute_overhead_s * 1e6;
  if (hw.collective_overhead_s > 0) j["collective_overhead_us"] = hw.collective_overhead_s * 1e6;
  if (hw.compute_slots > 0) j["compute_slots"] = hw.compute_slots;
  if (hw.cpu_share < 1) j["cpu_share"] = hw.cpu_share;
  for (const auto& [d, f] : hw.gemm_efficiency) j["gemm_efficiency_by_min_dim"][std::to_string(d)] = f;
  return j.dump(2) + "\n";
}

bool crosses_nodes(const PlanMesh& mesh, const std::string& dims, int64_t devices_per_node) {
  int64_t span = 1;
  if (dims == "world") {
    span = mesh.size();
  } else {
    std::stringstream ss(dims);
    std::string name;
    while (std::getline(ss, name, ',')) {
      const int d = mesh.dim_index(name);
      if (d < 0) continue;
      int64_t stride = 1;
      for (int e = d + 1; e < mesh.ndim(); ++e) stride *= mesh.shape[e];
      span += (mesh.shape[d] - 1) * stride;
    }
  }
  return span > devices_per_node;
}

double collective_seconds(const std::string& kind, int64_t calls, int64_t bytes, int64_t k, const LinkProfile& l) {
  if (k <= 1 || calls == 0) return 0;
  const double kk = static_cast<double>(k), c = static_cast<double>(calls), b = static_cast<double>(bytes);
  const double frac = (kk - 1) / kk;
  if (kind == "all_reduce") return c * 2 * (kk - 1) * l.alpha_s + 2 * frac * b / l.bandwidth;  // ring
  if (kind == "all_gather" || kind == "reduce_scatter" || kind == "all_to_all")
    return c * (kk - 1) * l.alpha_s + frac * b / l.bandwidth;
  if (kind == "broadcast") return c * std::ceil(std::log2(kk)) * l.alpha_s + b / l.bandwidth;
  return c * l.alpha_s + b / l.bandwidth;  // send / recv
}

double gemm_efficiency(const HardwareProfile& hw, int64_t dim) {
  const auto& pts = hw.gemm_efficiency;
  if (pts.empty()) return 1;
  if (dim <= pts.front().first) return pts.front().second;
  if (dim >= pts.back().first) return pts.back().second;
  size_t i = 1;
  while (pts[i].first < dim) ++i;
  const double x0 = std::log(static_cast<double>(pts[i - 1].first)), x1 = std::log(static_cast<double>(pts[i].first));
  const double u = (std::log(static_cast<double>(dim)) - x0) / (x1 - x0);
  return pts[i - 1].second + u * (pts[i].second - pts[i - 1].second);
}

StepTime roofline(const RankEstimate& est, const PlanMesh& mesh, const HardwareProfile& hw, DType precision) {
  StepTime t;
  const double gemm = precision == DType::kF32 ? hw.gemm_flops_f32 : hw.gemm_flops_bf16;
  t.matmul_full_rate_s = est.cost.matmul_flops / gemm;
  // Each bucket of FLOPs at the efficiency for its bound (kernels/cost.h); the last bucket
  // (dims over the last bound, and attention) at the full rate. FLOPs counted without buckets
  // (none today) also at the full rate.
  double bucketed = 0;
  for (int b = 0; b < kGemmDimBuckets; ++b) {
    const double f = est.cost.matmul_flops_by_dim[b];
    bucketed += f;
    const double eff = b + 1 < kGemmDimBuckets ? gemm_efficiency(hw, kGemmDimBound[b]) : 1.0;
    t.matmul_s += f / (gemm * eff);
  }
  t.matmul_s += std::max(0.0, est.cost.matmul_flops - bucketed) / gemm;
  t.optimizer_s =
      est.cost.optimizer_bytes / (hw.optimizer_bandwidth > 0 ? hw.optimizer_bandwidth : hw.memory_bandwidth);
  t.memory_s = est.cost.other_bytes / (hw.kernel_bandwidth > 0 ? hw.kernel_bandwidth : hw.memory_bandwidth) + t.optimizer_s;
  t.kernel_overhead_s = static_cast<double>(est.cost.kernels) * hw.kernel_overhead_s;
  // A rank whose DTensor ops run on a mesh of one rank: a world of one, or a pipeline stage whose
  // own mesh (the plan's mesh without the pipeline dim) is one rank.
  const bool one_rank_mesh = mesh.size() <= std::max<int64_t>(est.stages, 1);
  const double per_dist_op =
      one_rank_mesh && hw.local_dist_op_overhead_s >= 0 ? hw.local_dist_op_overhead_s : hw.dist_op_overhead_s;
  t.dist_overhead_s = static_cast<double>(est.cost.dist_ops) * per_dist_op;
  t.redistribute_overhead_s = static_cast<double>(est.cost.redistributes) * hw.redistribute_overhead_s;
  t.overhead_s = t.kernel_overhead_s + t.dist_overhead_s + t.redistribute_overhead_s;
  const int64_t per_node = std::min(mesh.size(), hw.devices_per_node);
  const int64_t slots = hw.compute_slots > 0 ? hw.compute_slots : hw.devices_per_node;
  const double crowding = std::max(1.0, static_cast<double>(per_node) / static_cast<double>(slots));
  t.sharing = crowding / hw.cpu_share;
  for (const auto& [key, tally] : est.comm) {
    CollectiveTime c{key, tally, crosses_nodes(mesh, key.dims, hw.devices_per_node), 0};
    c.seconds = collective_seconds(key.kind, tally.calls, tally.bytes, tally.group_size, c.inter_node ? hw.inter : hw.intra);
    t.comm_s += c.seconds;
    t.collectives.push_back(c);
  }
  t.collective_overhead_s = static_cast<double>(est.cost.blocking_collectives) * hw.collective_overhead_s;
  t.comm_s += t.collective_overhead_s;
  // Pipeline plans: the schedule's ideal bubble stretches every stage's micro-batch compute by
  // 1 / (1 - bubble) = (V m + p - 1) / (V m) (the slowest stage's figure is the step's); the
  // optimizer step runs once after the schedule, unstretched. The stage's waits for its neighbours
  // are that bubble: the pipeline's sends and receives are not blocking collectives (estimate.cpp).
  // Where ranks share compute slots (crowding > 1, a CPU host), a stage idle in its bubble leaves
  // its slot to the others, and a stage computing while all others do gets 1 / crowding of one:
  // the schedule is run with that sharing (pipeline_shared_stretch), which lands between the
  // larger of the two stretches and their product.
  t.pipeline_stretch = est.stages > 1 ? 1.0 / (1.0 - est.bubble) : 1.0;
  const double compute = t.matmul_s + t.memory_s + t.overhead_s;
  if (est.stages <= 1)
    t.micro_stretch = crowding;
  else if (crowding > 1)
    t.micro_stretch = pipeline_shared_stretch(est.schedule, est.stages, est.micros, est.virtual_stages, crowding);
  else
    t.micro_stretch = t.pipeline_stretch;
  t.micro_stretch /= hw.cpu_share;
  t.total_s = (compute - t.optimizer_s) * t.micro_stretch + t.optimizer_s * t.sharing + t.comm_s;
  return t;
}

}  // namespace mt
