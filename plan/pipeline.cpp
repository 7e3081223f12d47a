// Pipeline stages from a plan's stage lines, the schedules, and stage pruning (pipeline.h).
#include "plan/pipeline.h"

#include <algorithm>

#include "plan/path_regex.h"
#include "runtime/error.h"

namespace mt {
namespace {

// Stands where a unit of another stage was: no parameters, and a forward that says why.
class OtherStageModule : public Module {
 public:
  explicit OtherStageModule(int64_t stage) : stage_(stage) {}
  std::vector<Tensor> forward(const std::vector<Tensor>&) override {
    MT_FAIL("module '{}' lives on pipeline stage {}, not on this rank", path(), stage_);
  }

 private:
  int64_t stage_;
};

std::string unit_range(const PipelineLayout& l, const PipelineStage& s) {
  const std::string& a = l.units[static_cast<size_t>(s.first)].path;
  const std::string& b = l.units[static_cast<size_t>(s.last - 1)].path;
  return s.last - s.first == 1 ? a : a + " .. " + b;
}

}  // namespace

bool is_other_stage_module(const Module& m) { return dynamic_cast<const OtherStageModule*>(&m) != nullptr; }

bool is_stage_pruned(Module& model) {
  for (const auto& [path, m] : model.named_modules())
    if (is_other_stage_module(*m)) return true;
  return false;
}

std::vector<PipelineUnit> pipeline_units_of(Module& model, const std::vector<std::pair<std::string, bool>>& units) {
  std::vector<PipelineUnit> out;
  for (const auto& [path, is_layer] : units) {
    PipelineUnit u{path, is_layer, 0};
    for (const auto& [name, p] : model.get_module(path)->named_parameters()) u.params += p.shape().numel();
    out.push_back(std::move(u));
  }
  return out;
}

PipelineLayout resolve_pipeline(const Plan& plan, const PlanMesh& mesh, const std::vector<PipelineUnit>& units) {
  MT_CHECK(plan.is_pipeline(), "plan {}: no stage lines (not a pipeline plan)", plan.source());
  PipelineLayout l;
  l.dim = plan.pipeline_dim();
  l.schedule = plan.schedule_kind();
  l.units = units;
  const int d = mesh.dim_index(l.dim);
  MT_CHECK(d >= 0, "plan {}: pipeline dim '{}' is not in mesh {}", plan.source(), l.dim, mesh.str());
  const int64_t p = mesh.shape[static_cast<size_t>(d)];
  const int64_t V = plan.virtual_stages();
  const int64_t P = p * V;  // virtual stages
  l.virtual_stages = V;
  const auto n = static_cast<int64_t>(units.size());
  const auto& lines = plan.stage_entries();
  MT_CHECK(!lines.empty(), "{}: pipeline dim '{}' has a schedule but no stage lines; expected 'stages {}=even' "
           "or 'stage REGEX {}=K' lines", plan.schedule_loc().str(), l.dim, l.dim, l.dim);
  std::vector<int64_t> stage_of(static_cast<size_t>(n), -1);
  std::vector<const StageEntry*> by(static_cast<size_t>(n), nullptr);
  MT_CHECK(V == 1 || lines.front().even(), "{}: interleaved({}) splits the layers into {} x {} chunks itself; "
           "expected 'stages {}=even' instead of stage lines", plan.schedule_loc().str(), V, p, V, l.dim);
  if (lines.front().even()) {
    const StageEntry& e = lines.front();
    std::vector<int64_t> layers;
    for (int64_t i = 0; i < n; ++i)
      if (units[static_cast<size_t>(i)].is_layer) layers.push_back(i);
    const auto L = static_cast<int64_t>(layers.size());
    MT_CHECK(L > 0 && L % p == 0,
             "{}: {}=even needs the {} layers of the model to split evenly over {}={}; expected a {} size that "
             "divides {} (or 'stage REGEX {}=K' lines)",
             e.loc.str(), l.dim, L, l.dim, p, l.dim, L, l.dim);
    MT_CHECK(L % P == 0, "{}: interleaved({}) needs the {} layers to split evenly into {}={} x {} chunks; expected V "
             "with {} x V dividing {}{}", plan.schedule_loc().str(), V, L, l.dim, p, V, p, L,
             L < 2 * p ? fmt::format(" (no V >= 2 does: {} layers are fewer than 2 x {}; use 1f1b or gpipe)", L, p)
                       : std::string());
    const int64_t per = L / P;
    for (int64_t i = 0; i < n; ++i) {
      // Units before the first layer go with stage 0, units after the last with the last stage.
      const auto before = std::count_if(layers.begin(), layers.end(), [&](int64_t x) { return x < i; });
      const bool layer = units[static_cast<size_t>(i)].is_layer;
      stage_of[static_cast<size_t>(i)] = std::min(P - 1, layer ? before / per : (before == 0 ? 0 : (before - 1) / per));
      if (!layer && before == L) stage_of[static_cast<size_t>(i)] = P - 1;
      by[static_cast<size_t>(i)] = &e;
    }
  } else {
    for (const auto& e : lines) {
      MT_CHECK(e.stage < p, "{}: stage {} is outside mesh dim {} of size {}; expected {}=0 .. {}={}",
               e.how_loc.str(), e.stage, l.dim, p, l.dim, l.dim, p - 1);
      PathRegex re(e.module_re, e.module_loc, "a regex over pipeline unit paths");
      int hits = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (!re.full_match(units[static_cast<size_t>(i)].path)) continue;
        ++hits;
        const StageEntry* prev = by[static_cast<size_t>(i)];
        MT_CHECK(prev == nullptr, "{}: '{}' assigns {} to stage {}, but {} assigned it to stage {} already; "
                 "expected each unit on one stage", e.module_loc.str(), e.module_re, units[static_cast<size_t>(i)].path,
                 e.stage, prev ? prev->loc.str() : "", prev ? prev->stage : 0);
        by[static_cast<size_t>(i)] = &e;
        stage_of[static_cast<size_t>(i)] = e.stage;
      }
      std::string names;
      for (size_t i = 0; i < units.size() && i < 6; ++i) names += (i ? ", " : "") + units[i].path;
      if (units.size() > 6) names += ", ..";
      MT_CHECK(hits > 0, "{}: '{}' matches no pipeline unit; the units are: {}", e.module_loc.str(), e.module_re,
               names);
    }
    for (int64_t i = 0; i < n; ++i)
      MT_CHECK(stage_of[static_cast<size_t>(i)] >= 0,
               "plan {}: pipeline unit {} is on no stage; expected a 'stage REGEX {}=K' line that matches it (first "
               "stage line at {})", plan.source(), units[static_cast<size_t>(i)].path, l.dim, lines.front().loc.str());
  }
  l.chunks.resize(static_cast<size_t>(P));
  for (int64_t s = 0; s < P; ++s) l.chunks[static_cast<size_t>(s)].first = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = stage_of[static_cast<size_t>(i)];
    if (i > 0) {
      const int64_t prev = stage_of[static_cast<size_t>(i - 1)];
      MT_CHECK(s == prev || s == prev + 1,
               "{}: {} is on stage {} but the unit before it, {}, on stage {}; expected every stage to hold the next "
               "units in forward order (stage k+1 right after stage k)",
               by[static_cast<size_t>(i)]->loc.str(), units[static_cast<size_t>(i)].path, s,
               units[static_cast<size_t>(i - 1)].path, prev);
    } else {
      MT_CHECK(s == 0, "{}: the first unit {} is on stage {}; expected stage 0 to start the pipeline",
               by[0]->loc.str(), units[0].path, s);
    }
    PipelineStage& st = l.chunks[static_cast<size_t>(s)];
    if (st.first < 0) st.first = i;
    st.last = i + 1;
    st.params += units[static_cast<size_t>(i)].params;
    const PlanLoc& loc = by[static_cast<size_t>(i)]->loc;
    if (std::none_of(st.from.begin(), st.from.end(), [&](const PlanLoc& f) { return f.line == loc.line && f.file == loc.file; }))
      st.from.push_back(loc);
  }
  for (int64_t s = 0; s < P; ++s)
    MT_CHECK(l.chunks[static_cast<size_t>(s)].first >= 0,
             "plan {}: stage {} of {}={} gets no unit; expected every stage to hold at least one", plan.source(), s,
             l.dim, p);
  // Per rank: its chunks' parameters and plan lines; first/last those of its chunk 0.
  l.stages.resize(static_cast<size_t>(p));
  for (int64_t c = 0; c < P; ++c) {
    const PipelineStage& ch = l.chunks[static_cast<size_t>(c)];
    PipelineStage& st = l.stages[static_cast<size_t>(c % p)];
    if (c < p) {
      st.first = ch.first;
      st.last = ch.last;
    }
    st.params += ch.params;
    for (const PlanLoc& f : ch.from)
      if (std::none_of(st.from.begin(), st.from.end(), [&](const PlanLoc& x) { return x.line == f.line && x.file == f.file; }))
        st.from.push_back(f);
  }
  return l;
}

