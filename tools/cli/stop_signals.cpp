#include "tools/cli/stop_signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

#include "tools/cli/parallel.h"

namespace mt::cli {

namespace {

// Lock-free, so the handler may set it on any thread (OpenMP workers, the saver, MPI's) while the
// main thread reads it; the exchange makes one of two simultaneous signals the first.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  const bool first = g_signal.compare_exchange_strong(expected, sig);
  if (!first && sig != SIGUSR1) {
    // A second SIGTERM / SIGINT: as if unhandled (the user insists; Open MPI sends SIGKILL soon).
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (first) {
    constexpr char kMsg[] =
        "meshtrain: stop requested: finishing this step, then saving a checkpoint (SIGTERM or SIGINT again ends "
        "the process at once)\n";
    ssize_t ignored = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);  // async-signal-safe
    (void)ignored;
  }
  if (!first) g_signal.store(sig);  // (a later SIGUSR1)
}

// A mapped --data shard cut short under the job (docs/data.md): the next read of a lost page is a
// SIGBUS, which ended the process with only the shell's "Bus error". The handler says what it
// most likely means, then raises it again under the default action (SA_RESETHAND restored it on
// entry), which ends the process as before (exit by signal 7, a core where enabled) once the
// handler returns. Raising it, rather than letting the faulting read run again, also ends a process
// sent SIGBUS with kill(1), which has no read to repeat.
extern "C" void on_bus_error(int) {
  constexpr char kMsg[] =
      "meshtrain: SIGBUS (bus error) reading a memory-mapped file: a --data or --val-data shard was most likely "
      "truncated or rewritten while this job read it; the run cannot go on. Do not rewrite the data of a running "
      "job; resume from the last checkpoint once the shards are whole\n";
  ssize_t ignored = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);  // async-signal-safe
  (void)ignored;
  std::raise(SIGBUS);  // pending until the handler returns (SIGBUS is blocked inside it)
}

}  // namespace

void install_bus_error_notice() {
  struct sigaction bus;
  std::memset(&bus, 0, sizeof(bus));
  bus.sa_handler = on_bus_error;
  sigemptyset(&bus.sa_mask);
  bus.sa_flags = SA_RESETHAND;
  ::sigaction(SIGBUS, &bus, nullptr);
}

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
  // A signal the process inherited as ignored (a background job of a script: SIGINT; `trap '' INT`)
  // stays ignored, as shells and CPython leave it.
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    ::sigaction(kSignals[i], nullptr, &saved_->old[i]);
    if (saved_->old[i].sa_handler != SIG_IGN) ::sigaction(kSignals[i], &sa, nullptr);
  }
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &saved_->old[i], nullptr);
  delete saved_;
}

int StopSignals::received() { return g_signal.load(); }

int StopSignals::agreed(const PlanContext* plan) { return static_cast<int>(max_over_job(received(), plan)); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace mt::cli
