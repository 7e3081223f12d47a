// Training-step time against the GEMM floor of that step, on the CPU, in one run. For each model
// (llama-tiny, llama-30m, llama-100m), sequence length and precision it times full optimizer steps
// (forward, backward, f32 master gradients, clipping, AdamW, masters back to the model: the step of
// `meshtrain train`), counts the step's matmul and attention FLOPs with a KernelCostScope
// (kernels/cost.h), and divides them by the rate mt::matmul reaches on a square product of the
// same dtype (bench_matmul's measurement), timed right before and right after each timed step: the
// step's ratio is its time over its FLOPs at the mean of those two rates, and a row prints the
// median over its steps (of the ratio, the step time and the rate, each on its own). On a shared
// machine the GEMM rate moves by 10-20% within a minute; pairing each step with the rate of the
// same seconds keeps that swing out of the ratio, which a row's best step over its best rate did
// not. The ratio step / floor is the headroom left outside the GEMMs (issue 13's goal: <= 1.2 at
// 30M and above, <= 2 at llama-tiny).
//
//   bench_train [--models a,b] [--seqs 256,1024] [--precisions f32,bf16] [--steps N]
//               [--tokens N | --batch B] [--gemm N] [--verbose]
// Model names are built-in configs or config.json paths; llama-30m and llama-100m are the files
// in plans/models/ (found from the source tree). Every row trains on the same number of tokens
// per step, 1024 by default (batch = tokens / seq, at least 1: 4 x 256 and 1 x 1024, issue 13's
// 4 x 256 step), unless --batch fixes the batch for every row. The defaults (3 timed steps after
// 1 warm-up step, the one whose FLOPs are counted) take about 3 minutes with two threads and 7
// with one on the 2-core machine (figures in docs/decisions.md, "bench_train"). --verbose prints
// each step's time, rate and ratio.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cost.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/master_weights.h"
#include "tensor/ops.h"
#include "tensor/random.h"

#ifndef MT_SOURCE_ROOT
#define MT_SOURCE_ROOT "."
#endif

namespace {
using namespace mt;

double seconds_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// mt::matmul GFLOP/s on n^3 in `dtype` (best of `reps`, after one warm-up): bench_matmul's rate.
double gemm_rate(int64_t n, DType dtype, int reps) {
  Tensor a = uniform({n, n}).to(dtype), b = uniform({n, n}).to(dtype);
  Tensor c = matmul(a, b);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) best = std::min(best, seconds_of([&] { c = matmul(a, b); }));
  return 2.0 * static_cast<double>(n * n * n) / best;
}

