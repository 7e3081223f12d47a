// `meshtrain compare A B [--tol T] [--json F]`: the per-tensor table of `meshtrain parity` for any
// two sets of tensors on disk (docs/cli.md, "compare"). A and B are each a safetensors file (a
// `grad --out` file, a model or optimizer file), a Hugging Face checkpoint directory
// (config.json + model.safetensors[.index.json]) or a `train --checkpoint-dir` (its latest step's
// weights). For every tensor: the largest |A - B|, relative to the largest |B| (B is the
// reference, as parity's reference), and the index of the worst element. Exit codes: 0 when the
// names, shapes and dtypes agree and every relative difference is within --tol, 1 otherwise,
// 2 when a file cannot be read (no verdict).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "checkpoint/shard_reader.h"
#include "models/hf_checkpoint.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "tensor/ops.h"
#include "tools/cli/args.h"
#include "tools/cli/checks.h"
#include "tools/cli/commands.h"
#include "tools/cli/outputs.h"
#include "tools/cli/parity_report.h"
#include "tools/cli/train_state.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;

// The tensors stored at `path`, and what they are (for the report).
std::pair<NamedTensors, std::string> load_tensors(const std::string& path) {
  MT_CHECK(fs::exists(path), "meshtrain compare: {} does not exist", path);
  if (!fs::is_directory(path)) return {read_safetensors(path).tensors, "safetensors file"};
  if (fs::exists(fs::path(path) / kShardedIndexFile))  // a sharded step directory: its weights, assembled
    return {read_model_checkpoint(path).tensors, "sharded train checkpoint " + path};
  if (fs::exists(fs::path(path) / "config.json")) return {read_hf_checkpoint(path).tensors, "Hugging Face checkpoint"};
  if (fs::exists(fs::path(path) / "latest")) {
    LoadedCheckpoint ck = load_latest_checkpoint(path);
    return {std::move(ck.model), "train checkpoint " + ck.path};
  }
  MT_FAIL("meshtrain compare: {} is a directory with neither config.json (a Hugging Face checkpoint) nor latest (a "
          "train --checkpoint-dir)", path);
}

struct Row {
  std::string name;
  Shape shape;
  std::string problem;  // names, shapes or dtypes that differ
  double max_abs = 0, ref_max = 0;
  bool floating = false;  // B's dtype is a floating-point one: only these have a floor
  double floor = 0;       // the least scale (set_floors)
  int64_t worst = -1;     // flat index of the worst element
  double rel() const { return relative_diff(max_abs, std::max(ref_max, floor)); }
};

Row compare_one(const std::string& name, const Tensor& a, const Tensor& b) {
  Row r;
  r.name = name;
  r.shape = b.shape();
  if (a.shape() != b.shape()) {
    r.problem = fmt::format("shape {} in A, {} in B", a.shape(), b.shape());
    return r;
  }
  r.floating = is_floating(b.dtype());
  if (a.dtype() != b.dtype()) r.problem = fmt::format("dtype {} in A, {} in B", a.dtype(), b.dtype());
  const std::vector<double> x = a.to(DType::kF64).to_vector<double>(), y = b.to(DType::kF64).to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = element_diff(x[i], y[i]);
    if (d > r.max_abs || (r.worst < 0 && d > 0)) {
      r.max_abs = d;
      r.worst = static_cast<int64_t>(i);
    }
    // The scale: B's largest finite magnitude (element_diff).
    if (std::isfinite(y[i])) r.ref_max = std::max(r.ref_max, std::fabs(y[i]));
  }
  return r;
}

// A tensor's kind: its name up to the first '.' ("model", "lm_head"; in an optimizer file "exp_avg",
// "exp_avg_sq", "absmax", ...).
std::string kind_of(const std::string& name) { return name.substr(0, name.find('.')); }

// Each floating-point row's floor: kScaleFloor (parity_report.h) x the largest |B| among the
// floating-point tensors of its kind. So an exactly-zero gradient beside large ones is not failed
// on rounding noise, while a file's step counts, 8-bit codes, or first moments do not raise the
// floor of its second moments, which are orders of magnitude smaller. Integer rows have no floor.
void set_floors(std::vector<Row>& rows) {
  std::map<std::string, std::vector<double>> ref_max;
  for (const Row& r : rows)
    if (r.floating) ref_max[kind_of(r.name)].push_back(r.ref_max);
  for (Row& r : rows) r.floor = r.floating ? scale_floor(ref_max[kind_of(r.name)]) : 0;
}

}  // namespace

