// The profiler (profiler.h): this thread's event list, the Chrome trace writer and the summary.
#include "runtime/profiler.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/file_io.h"

namespace mt {

std::atomic<int> detail::g_kernel_hooks{0};

namespace {
thread_local Profiler* t_current = nullptr;
const std::string kNoModule;

const char* category(ProfileEvent::Kind k) {
  switch (k) {
    case ProfileEvent::Kind::kOp: return "op";
    case ProfileEvent::Kind::kModule: return "module";
    case ProfileEvent::Kind::kBackward: return "backward";
    case ProfileEvent::Kind::kCollective: return "collective";
    case ProfileEvent::Kind::kRegion: return "region";
  }
  return "?";
}
}  // namespace

Profiler::Profiler() : start_(std::chrono::steady_clock::now()), prev_(t_current) {
  MT_CHECK(prev_ == nullptr, "Profiler: this thread already has a recording Profiler (one at a time)");
  t_current = this;
  detail::g_kernel_hooks.fetch_add(1, std::memory_order_relaxed);
}

Profiler::~Profiler() { stop(); }

Profiler* Profiler::current() { return t_current; }

void Profiler::stop() {
  if (!recording_) return;
  recording_ = false;
  if (t_current == this) t_current = prev_;
  detail::g_kernel_hooks.fetch_sub(1, std::memory_order_relaxed);
  node_modules_.clear();
}

const std::string& Profiler::current_module() const { return frames_.empty() ? kNoModule : frames_.back().module; }

void Profiler::note_node(uint64_t seq) {
  if (!frames_.empty()) node_modules_[seq] = frames_.back().module;
}

std::string Profiler::take_node_module(uint64_t seq) {
  auto it = node_modules_.find(seq);
  if (it == node_modules_.end()) return {};
  std::string m = std::move(it->second);
  node_modules_.erase(it);
  return m;
}

void Profiler::add_collective(const char* kind, const std::string& dims, int64_t group, int64_t bytes) {
  ProfileEvent e;
  e.kind = ProfileEvent::Kind::kCollective;
  e.name = kind;
  e.module = current_module();
  e.backward = in_backward();
  e.dims = dims;
  e.group = group;
  e.bytes = static_cast<double>(bytes);
  e.ts_us = now_us();
  events_.push_back(std::move(e));
}

ProfileScope::ProfileScope(ProfileEvent::Kind kind, std::string name, std::string module)
    : prof_(Profiler::current()) {
  if (!prof_) return;
  ev_.kind = kind;
  ev_.name = std::move(name);
  ev_.module = std::move(module);
  if (kind == ProfileEvent::Kind::kModule) ev_.module = ev_.name;
  if (kind == ProfileEvent::Kind::kModule || kind == ProfileEvent::Kind::kBackward) {
    prof_->frames_.push_back({ev_.module, kind == ProfileEvent::Kind::kBackward});
    pushed_ = true;
  }
  ev_.backward = kind == ProfileEvent::Kind::kBackward;
  ev_.ts_us = prof_->now_us();
}

ProfileScope::~ProfileScope() {
  if (!prof_) return;
  // The profiler may have stopped inside the scope; its frames and events are still its own.
  ev_.dur_us = prof_->now_us() - ev_.ts_us;
  if (pushed_ && !prof_->frames_.empty()) prof_->frames_.pop_back();
  prof_->events_.push_back(std::move(ev_));
}

void Profiler::write_chrome_trace(const std::string& path, int pid) const {
  nlohmann::json events = nlohmann::json::array();
  for (const ProfileEvent& e : events_) {
    nlohmann::json args = nlohmann::json::object();
    if (!e.module.empty() || e.kind == ProfileEvent::Kind::kOp) args["module"] = e.module;
    if (e.kind == ProfileEvent::Kind::kOp) {
      args["shapes"] = e.shapes;
      args["dtype"] = e.dtype;
      args["device"] = e.device;
      args["flops"] = e.flops;
      args["bytes"] = e.bytes;
      args["phase"] = e.backward ? "backward" : "forward";
    }
    if (e.kind == ProfileEvent::Kind::kCollective) {
      args["dims"] = e.dims;
      args["group"] = e.group;
      args["bytes"] = e.bytes;
    }
    nlohmann::json j = {{"name", e.name}, {"cat", category(e.kind)}, {"pid", pid}, {"tid", 0}, {"ts", e.ts_us},
                        {"args", std::move(args)}};
    if (e.kind == ProfileEvent::Kind::kCollective) {
      j["ph"] = "i";  // issued here; the transfer overlaps what follows
      j["s"] = "t";
      j["dur"] = 0;
    } else {
      j["ph"] = "X";
      j["dur"] = e.dur_us;
    }
    events.push_back(std::move(j));
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  try {
    write_file_atomically(path, [&](std::ostream& f) { f << doc.dump() << "\n"; });
  } catch (const Error& e) {
    MT_FAIL("profiler: the trace file: {}", e.what());
  }
}

std::string Profiler::summary(int top) const {
  struct Row {
    int64_t calls = 0;
    double us = 0, flops = 0, bytes = 0;
  };
  double region_us = 0, op_us = 0, first = 1e300, last = 0;
  int64_t regions = 0, ops = 0, outside = 0;
  std::map<std::string, Row> by_op, by_module;
  std::map<std::pair<std::string, std::string>, Row> by_coll;
  // With marked regions (train's steps), the tables count what ran inside them: the shares are of
  // the steps' time, and work between the steps (a validation loss, samples) would push them past
  // 100% (it did until 2026-12-08). The trace keeps every event.
  std::vector<std::pair<double, double>> spans;
  for (const ProfileEvent& e : events_)
    if (e.kind == ProfileEvent::Kind::kRegion) spans.emplace_back(e.ts_us, e.ts_us + e.dur_us);
  std::sort(spans.begin(), spans.end());
  {  // their union: regions may nest (the library's scopes), train's steps do not
    std::vector<std::pair<double, double>> merged;
    for (const auto& sp : spans) {
      if (!merged.empty() && sp.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, sp.second);
      else
        merged.push_back(sp);
    }
    spans = std::move(merged);
  }
  auto inside = [&](const ProfileEvent& e) {
    if (spans.empty()) return true;
    auto it = std::upper_bound(spans.begin(), spans.end(), std::make_pair(e.ts_us, 1e300));
    return it != spans.begin() && e.ts_us + e.dur_us <= std::prev(it)->second;
  };
  for (const ProfileEvent& e : events_) {
    first = std::min(first, e.ts_us);
    last = std::max(last, e.ts_us + e.dur_us);
    if (e.kind != ProfileEvent::Kind::kRegion && !inside(e)) {
      outside += e.kind == ProfileEvent::Kind::kOp ? 1 : 0;
      continue;
    }
    if (e.kind == ProfileEvent::Kind::kRegion) {
      region_us += e.dur_us;
      ++regions;
    } else if (e.kind == ProfileEvent::Kind::kOp) {
      op_us += e.dur_us;
      ++ops;
      for (Row* r : {&by_op[e.name], &by_module[(e.module.empty() ? std::string("(no module)") : e.module) +
                                               (e.backward ? " [bwd]" : "")]}) {
        ++r->calls;
        r->us += e.dur_us;
        r->flops += e.flops;
        r->bytes += e.bytes;
      }
    } else if (e.kind == ProfileEvent::Kind::kCollective) {
      Row& r = by_coll[{e.name, e.dims}];
      ++r.calls;
      r.bytes += e.bytes;
    }
  }
  const double total_us = regions > 0 ? region_us : std::max(0.0, last - (first > last ? last : first));
  const char* total_what = regions > 0 ? "marked steps" : "recorded span";
  auto share = [&](double us) { return total_us > 0 ? 100.0 * us / total_us : 0.0; };
  std::string out = fmt::format("profile: {} {:.1f} ms; {} op calls {:.1f} ms ({:.1f}%){}\n", total_what,
                                total_us / 1e3, ops, op_us / 1e3, share(op_us),
                                outside > 0 ? fmt::format("; {} op calls between them left out (in the trace)", outside)
                                            : std::string());
  auto table = [&](const char* title, const std::map<std::string, Row>& rows) {
    std::vector<std::pair<std::string, Row>> v(rows.begin(), rows.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    out += fmt::format("{:<40} {:>8} {:>10} {:>7} {:>9} {:>9}\n", title, "calls", "ms", "share", "GFLOP", "GFLOP/s");
    for (size_t i = 0; i < v.size() && i < static_cast<size_t>(top); ++i) {
      const Row& r = v[i].second;
      std::string name = v[i].first.size() > 40 ? "..." + v[i].first.substr(v[i].first.size() - 37) : v[i].first;
      out += fmt::format("{:<40} {:>8} {:>10.2f} {:>6.1f}% {:>9.3f} {:>9.1f}\n", name, r.calls, r.us / 1e3,
                         share(r.us), r.flops * 1e-9, r.us > 0 ? r.flops / r.us * 1e-3 : 0.0);
    }
  };
  table("op (kernel family)", by_op);
  table("module (op time inside it; [bwd]: backward)", by_module);
  if (!by_coll.empty()) {
    out += fmt::format("{:<24} {:<16} {:>8} {:>12}\n", "collective", "mesh dims", "calls", "MiB");
    for (const auto& [key, r] : by_coll)
      out += fmt::format("{:<24} {:<16} {:>8} {:>12.3f}\n", key.first, key.second, r.calls, r.bytes / (1 << 20));
  }
  return out;
}

}  // namespace mt
