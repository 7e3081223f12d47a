// The profiler (docs/profiler.md): while a Profiler lives on a thread, every kernel call that
// thread makes (MT_KERNEL, kernels/registry.h) is recorded with the module it runs in, the shapes
// and dtype of its operands, its device, its time and the FLOPs and bytes kernels/cost.h gives it;
// so is every module call (Module::operator()), every autograd node run by backward (with the
// module that created it), every collective issued (kind, mesh dims, bytes) and every region the
// caller marks (ProfileScope, e.g. one training step). write_chrome_trace() writes the Chrome
// trace event format (chrome://tracing, https://ui.perfetto.dev); summary() is a table of the top
// ops and modules by time with their share of the marked steps.
//
// Cost when no profiler (nor KernelCostScope) is active: one relaxed load of a process-wide
// counter and a branch per kernel call, module call and autograd node (kernel_hooks_armed()).
// With CUDA tensors each kernel is followed by a device synchronize while profiling, so that op
// times are device times (the profiled run is serialized; its total is not the unprofiled one).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace mt {

namespace detail {
// Active Profilers and KernelCostScopes in the process, all threads: zero means no hook runs.
extern std::atomic<int> g_kernel_hooks;
}  // namespace detail

// True while some thread has a Profiler or a KernelCostScope: the kernel, module and autograd
// hooks then look at their own thread's state. The one test on the fast path.
inline bool kernel_hooks_armed() { return detail::g_kernel_hooks.load(std::memory_order_relaxed) != 0; }

struct ProfileEvent {
  enum class Kind : uint8_t { kOp, kModule, kBackward, kCollective, kRegion };
  Kind kind = Kind::kOp;
  std::string name;     // op: kernel family; module: its path; backward: node name; collective:
                        // its kind; region: the caller's name
  std::string module;   // op, backward: the innermost module (path; "" outside any module)
  bool backward = false;  // op: run by backward (its module is the one whose forward made the node)
  std::string shapes;   // op: the operand views' shapes in kernels/params.h order, e.g. "[4,16] [16,8] [4,8]"
  std::string dtype;    // op: the first operand's dtype
  std::string device;   // op: cpu, cuda
  std::string dims;     // collective: the mesh dims of its group ("dp", "dp,tp", "world")
  int64_t group = 0;    // collective: ranks in the group
  double ts_us = 0;     // start, microseconds since the Profiler started
  double dur_us = 0;
  double flops = 0;     // op: matmul / attention FLOPs (kernels/cost.h; other families count bytes only)
  double bytes = 0;     // op: bytes read and written; collective: its buffer on this rank
};

class Profiler {
 public:
  Profiler();  // starts recording this thread; one Profiler per thread at a time
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // This thread's recording Profiler, or nullptr. Call behind kernel_hooks_armed().
  static Profiler* current();
  void stop();  // ends recording (idempotent); the events stay

  const std::vector<ProfileEvent>& events() const { return events_; }
  // Chrome trace event format (JSON object with traceEvents; "X" events in microseconds, one
  // process `pid`, e.g. the rank). Errors name the path.
  void write_chrome_trace(const std::string& path, int pid = 0) const;
  // The table: totals, then the top `top` ops (kernel family) and modules by time, each with its
  // calls, time, share of the marked regions' time (of the recorded span when none), GFLOP and
  // GFLOP/s, then the collectives by kind and dims.
  std::string summary(int top = 12) const;

  // ---- hooks (kernels/, tensor/, mesh/) ----
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
  }
  void add_event(ProfileEvent e) { events_.push_back(std::move(e)); }
  const std::string& current_module() const;
  bool in_backward() const { return !frames_.empty() && frames_.back().backward; }
  // An autograd node created now (tensor/autograd.cpp) remembers the module around it.
  void note_node(uint64_t seq);
  std::string take_node_module(uint64_t seq);
  void add_collective(const char* kind, const std::string& dims, int64_t group, int64_t bytes);

 private:
  friend class ProfileScope;
  struct Frame {
    std::string module;
    bool backward = false;
  };
  std::chrono::steady_clock::time_point start_;
  std::vector<ProfileEvent> events_;
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, std::string> node_modules_;
  Profiler* prev_ = nullptr;
  bool recording_ = true;
};

// A timed span on this thread's Profiler (no-op without one). kModule and kBackward spans also
// set the module that ops inside them are attributed to; kRegion marks a step (summary()'s 100%).
class ProfileScope {
 public:
  ProfileScope(ProfileEvent::Kind kind, std::string name, std::string module = {});
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* prof_;
  ProfileEvent ev_;
  bool pushed_ = false;
};

}  // namespace mt
