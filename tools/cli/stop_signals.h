// Stopping a training run cleanly (docs/cli.md, "Stopping a run"): SIGTERM, SIGINT or SIGUSR1 make
// `train` finish the step in progress, save a checkpoint of it (with --checkpoint-dir) and exit with
// 128 + the signal's number. Under --plan every rank stops after the same step: the signal is
// agreed on with one small all_reduce per step. A second SIGTERM or SIGINT ends the process at once.
#pragma once

namespace mt::cli {

struct PlanContext;

class StopSignals {
 public:
  // Installs the handlers; the destructor restores the previous ones.
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal that asked this process to stop, 0 if none.
  static int received();
  // The signal to stop for after this step, 0 to go on. Collective under a plan (every rank calls
  // it after every step): the largest signal number any rank received, so that all stop together.
  static int agreed(const PlanContext* plan);

 private:
  struct Saved;
  Saved* saved_;
};

// For the whole process (main, before any command): a SIGBUS first says that a memory-mapped
// --data / --val-data shard (the only files the CLI maps) was most likely cut short under the job,
// then ends the process by the default action, as without the handler.
void install_bus_error_notice();

// "SIGTERM", "SIGINT", "SIGUSR1" or "signal N".
const char* signal_name(int sig);

}  // namespace mt::cli