int run_compare(int argc, char** argv) {
  const std::vector<FlagSpec> specs = {
      {"tol", "largest relative difference that passes (to the largest |B| of each tensor, or where that is more to "
              "1e-3 of the largest |B| among the floating-point tensors of its kind: the name up to its first '.')",
       "1e-5", false},
      {"json", "also write the report as JSON to this file", "", false}};
  // A and B first, then the flags; any usage or read error exits 2 (no verdict).
  std::vector<std::string> files;
  int first = 2;
  while (first < argc && files.size() < 2 && std::string(argv[first]).rfind("--", 0) != 0) files.push_back(argv[first++]);
  std::unique_ptr<Args> parsed;
  std::pair<NamedTensors, std::string> a, b;
  double tol = 0;
  try {
    parsed = std::make_unique<Args>("compare", specs, argc, argv, first);
    MT_CHECK(files.size() == 2, "meshtrain compare: expected two paths A B (files or checkpoint directories) before "
             "the flags, got {}", files.size());
    tol = parsed->real("tol");
    MT_CHECK(tol >= 0, "meshtrain compare: --tol {} must be >= 0", parsed->str("tol"));
    check_output_file(parsed->str("json"), "--json");
    check_not_input(parsed->str("json"), "--json", {{"A", files[0]}, {"B", files[1]}});
    a = load_tensors(files[0]);
    b = load_tensors(files[1]);
  } catch (const HelpShown&) {
    throw;
  } catch (const std::exception& e) {
    throw ExitError(e.what(), 2, true);
  }
  const Args& args = *parsed;
  std::map<std::string, Tensor> in_b(b.first.begin(), b.first.end());
  std::vector<Row> rows;
  std::vector<std::string> failures;
  for (const auto& [name, t] : a.first) {
    auto it = in_b.find(name);
    if (it == in_b.end()) {
      failures.push_back(fmt::format("{}: in A only", name));
      continue;
    }
    rows.push_back(compare_one(name, t, it->second));
    in_b.erase(it);
  }
  for (const auto& [name, t] : in_b) failures.push_back(fmt::format("{}: in B only", name));
  set_floors(rows);
  const Row* worst = nullptr;
  for (const Row& r : rows) {
    if (!r.problem.empty()) failures.push_back(fmt::format("{}: {}", r.name, r.problem));
    if (r.problem.find("shape") == std::string::npos && !(r.rel() <= tol))
      failures.push_back(fmt::format("{}: rel {:.2e} > {:g}", r.name, r.rel(), tol));
    if (!worst || r.rel() > worst->rel()) worst = &r;
  }

  const bool pass = failures.empty();
  // The file first: an unwritable --json is "no verdict" (2), with nothing printed as a verdict.
  if (!args.str("json").empty()) {
    nlohmann::json j = {{"a", files[0]}, {"b", files[1]}, {"tol", tol}, {"pass", pass}, {"failures", failures}};
    for (const Row& r : rows)
      j["tensors"].push_back({{"name", r.name}, {"shape", fmt::format("{}", r.shape)}, {"max_abs", r.max_abs},
                              {"ref_max", r.ref_max}, {"floor", r.floor}, {"rel", std::isfinite(r.rel()) ? r.rel() : -1.0},
                              {"worst_index", r.worst}, {"problem", r.problem}});
    try {
      write_file_atomically(args.str("json"), [&](std::ostream& f) { f << j.dump(2) << "\n"; });
    } catch (const Error& e) {
      throw ExitError(fmt::format("meshtrain compare: --json: {}", e.what()), 2, true);
    }
  }

  fmt::print("A: {} ({}, {} tensors)\nB: {} ({}, {} tensors), the reference\n", files[0], a.second, a.first.size(),
             files[1], b.second, b.first.size());
  size_t width = 6;
  for (const Row& r : rows) width = std::max(width, r.name.size());
  fmt::print("{:<{}} | {:>14} | {:>9} {:>9} | {}\n", "tensor", width, "shape", "max abs", "rel", "worst element");
  for (const Row& r : rows) {
    if (r.problem.find("shape") != std::string::npos) {  // nothing compared: no figures
      fmt::print("{:<{}} | {:>14} | {:>9} {:>9} | - ({})\n", r.name, width, fmt::format("{}", r.shape), "-", "-",
                 r.problem);
      continue;
    }
    fmt::print("{:<{}} | {:>14} | {:9.2e} {:9.2e} | {}\n", r.name, width, fmt::format("{}", r.shape), r.max_abs, r.rel(),
               r.worst < 0 ? std::string("-") : std::to_string(r.worst));
  }
  if (pass)
    fmt::print("PASS: {} tensors within {:g}{}\n", rows.size(), tol,
               worst ? fmt::format(" (worst: {} at rel {:.2e})", worst->name, worst->rel()) : "");
  else
    fmt::print("FAIL: {} check(s) failed (--tol {:g}):\n  {}\n", failures.size(), tol, fmt::join(failures, "\n  "));
  flush_stdout("compare");
  return pass ? 0 : 1;
}

}  // namespace mt::cli