void prune_to_stage(Module& model, const PipelineLayout& layout, int64_t stage, const std::vector<std::string>& keep) {
  MT_CHECK(stage >= 0 && stage < layout.size(), "prune_to_stage: stage {} of {}", stage, layout.size());
  for (int64_t s = 0; s < layout.size(); ++s) {
    if (s == stage) continue;
    for (int64_t v = 0; v < layout.virtual_stages; ++v) {
    const PipelineStage& st = layout.chunk(s, v);
    for (int64_t i = st.first; i < st.last; ++i)
      if (std::find(keep.begin(), keep.end(), layout.units[static_cast<size_t>(i)].path) == keep.end())
        (void)model.replace_module(layout.units[static_cast<size_t>(i)].path, std::make_shared<OtherStageModule>(s));
    }
  }
}

std::string PipelineLayout::str(int64_t micro_batches) const {
  const int64_t V = virtual_stages;
  std::string out = fmt::format("pipeline over {} ({} stages{}), schedule {}\n", dim, size(),
                                V > 1 ? fmt::format(" x {} virtual", V) : "", schedule_name(schedule));
  for (int64_t s = 0; s < size(); ++s) {
    if (V == 1) {
      const PipelineStage& st = stages[static_cast<size_t>(s)];
      out += fmt::format("  stage {}: {} ({} unit{}, {} parameters)\n", s, unit_range(*this, st), st.last - st.first,
                         st.last - st.first == 1 ? "" : "s", st.params);
      continue;
    }
    std::string parts;
    for (int64_t v = 0; v < V; ++v) parts += fmt::format("{}{}", v ? " + " : "", unit_range(*this, chunk(s, v)));
    out += fmt::format("  stage {}: {} ({} parameters)\n", s, parts, stages[static_cast<size_t>(s)].params);
  }
  out += fmt::format("  {} micro-batches (--accum): ideal bubble fraction {} = {:.3f}\n", micro_batches,
                     V > 1 ? "(p-1)/(V*m+p-1)" : "(p-1)/(m+p-1)", bubble_fraction_theory(size(), micro_batches, V));
  if (schedule != PipelineScheduleKind::kInterleaved || micro_batches % size() == 0)
    out += schedule_table(schedule, size(), micro_batches, V);
  return out;
}

