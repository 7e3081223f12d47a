// meshtrain command-line tool: dispatches to the subcommands in tools/cli/. Errors end the process
// with one line on stderr ("[rank r/w] error: ...") and a non-zero exit code; under mpirun (--plan)
// they end every rank of the job at once (end_job_on_error), so that an error only one rank sees
// never leaves the others waiting.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <system_error>
#include <thread>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "config.h"
#include "mesh/world.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "tools/cli/args.h"
#include "tools/cli/commands.h"
#include "tools/cli/stop_signals.h"

namespace {

constexpr const char* kUsage =
    "usage: meshtrain COMMAND [flags]   (meshtrain COMMAND --help for its flags)\n"
    "  train    train a model (default: llama-tiny on the embedded corpus)\n"
    "  eval     loss of a Hugging Face checkpoint on a token file\n"
    "  grad     loss and gradients of a Hugging Face checkpoint on a token file\n"
    "  init     write freshly initialized weights as a Hugging Face checkpoint\n"
    "  generate a prompt's continuation by a checkpoint (greedy or sampled, KV cache)\n"
    "  tokenize INPUT... text files to an llm.c token shard with a tokenizer.json (for train --data)\n"
    "  smoke    quick engine check: fit a small MLP\n"
    "  plan     print a plan's hook IR and local parameter shapes for a model and world size\n"
    "  parity   train under a plan and on one device, compare losses, gradients and weights\n"
    "  compare A B  per-tensor differences of two safetensors files or checkpoint directories\n"
    "  checkpoint inspect DIR   the tensors, shapes, placements and chunks of a sharded checkpoint\n"
    "  export   a Hugging Face checkpoint assembled from a sharded training checkpoint\n"
    "  version  print the version and the backends built in\n";

// The process as a command finds it, made safe before anything runs (docs/cli.md, "Environment"):
// - A standard stream closed by the caller (`meshtrain train >&-`) would hand its number to the
//   first file opened (the metrics file, the run lock), which then received the step lines. /dev/null
//   opened read-only takes the number instead: writes to it fail, so a closed stdout still ends the
//   command with the write error, as `init >&-` did.
// - SIGPIPE is ignored: `meshtrain train | head` killed the run at once, losing everything since its
//   last checkpoint; now the run goes on, saves, and ends with the write error (exit 1).
// - An absurd OpenMP thread count (OMP_NUM_THREADS=100000) crashed or hung inside the OpenMP runtime
//   at the first parallel loop, with no message: refused above 64 threads per core (at least 256).
void check_process_environment() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int got = ::open("/dev/null", O_RDONLY);  // a standard stream: inherited like one
    if (got >= 0 && got != fd) {
      ::dup2(got, fd);
      ::close(got);
    }
  }
  std::signal(SIGPIPE, SIG_IGN);
  mt::cli::install_bus_error_notice();
#ifdef _OPENMP
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int limit = std::max(256, 64 * cores);
  const int threads = omp_get_max_threads();
  MT_CHECK(threads <= limit,
           "OMP_NUM_THREADS asks for {} threads, more than {} on this machine's {} cores (64 per core): set it to "
           "about the cores each process may use", threads, limit, cores);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  try {
    // Lines logged before MPI starts (the first CUDA device query) carry the launcher's rank, not
    // rank 0 on every rank; world() sets the prefix again once it has started.
    const mt::LauncherWorld launcher = mt::launcher_world();
    mt::set_log_rank(launcher.rank, launcher.size);
    check_process_environment();
    // No command: the usage, exit 2 (it ran 300 training steps and truncated ./metrics.jsonl until
    // 2026-12-07, an odd answer to a bare `meshtrain`).
    if (argc < 2) {
      std::fprintf(stderr, "%s", kUsage);
      return 2;
    }
    const char* cmd = argv[1];
    if (!std::strcmp(cmd, "train")) return mt::cli::run_train(argc, argv);
    if (!std::strcmp(cmd, "eval")) return mt::cli::run_eval(argc, argv);
    if (!std::strcmp(cmd, "grad")) return mt::cli::run_grad(argc, argv);
    if (!std::strcmp(cmd, "init")) return mt::cli::run_init(argc, argv);
    if (!std::strcmp(cmd, "generate")) return mt::cli::run_generate(argc, argv);
    if (!std::strcmp(cmd, "tokenize")) return mt::cli::run_tokenize(argc, argv);
    if (!std::strcmp(cmd, "smoke")) return mt::cli::run_smoke(argc, argv);
    if (!std::strcmp(cmd, "plan")) return mt::cli::run_plan(argc, argv);
    if (!std::strcmp(cmd, "parity")) return mt::cli::run_parity(argc, argv);
    if (!std::strcmp(cmd, "compare")) return mt::cli::run_compare(argc, argv);
    if (!std::strcmp(cmd, "checkpoint")) return mt::cli::run_checkpoint(argc, argv);
    if (!std::strcmp(cmd, "export")) return mt::cli::run_export(argc, argv);
    if (!std::strcmp(cmd, "version")) {
      fmt::print("meshtrain {} (cuda: {}, mpi: {})\n", MT_VERSION, MT_HAVE_CUDA ? "yes" : "no", MT_HAVE_MPI ? "yes" : "no");
      return 0;
    }
    if (!std::strcmp(cmd, "--help") || !std::strcmp(cmd, "help")) {
      fmt::print("{}", kUsage);
      return 0;
    }
    MT_FAIL("unknown command '{}' (commands: train, eval, grad, init, generate, tokenize, smoke, plan, parity, compare, checkpoint, export, version; meshtrain --help)", cmd);
  } catch (const mt::cli::HelpShown&) {
    return 0;
  } catch (const mt::cli::ExitError& e) {
    if (!e.agreed()) return mt::end_job_on_error(e.what(), e.code());
    MT_LOG_ERROR("{}", e.what());
    return e.code();
  } catch (const std::system_error& e) {
    // fmt::print's failure on stdout (a closed pipe, a full disk) says only "cannot write to
    // file": name stdout and the command, as flush_stdout does.
    if (std::string_view(e.what()).starts_with("cannot write to file"))
      return mt::end_job_on_error(fmt::format("meshtrain {}: cannot write the result to stdout: {}",
                                              argc > 1 ? argv[1] : "", e.code().message()));
    return mt::end_job_on_error(e.what());
  } catch (const std::exception& e) {
    return mt::end_job_on_error(e.what());
  }
}
