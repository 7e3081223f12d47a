#include "tools/cli/stop_signals.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

#include "tensor/tensor.h"
#include "tools/cli/parallel.h"

namespace mt::cli {

namespace {

volatile std::sig_atomic_t g_signal = 0;

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};

extern "C" void on_stop_signal(int sig) {
  if (g_signal != 0 && sig != SIGUSR1) {
    // A second SIGTERM / SIGINT: as if unhandled (the user insists; Open MPI sends SIGKILL soon).
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (g_signal == 0) {
    constexpr char kMsg[] =
        "meshtrain: stop requested: finishing this step, then saving a checkpoint (SIGTERM or SIGINT again ends "
        "the process at once)\n";
    ssize_t ignored = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);  // async-signal-safe
    (void)ignored;
  }
  g_signal = sig;
}

}  // namespace

struct StopSignals::Saved {
  struct sigaction old[std::size(kSignals)];
};

StopSignals::StopSignals() : saved_(new Saved) {
  g_signal = 0;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads, writes and waits go on; the loop checks the flag after each step
  for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &saved_->old[i]);
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &saved_->old[i], nullptr);
  delete saved_;
}

int StopSignals::received() { return static_cast<int>(g_signal); }

int StopSignals::agreed(const PlanContext* plan) {
  if (!plan) return received();
  Tensor flag = from_vector<int64_t>({static_cast<int64_t>(received())}, Shape{1});
  world_comm(*plan).all_reduce(flag, CommReduceOp::kMax);
  return static_cast<int>(flag.to_vector<int64_t>()[0]);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace mt::cli