std::vector<PipelineAction> pipeline_schedule(PipelineScheduleKind kind, int64_t stages, int64_t stage,
                                              int64_t micros, int64_t virtual_stages) {
  MT_CHECK(stages >= 1 && stage >= 0 && stage < stages && micros >= 1, "pipeline_schedule: stage {} of {}, {} micros",
           stage, stages, micros);
  std::vector<PipelineAction> a;
  if (kind == PipelineScheduleKind::kGPipe) {
    // Every forward, then every backward; with several chunks per stage (eval and grad run an
    // interleaved plan this way) chunk by chunk, each chunk's micro-batches in order.
    const int64_t V = std::max<int64_t>(virtual_stages, 1);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t m = 0; m < micros; ++m) a.push_back({true, m, v});
    for (int64_t v = V - 1; v >= 0; --v)
      for (int64_t m = 0; m < micros; ++m) a.push_back({false, m, v});
    return a;
  }
  if (kind == PipelineScheduleKind::kInterleaved) {
    const int64_t V = virtual_stages, p = stages;
    MT_CHECK(V >= 1 && micros % p == 0, "pipeline_schedule: interleaved needs micro-batches ({}) in multiples of the "
             "{} stages", micros, p);
    const int64_t total = micros * V;
    // The k-th forward (backward) of this stage: micro-batch and chunk.
    auto micro_of = [&](int64_t k) { return (k / (p * V)) * p + k % p; };
    auto chunk_of = [&](int64_t k, bool forward) {
      const int64_t c = (k / p) % V;
      return forward ? c : V - 1 - c;
    };
    const int64_t warm = std::min((p - stage - 1) * 2 + (V - 1) * p, total);
    int64_t f = 0, b = 0;
    for (; f < warm; ++f) a.push_back({true, micro_of(f), chunk_of(f, true)});
    while (f < total) {
      a.push_back({true, micro_of(f), chunk_of(f, true)});
      ++f;
      a.push_back({false, micro_of(b), chunk_of(b, false)});
      ++b;
    }
    for (; b < total; ++b) a.push_back({false, micro_of(b), chunk_of(b, false)});
    return a;
  }
  const int64_t warm = std::min(stages - stage - 1, micros);
  int64_t f = 0, b = 0;
  for (; f < warm; ++f) a.push_back({true, f, 0});
  while (f < micros) {
    a.push_back({true, f++, 0});
    a.push_back({false, b++, 0});
  }
  while (b < micros) a.push_back({false, b++, 0});
  return a;
}