ModelConfig config_named(const std::string& name) {
  if (name == "llama-30m" || name == "llama-100m")
    return resolve_config(std::string(MT_SOURCE_ROOT) + "/plans/models/" + name + ".json");
  return resolve_config(name);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Result {
  double step_s = 0;        // median timed step
  double gemm_rate = 0;     // median of the steps' GEMM rates (FLOP/s)
  double ratio = 0;         // median of the steps' step / floor
  double matmul_flops = 0;  // matmul + attention FLOPs of one step (kernels/cost.h)
  double params = 0;
};

// Times `steps` optimizer steps after one warm-up step, each between two timings of the GEMM rate
// (n^3, best of 3): the step's floor is its FLOPs at the mean of the two.
Result time_steps(const ModelConfig& cfg, int64_t batch, int64_t seq, DType compute, int steps, int64_t gemm_n,
                  bool verbose) {
  manual_seed(0);
  std::shared_ptr<CausalLM> model = build_causal_lm(cfg);
  model->train();
  NamedTensors f32_weights;
  if (compute != DType::kF32) {
    for (auto& [name, p] : model->named_parameters()) f32_weights.emplace_back(name, p.detach().clone());
    cast_parameters(*model, compute);
  }
  MasterWeights master(model->named_parameters());
  if (compute != DType::kF32) master.load_state_dict(f32_weights);
  std::vector<Tensor> master_tensors;
  for (const auto& [name, t] : master.master_params()) master_tensors.push_back(t);
  AdamWOptions adam;
  adam.lr = 1e-4;
  AdamW opt(make_param_groups(master.master_params(), 0.1), adam);
  // 16-bit compute runs the trainer's one pass (tools/cli/trainer.cpp): AdamW reads the model's
  // 16-bit grads, scaled by clipping's coefficient, and writes the 16-bit weights.
  const bool one_pass = !master.pass_through();
  if (one_pass) opt.set_param_copies(master.model_copies());
  Tensor tokens = randint(0, cfg.vocab_size, {batch, seq + 1});
  Tensor inputs = tokens.narrow(1, 0, seq).contiguous(), targets = tokens.narrow(1, 1, seq).contiguous();

  auto step = [&] {
    Tensor loss = model->loss(inputs, targets);
    loss.backward();
    if (one_pass)
      master.attach_model_grads();
    else
      master.grads_to_master();
    const double norm = clip_grad_norm(master_tensors, 0);  // AdamW applies the scale (as the trainer)
    if (std::isfinite(norm) && 1.0 / (norm + 1e-6) < 1) opt.set_grad_scale(1.0 / (norm + 1e-6));
    opt.step();
    opt.zero_grad();
    model->zero_grad();
    if (!one_pass) master.master_to_model();
  };
  Result r;
  r.params = static_cast<double>(cfg.num_parameters());
  {
    KernelCostScope cost;  // the warm-up step is also the counted one
    step();
    r.matmul_flops = KernelCostScope::totals().matmul_flops;
  }
  std::vector<double> times, rates, ratios;
  double before = gemm_rate(gemm_n, compute, 3);
  for (int s = 0; s < steps; ++s) {
    const double t = seconds_of(step);
    const double after = gemm_rate(gemm_n, compute, 3), rate = 0.5 * (before + after);
    times.push_back(t);
    rates.push_back(rate);
    ratios.push_back(t / (r.matmul_flops / rate));
    before = after;
    if (verbose)
      fmt::print("  step {:.1f} ms, GEMM {:.1f} GFLOP/s, ratio {:.3f}\n", t * 1e3, rate * 1e-9, ratios.back());
  }
  r.step_s = median(times);
  r.gemm_rate = median(rates);
  r.ratio = median(ratios);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models = "llama-tiny,llama-30m,llama-100m", seqs = "256,1024", precisions = "f32,bf16";
  int steps = 3, gemm_n = 1024;
  bool verbose = false;
  int64_t batch = 0, tokens = 1024;  // batch 0: tokens / seq per row
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "bench_train: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--models") models = value();
    else if (a == "--seqs") seqs = value();
    else if (a == "--precisions") precisions = value();
    else if (a == "--steps") steps = std::max(1, std::atoi(value().c_str()));
    else if (a == "--batch") batch = std::max<int64_t>(1, std::atoll(value().c_str()));
    else if (a == "--tokens") tokens = std::max<int64_t>(1, std::atoll(value().c_str()));
    else if (a == "--gemm") gemm_n = std::max(64, std::atoi(value().c_str()));
    else if (a == "--verbose") verbose = true;
    else {
      fmt::print(stderr, "bench_train: unknown argument '{}' (see the comment at the top of bench_train.cpp)\n", a);
      return 2;
    }
  }
  try {
    std::vector<std::string> prec_list = split(precisions);
    std::vector<std::pair<std::string, double>> rates;
    for (const auto& p : prec_list) {
      DType dt = p == "bf16" ? DType::kBF16 : DType::kF32;
      MT_CHECK(p == "f32" || p == "bf16", "bench_train: --precisions takes f32 and bf16, got '{}'", p);
      double rate = gemm_rate(gemm_n, dt, 5);
      rates.emplace_back(p, rate);
      fmt::print("GEMM rate {} {}^3 (mt::matmul): {:.1f} GFLOP/s\n", p, gemm_n, rate * 1e-9);
    }
    fmt::print("{:<11} {:>7} {:>5} {:>5} {:>5} {:>9} {:>9} {:>10} {:>8} {:>9} {:>6}\n", "model", "params", "prec",
               "batch", "seq", "step ms", "tok/s", "GEMM GFLOP", "GFLOP/s", "floor ms", "ratio");
    for (const auto& name : split(models)) {
      ModelConfig cfg = config_named(name);
      for (const auto& s : split(seqs)) {
        const int64_t seq = std::atoll(s.c_str());
        MT_CHECK(seq >= 1, "bench_train: --seqs needs positive lengths, got '{}'", s);
        // llama-30m's file says 512 positions; a longer window only lifts the check.
        ModelConfig run_cfg = cfg;
        run_cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, seq);
        const int64_t row_batch = batch > 0 ? batch : std::max<int64_t>(1, tokens / seq);
        for (const auto& [p, start_rate] : rates) {  // the start's rate is printed above only
          Result r = time_steps(run_cfg, row_batch, seq, p == "bf16" ? DType::kBF16 : DType::kF32, steps, gemm_n,
                                verbose);
          const double floor_s = r.matmul_flops / r.gemm_rate;
          fmt::print("{:<11} {:>6.1f}M {:>5} {:>5} {:>5} {:>9.1f} {:>9.0f} {:>10.1f} {:>8.1f} {:>9.1f} {:>6.2f}\n", name,
                     r.params / 1e6, p, row_batch, seq, r.step_s * 1e3, static_cast<double>(row_batch * seq) / r.step_s,
                     r.matmul_flops * 1e-9, r.gemm_rate * 1e-9, floor_s * 1e3, r.ratio);
          std::fflush(stdout);
        }
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  return 0;
}