double bubble_fraction_theory(int64_t stages, int64_t micros, int64_t virtual_stages) {
  return static_cast<double>(stages - 1) / static_cast<double>(virtual_stages * micros + stages - 1);
}

double pipeline_shared_stretch(PipelineScheduleKind kind, int64_t stages, int64_t micros, int64_t virtual_stages,
                               double crowding) {
  const int64_t p = stages, V = virtual_stages, chunks = p * V;
  MT_CHECK(p >= 1 && micros >= 1 && V >= 1 && crowding >= 1, "pipeline_shared_stretch: {} stages, {} micros, V {}, "
           "crowding {}", p, micros, V, crowding);
  std::vector<std::vector<PipelineAction>> acts;
  for (int64_t s = 0; s < p; ++s) acts.push_back(pipeline_schedule(kind, p, s, micros, V));
  // done[dir][micro * chunks + chunk]: the action has finished (dir 0 forward, 1 backward).
  std::vector<std::vector<char>> done(2, std::vector<char>(static_cast<size_t>(micros * chunks), 0));
  auto idx = [&](int64_t m, int64_t c) { return static_cast<size_t>(m * chunks + c); };
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> left(static_cast<size_t>(p), -1);  // work left of the current action (-1: not started)
  const double fwd = 1.0 / 3.0 / static_cast<double>(V), bwd = 2.0 / 3.0 / static_cast<double>(V);
  double now = 0;
  for (;;) {
    std::vector<int64_t> running;
    bool all_done = true;
    for (int64_t s = 0; s < p; ++s) {
      const size_t si = static_cast<size_t>(s);
      if (next[si] == acts[si].size()) continue;
      all_done = false;
      const PipelineAction& a = acts[si][next[si]];
      const int64_t c = a.chunk * p + s;
      const bool ready = a.forward ? (c == 0 || done[0][idx(a.micro, c - 1)])
                                   : (c == chunks - 1 || done[1][idx(a.micro, c + 1)]);
      if (!ready) continue;
      if (left[si] < 0) left[si] = a.forward ? fwd : bwd;
      running.push_back(s);
    }
    if (all_done) break;
    MT_CHECK(!running.empty(), "pipeline_shared_stretch: the schedule waits forever at time {}", now);
    const double rate =
        std::min(1.0, static_cast<double>(p) / (static_cast<double>(running.size()) * crowding));
    double dt = 1e300;
    for (int64_t s : running) dt = std::min(dt, left[static_cast<size_t>(s)] / rate);
    now += dt;
    for (int64_t s : running) {
      const size_t si = static_cast<size_t>(s);
      left[si] -= dt * rate;
      if (left[si] <= 1e-12) {
        const PipelineAction& a = acts[si][next[si]];
        done[a.forward ? 0 : 1][idx(a.micro, a.chunk * p + s)] = 1;
        ++next[si];
        left[si] = -1;
      }
    }
  }
  return now / static_cast<double>(micros);
}

std::string schedule_table(PipelineScheduleKind kind, int64_t stages, int64_t micros, int64_t virtual_stages) {
  std::string out;
  for (int64_t s = 0; s < stages; ++s) {
    out += fmt::format("  stage {}:", s);
    for (const auto& a : pipeline_schedule(kind, stages, s, micros, virtual_stages)) {
      out += fmt::format(" {}{}", a.forward ? 'F' : 'B', a.micro);
      if (kind == PipelineScheduleKind::kInterleaved) out += fmt::format(".{}", a.chunk);
    }
    out += "\n";
  }
  return out;
}

}  // namespace mt
