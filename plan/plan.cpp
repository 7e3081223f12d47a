// Plan builder and plan-file parser. Both funnel into the same checks (Plan::add_entry), so a
// builder call and a file line with the same text are the same entry and fail the same way; only
// the location differs ("<builder>:3" vs "plans/x.plan:3:14").
#include "plan/plan.h"

#include <fstream>
#include <set>

#include "plan/path_regex.h"
#include "runtime/error.h"
#include "runtime/shape.h"

namespace mt {

namespace {

constexpr const char* kKeywords =
    "mesh, place, init, run, redistribute, annotate, factory, dispatch, fsdp, stage, stages, schedule";
// A plan is a page of text (the stock plans are under 2 KiB); anything far larger is not a plan.
constexpr size_t kMaxPlanBytes = size_t{1} << 20;

struct Token {
  std::string text;
  int column = 0;  // 1-based
};

// Splits a line into whitespace-separated tokens; parentheses and brackets group (so
// "RS(0, [2, 1])" is one token), "->" is always a token of its own, '#' starts a comment.
// A backslash escapes the next character (regexes: "\(" does not open a group, "\#" is no comment).
// The first `ungrouped` tokens (keyword, module regex, tensor) do not group, so an unbalanced
// parenthesis in a regex is reported as a bad regex, not as a swallowed line.
std::vector<Token> tokenize(std::string_view line, size_t ungrouped = 0) {
  std::vector<Token> out;
  std::string cur;
  int cur_col = 0, depth = 0;
  auto flush = [&] {
    if (!cur.empty()) out.push_back({cur, cur_col});
    cur.clear();
  };
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    int col = static_cast<int>(i) + 1;
    if (c == '\\' && i + 1 < line.size()) {
      if (cur.empty()) cur_col = col;
      cur += c;
      cur += line[++i];
      continue;
    }
    if (depth == 0 && c == '#') break;
    if (depth == 0 && (c == ' ' || c == '\t' || c == '\r')) {
      flush();
      continue;
    }
    if (depth == 0 && c == '-' && i + 1 < line.size() && line[i + 1] == '>') {
      flush();
      out.push_back({"->", col});
      ++i;
      continue;
    }
    bool grouping = out.size() >= ungrouped;
    if (grouping && (c == '(' || c == '[')) ++depth;
    if (grouping && (c == ')' || c == ']') && depth > 0) --depth;
    if (cur.empty()) cur_col = col;
    cur += c;
  }
  flush();
  return out;
}

// The location of a token at `column` of a line whose start is `base` (builder calls have no
// columns: the call is the location).
PlanLoc at(const PlanLoc& base, int column) {
  PlanLoc l = base;
  if (base.column > 0) l.column = base.column - 1 + column;
  return l;
}

// `s` for a message: bytes outside printable ASCII as \xNN (a UTF-8 byte-order mark or binary
// data is shown, not echoed).
std::string printable(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 80)) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += ch;
  }
  if (s.size() > 80) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// A plan number: 1 to 9 decimal digits, so that it fits an int (std::stoll would throw on longer).
bool small_number(const std::string& s) {
  return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
}

// "tp=S(0)" or "ep=owner(1)".
DimPlacement parse_dim_placement(const std::string& text, const PlanLoc& loc) {
  size_t eq = text.find('=');
  MT_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < text.size(),
           "{}: '{}' is not a placement on a mesh dim; expected DIM=PLACEMENT such as tp=S(0), dp=R, "
           "tp=P(sum), tp=IS(0,3) or ep=owner(1)",
           loc.str(), text);
  DimPlacement d;
  d.dim = text.substr(0, eq);
  d.loc = loc;
  std::string p = text.substr(eq + 1);
  if (p == "all_to_all") {
    d.dispatch = p;
    return d;
  }
  if (p == "rows" || p == "whole") {
    d.fsdp_rows = p == "rows" ? 1 : DimPlacement::kFsdpWhole;
    return d;
  }
  if (p.rfind("rows(", 0) == 0 && p.back() == ')') {
    const std::string n = p.substr(5, p.size() - 6);
    MT_CHECK(small_number(n) && std::stoll(n) > 0,
             "{}: '{}': rows(N) needs a positive number of rows of at most 9 digits, e.g. dp=rows(32)", loc.str(),
             text);
    d.fsdp_rows = std::stoll(n);
    return d;
  }
  if (p.rfind("owner(", 0) == 0 && p.back() == ')') {
    std::string k = p.substr(6, p.size() - 7), dim;
    if (size_t comma = k.find(','); comma != std::string::npos) {
      dim = k.substr(comma + 1);
      k = k.substr(0, comma);
    }
    MT_CHECK(small_number(k) && (dim.empty() || small_number(dim)),
             "{}: '{}': owner(K) or owner(K,D) needs a mesh coordinate K >= 0 (and a tensor dim D), each "
             "at most 9 digits, e.g. ep=owner(1) or ep=owner(1,1)",
             loc.str(), text);
    d.owner = std::stoll(k);
    if (!dim.empty()) d.owner_dim = static_cast<int>(std::stoll(dim));
    return d;
  }
  try {
    d.placement = Placement::parse(p);
  } catch (const Error& e) {
    MT_FAIL("{}: '{}' is not a placement on a mesh dim ({}); expected DIM=PLACEMENT such as tp=S(0), "
            "dp=R, tp=P(sum), tp=IS(0,3) or ep=owner(1)",
            loc.str(), text, e.what());
  }
  return d;
}

How parse_how_tokens(const std::vector<Token>& toks, size_t begin, size_t end, const PlanLoc& base) {
  How how;
  for (size_t i = begin; i < end; ++i) how.push_back(parse_dim_placement(toks[i].text, at(base, toks[i].column)));
  return how;
}

How parse_how_text(const std::string& text, const PlanLoc& base) {
  auto toks = tokenize(text);
  return parse_how_tokens(toks, 0, toks.size(), base);
}

// An fsdp entry's unit options (`reshard=yes|no`, `prefetch=yes|no`) taken out of toks[begin..]
// into e; the other tokens stay, in order.
void take_fsdp_options(std::vector<Token>& toks, size_t begin, PlanEntry& e, const PlanLoc& base) {
  std::vector<Token> rest(toks.begin(), toks.begin() + static_cast<std::ptrdiff_t>(begin));
  for (size_t i = begin; i < toks.size(); ++i) {
    const std::string& t = toks[i].text;
    const size_t eq = t.find('=');
    const std::string key = eq == std::string::npos ? t : t.substr(0, eq);
    if (key != "reshard" && key != "prefetch") {
      rest.push_back(toks[i]);
      continue;
    }
    const PlanLoc loc = at(base, toks[i].column);
    const std::string value = eq == std::string::npos ? "" : t.substr(eq + 1);
    MT_CHECK(value == "yes" || value == "no", "{}: '{}': expected {}=yes or {}=no", loc.str(), printable(t), key, key);
    int& field = key == "reshard" ? e.fsdp_reshard : e.fsdp_prefetch;
    MT_CHECK(field == -1, "{}: '{}' is given twice in one fsdp entry", loc.str(), key);
    field = value == "yes" ? 1 : 0;
  }
  toks = std::move(rest);
}

std::string how_str(const How& how) {
  std::string s;
  for (const auto& d : how) { s += s.empty() ? "" : " "; s += d.str(); }
  return s;
}

bool is_param_entry(const PlanEntry& e) {
  return !parse_io_ref(e.tensor).valid() && e.kind != PlanEntryKind::kFactory && e.kind != PlanEntryKind::kDispatch;
}

}  // namespace

// ---- small types ----

std::string PlanLoc::str() const {
  if (column > 0) return fmt::format("{}:{}:{}", file, line, column);
  return fmt::format("{}:{}", file, line);
}

std::string DimPlacement::placement_str() const {
  if (!dispatch.empty()) return dispatch;
  if (fsdp_rows == kFsdpWhole) return "whole";
  if (fsdp_rows == 1) return "rows";
  if (fsdp_rows > 1) return fmt::format("rows({})", fsdp_rows);
  if (owner >= 0) return owner_dim ? fmt::format("owner({},{})", owner, owner_dim) : fmt::format("owner({})", owner);
  return placement.str();
}

int PlanMesh::dim_index(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  return -1;
}

std::vector<int64_t> PlanMesh::coordinate_of(int64_t rank) const {
  std::vector<int64_t> c(static_cast<size_t>(ndim()));
  for (int d = ndim() - 1; d >= 0; --d) {
    c[static_cast<size_t>(d)] = rank % shape[d];
    rank /= shape[d];
  }
  return c;
}

std::string PlanMesh::str() const {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) s += fmt::format("{}{}={}", i ? ", " : "", names[i], shape[i]);
  return s + "]";
}

IoRef parse_io_ref(std::string_view t) {
  IoRef r;
  std::string_view rest;
  if (t.rfind("<in>:", 0) == 0) {
    r.is_input = true;
    rest = t.substr(5);
  } else if (t.rfind("<out>:", 0) == 0) {
    rest = t.substr(6);
  } else {
    return r;
  }
  if (rest.empty() || rest.size() > 6 || rest.find_first_not_of("0123456789") != std::string_view::npos) return r;
  r.index = std::stoi(std::string(rest));
  return r;
}

std::string PlanEntry::keyword() const {
  switch (kind) {
    case PlanEntryKind::kPlace:
      return phase == PlanPhase::kInit ? "init" : phase == PlanPhase::kRun ? "run" : "place";
    case PlanEntryKind::kRedistribute: return "redistribute";
    case PlanEntryKind::kAnnotate: return "annotate";
    case PlanEntryKind::kFactory: return "factory";
    case PlanEntryKind::kDispatch: return "dispatch";
    case PlanEntryKind::kFsdp: return "fsdp";
  }
  return "?";
}

std::string PlanEntry::str() const {
  std::string re = module_re.empty() ? "()" : module_re;
  std::string s = fmt::format("{} {} {} ", keyword(), re, tensor);
  if (kind == PlanEntryKind::kRedistribute) {
    s += how_str(src) + " -> " + how_str(how);
    if (!grad_src.empty()) s += " grad " + how_str(grad_src) + " -> " + how_str(grad_dst);
  } else {
    s += how_str(how);
  }
  if (fsdp_reshard >= 0) s += fsdp_reshard ? " reshard=yes" : " reshard=no";
  if (fsdp_prefetch >= 0) s += fsdp_prefetch ? " prefetch=yes" : " prefetch=no";
  return s;
}

// ---- Plan ----

Plan Plan::with_mesh_sizes(const std::map<std::string, int64_t>& sizes) const {
  std::vector<MeshDimDecl> dims = mesh_;
  for (auto& d : dims) {
    const auto it = sizes.find(d.name);
    if (it != sizes.end()) d.size = it->second;
  }
  Plan p = *this;
  p.mesh_.clear();
  std::vector<PlanEntry> entries = std::move(p.entries_);
  p.entries_.clear();
  p.set_mesh(std::move(dims), mesh_loc_);  // the same checks as a mesh line
  p.entries_ = std::move(entries);
  return p;
}

void Plan::set_mesh(std::vector<MeshDimDecl> dims, PlanLoc loc) {
  MT_CHECK(mesh_.empty(), "{}: the mesh is declared twice (first at {}); expected one mesh line", loc.str(),
           mesh_loc_.str());
  MT_CHECK(entries_.empty(), "{}: the mesh must be declared before the entries (first entry at {})", loc.str(),
           entries_.front().loc.str());
  MT_CHECK(!dims.empty(), "{}: the mesh has no dims; expected e.g. 'mesh dp=* tp=2'", loc.str());
  int stars = 0;
  std::set<std::string> seen;
  for (const auto& d : dims) {
    MT_CHECK(is_identifier(d.name), "{}: mesh dim name '{}' must be an identifier (letters, digits, _)",
             d.loc.str(), d.name);
    MT_CHECK(seen.insert(d.name).second, "{}: mesh dim '{}' is declared twice", d.loc.str(), d.name);
    MT_CHECK(d.size == -1 || d.size >= 1, "{}: mesh dim '{}' has size {}; expected a size >= 1 or *",
             d.loc.str(), d.name, d.size);
    if (d.size == -1) ++stars;
    MT_CHECK(stars <= 1, "{}: mesh dim '{}' is a second '*'; at most one dim may take the rest of the world",
             d.loc.str(), d.name);
  }
  mesh_ = std::move(dims);
  mesh_loc_ = std::move(loc);
}

void Plan::add_entry(PlanEntry e) {
  MT_CHECK(!mesh_.empty(), "{}: '{}' comes before the mesh; expected a 'mesh NAME=SIZE ...' line first",
           e.loc.str(), e.keyword());
  (void)PathRegex(e.module_re, e.module_loc, "a regex over module paths, e.g. model\\.layers\\.\\d+\\.mlp");
  IoRef io = parse_io_ref(e.tensor);
  const bool io_like = !e.tensor.empty() && e.tensor[0] == '<';
  MT_CHECK(!io_like || io.valid(), "{}: '{}' is not a module input or output; expected <in>:K or <out>:K",
           e.tensor_loc.str(), e.tensor);
  MT_CHECK(!e.tensor.empty(), "{}: missing tensor; expected a parameter name (regex), <in>:K or <out>:K",
           e.tensor_loc.str());
  switch (e.kind) {
    case PlanEntryKind::kPlace:
      MT_CHECK(!(io.valid() && e.phase == PlanPhase::kInit),
               "{}: init applies to parameters (their storage), not to {}; expected place or run",
               e.loc.str(), e.tensor);
      break;
    case PlanEntryKind::kRedistribute:
    case PlanEntryKind::kAnnotate:
      MT_CHECK(io.valid(), "{}: {} applies to module inputs and outputs, not to '{}'; expected <in>:K or <out>:K",
               e.tensor_loc.str(), e.keyword(), e.tensor);
      break;
    case PlanEntryKind::kFactory:
      MT_CHECK(!io_like && (e.tensor == "*" || is_identifier(e.tensor)),
               "{}: factory needs a label for tensors created in the forward ('*' or an identifier such "
               "as rope), got '{}'",
               e.tensor_loc.str(), e.tensor);
      break;
    case PlanEntryKind::kDispatch:
      MT_CHECK(e.tensor == "experts",
               "{}: dispatch applies to the experts of mixture-of-experts layers; expected 'experts', got '{}' "
               "(e.g. 'dispatch model\\.layers\\.\\d+\\.block_sparse_moe experts ep=all_to_all')",
               e.tensor_loc.str(), e.tensor);
      MT_CHECK(e.how.size() == 1 && !e.how[0].dispatch.empty(),
               "{}: dispatch takes one mesh dim and how the experts run there; expected DIM=all_to_all, e.g. "
               "ep=all_to_all",
               e.loc.str());
      break;
    case PlanEntryKind::kFsdp:
      MT_CHECK(!io_like, "{}: fsdp shards parameters; expected a regex over parameter paths in the unit (e.g. "
               "'.*' or 'mlp\\..*'), not '{}'",
               e.tensor_loc.str(), e.tensor);
      MT_CHECK(e.how.size() == 1 && e.how[0].fsdp_rows != 0,
               "{}: fsdp takes one mesh dim and the sharding granularity there; expected DIM=rows, DIM=rows(N) or "
               "DIM=whole, e.g. 'fsdp model\\.layers\\.\\d+ .* dp=rows'",
               e.loc.str());
      break;
  }
  if (is_param_entry(e)) {
    (void)PathRegex(e.tensor, e.tensor_loc, "a parameter name such as weight or weight|bias");
  }
  auto check_how = [&](const How& how, const char* what) {
    MT_CHECK(!how.empty(), "{}: {} has no placement; expected at least one DIM=PLACEMENT such as {}=R",
             e.loc.str(), what, mesh_.front().name);
    std::set<std::string> seen;
    for (const auto& d : how) {
      bool known = false;
      std::string names;
      for (const auto& m : mesh_) {
        known |= m.name == d.dim;
        names += names.empty() ? "" : ", "; names += m.name;
      }
      MT_CHECK(known, "{}: '{}' names no mesh dim; expected one of the plan's mesh dims: {}", d.loc.str(),
               d.str(), names);
      MT_CHECK(seen.insert(d.dim).second, "{}: mesh dim '{}' is given twice in one placement", d.loc.str(), d.dim);
      MT_CHECK(d.fsdp_rows == 0 || e.kind == PlanEntryKind::kFsdp,
               "{}: '{}' is an FSDP granularity; expected a placement such as {}=S(0) here (rows, rows(N) and "
               "whole belong to fsdp entries)",
               d.loc.str(), d.str(), d.dim);
      MT_CHECK(d.dispatch.empty() || e.kind == PlanEntryKind::kDispatch,
               "{}: '{}' says how experts are dispatched; expected a placement such as {}=S(0) here (all_to_all "
               "belongs to dispatch entries)",
               d.loc.str(), d.str(), d.dim);
      MT_CHECK(d.owner < 0 || is_param_entry(e),
               "{}: owner(K) places whole parameters; expected a parameter name, not '{}'", d.loc.str(),
               e.tensor);
    }
  };
  if (e.kind == PlanEntryKind::kRedistribute) {
    check_how(e.src, "the source");
    check_how(e.how, "the destination");
    MT_CHECK(e.grad_src.empty() == e.grad_dst.empty(), "{}: the gradient needs both a source and a destination",
             e.loc.str());
    if (!e.grad_src.empty()) {
      check_how(e.grad_src, "the gradient source");
      check_how(e.grad_dst, "the gradient destination");
    }
  } else {
    check_how(e.how, "the entry");
  }
  for (const How* h : {&e.how, &e.src, &e.grad_src, &e.grad_dst}) check_not_pipeline_dim(*h, e);
  entries_.push_back(std::move(e));
}

// ---- pipeline lines ----

const char* schedule_name(PipelineScheduleKind k) {
  return k == PipelineScheduleKind::kGPipe ? "gpipe" : k == PipelineScheduleKind::kInterleaved ? "interleaved" : "1f1b";
}

std::string StageEntry::str() const {
  if (even()) return fmt::format("stages {}=even", dim);
  return fmt::format("stage {} {}={}", module_re.empty() ? "()" : module_re, dim, stage);
}

void Plan::check_not_pipeline_dim(const How& how, const PlanEntry& e) const {
  if (pipeline_dim_.empty()) return;
  for (const auto& d : how)
    MT_CHECK(d.dim != pipeline_dim_,
             "{}: '{}' names the pipeline dim '{}' (its stages are set at {}); expected the entry to name only the "
             "other mesh dims: each pipeline stage applies the entries to its own modules",
             d.loc.str(), d.str(), pipeline_dim_, pipeline_loc_.str());
}

void Plan::claim_pipeline_dim(const std::string& dim, const PlanLoc& loc) {
  MT_CHECK(!mesh_.empty(), "{}: a pipeline line comes before the mesh; expected a 'mesh pp=2 ...' line first",
           loc.str());
  bool known = false;
  std::string names;
  for (const auto& m : mesh_) {
    known |= m.name == dim;
    names += names.empty() ? "" : ", ";
    names += m.name;
  }
  MT_CHECK(known, "{}: '{}' names no mesh dim; expected the pipeline dim to be one of the plan's mesh dims: {} "
           "(e.g. 'mesh pp=2 dp=*')", loc.str(), dim, names);
  if (pipeline_dim_.empty()) {
    pipeline_dim_ = dim;
    pipeline_loc_ = loc;
    for (const auto& e : entries_)
      for (const How* h : {&e.how, &e.src, &e.grad_src, &e.grad_dst}) check_not_pipeline_dim(*h, e);
    return;
  }
  MT_CHECK(dim == pipeline_dim_, "{}: pipeline dim '{}' differs from '{}' named at {}; expected one pipeline dim",
           loc.str(), dim, pipeline_dim_, pipeline_loc_.str());
}

void Plan::add_stage(StageEntry e) {
  claim_pipeline_dim(e.dim, e.how_loc);
  for (const auto& o : stages_) {
    MT_CHECK(!(o.even() && e.even()), "{}: a second 'stages {}=even' (first at {}); expected one", e.loc.str(), e.dim,
             o.loc.str());
    MT_CHECK(o.even() == e.even(),
             "{}: '{}' mixes with '{}' at {}; expected either 'stage REGEX {}=K' lines or one 'stages {}=even'",
             e.loc.str(), e.str(), o.str(), o.loc.str(), e.dim, e.dim);
  }
  if (!e.even()) {
    (void)PathRegex(e.module_re, e.module_loc, "a regex over module paths, e.g. model\\.layers\\.[0-3]");
    for (const auto& m : mesh_)
      MT_CHECK(m.name != e.dim || m.size < 0 || e.stage < m.size,
               "{}: stage {} is outside mesh dim {} of size {}; expected {}=0 .. {}={}", e.how_loc.str(), e.stage,
               e.dim, m.size, e.dim, e.dim, m.size - 1);
  }
  stages_.push_back(std::move(e));
}

void Plan::set_schedule(const std::string& dim, PipelineScheduleKind k, PlanLoc loc, int64_t virtual_stages) {
  claim_pipeline_dim(dim, loc);
  MT_CHECK(!schedule_set_, "{}: the schedule is set twice (first at {}); expected one schedule line", loc.str(),
           schedule_loc_.str());
  schedule_ = k;
  virtual_stages_ = virtual_stages;
  schedule_loc_ = std::move(loc);
  schedule_set_ = true;
}

namespace {

// "pp=3" / "pp=even" / "pp=1f1b": the dim and the value (errors name `loc`).
std::pair<std::string, std::string> dim_value(const std::string& text, const PlanLoc& loc, const char* expect) {
  const size_t eq = text.find('=');
  MT_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < text.size(), "{}: '{}' is not DIM=VALUE; expected {}",
           loc.str(), printable(text), expect);
  return {text.substr(0, eq), text.substr(eq + 1)};
}

StageEntry parse_stage_how(StageEntry e, const std::string& how) {
  auto [dim, value] = dim_value(how, e.how_loc, "DIM=K, e.g. pp=0");
  e.dim = dim;
  MT_CHECK(small_number(value), "{}: '{}' is not a stage number; expected {}=K with K a stage index (0, 1, ..)",
           e.how_loc.str(), printable(how), dim);
  e.stage = std::stoll(value);
  return e;
}

// "1f1b", "gpipe", "interleaved(V)": the kind and V (1 but for interleaved).
std::pair<PipelineScheduleKind, int64_t> parse_schedule_value(const std::string& value, const PlanLoc& loc) {
  if (value == "gpipe") return {PipelineScheduleKind::kGPipe, 1};
  if (value == "1f1b") return {PipelineScheduleKind::kOneFOneB, 1};
  const std::string pre = "interleaved(";
  if (value.rfind(pre, 0) == 0 && value.back() == ')') {
    const std::string v = value.substr(pre.size(), value.size() - pre.size() - 1);
    MT_CHECK(small_number(v), "{}: interleaved({}): '{}' is not a count of virtual stages per rank; expected a "
             "whole number V >= 2 of at most 9 digits, e.g. interleaved(2)", loc.str(), printable(v), printable(v));
    MT_CHECK(std::stoll(v) >= 2, "{}: interleaved({}) needs V >= 2 virtual stages per rank, e.g. interleaved(2)",
             loc.str(), printable(v));
    return {PipelineScheduleKind::kInterleaved, std::stoll(v)};
  }
  MT_FAIL("{}: unknown schedule '{}'; expected 1f1b, gpipe or interleaved(V)", loc.str(), printable(value));
}

}  // namespace

Plan& Plan::stage(const std::string& module_re, const std::string& how) {
  StageEntry e;
  e.loc = e.module_loc = e.how_loc = next_builder_loc();
  e.module_re = module_re;
  add_stage(parse_stage_how(std::move(e), how));
  return *this;
}

Plan& Plan::stages(const std::string& how) {
  StageEntry e;
  e.loc = e.module_loc = e.how_loc = next_builder_loc();
  auto [dim, value] = dim_value(how, e.loc, "DIM=even, e.g. pp=even");
  MT_CHECK(value == "even", "{}: '{}': expected {}=even (an even split of the layers)", e.loc.str(), how, dim);
  e.dim = dim;
  add_stage(std::move(e));
  return *this;
}

Plan& Plan::schedule(const std::string& how) {
  PlanLoc loc = next_builder_loc();
  auto [dim, value] = dim_value(how, loc, "DIM=1f1b or DIM=gpipe, e.g. pp=1f1b");
  auto [kind, v] = parse_schedule_value(value, loc);
  set_schedule(dim, kind, loc, v);
  return *this;
}

Plan Plan::without_pipeline() const {
  if (!is_pipeline()) return *this;
  Plan p = *this;
  p.mesh_.clear();
  for (const auto& d : mesh_)
    if (d.name != pipeline_dim_) p.mesh_.push_back(d);
  if (p.mesh_.empty()) p.mesh_.push_back({kStageDim, 1, mesh_loc_});
  p.stages_.clear();
  p.pipeline_dim_.clear();
  p.schedule_set_ = false;
  return p;
}

PlanLoc Plan::next_builder_loc() { return PlanLoc{source_, ++builder_calls_, 0}; }

Plan& Plan::mesh(const Dims& dims) {
  PlanLoc loc = next_builder_loc();
  std::vector<MeshDimDecl> decl;
  for (const auto& [name, size] : dims) decl.push_back({name, size, loc});
  set_mesh(std::move(decl), loc);
  return *this;
}

Plan& Plan::add_text(PlanEntryKind kind, PlanPhase phase, const std::string& module_re, const std::string& tensor,
                     const std::string& how) {
  PlanEntry e;
  e.kind = kind;
  e.phase = phase;
  e.module_re = module_re;
  e.tensor = tensor;
  e.loc = e.module_loc = e.tensor_loc = next_builder_loc();
  auto toks = tokenize(how);
  if (kind == PlanEntryKind::kFsdp) take_fsdp_options(toks, 0, e, e.loc);
  e.how = parse_how_tokens(toks, 0, toks.size(), e.loc);
  add_entry(std::move(e));
  return *this;
}

Plan& Plan::add_typed(PlanPhase phase, const std::string& module_re, const std::string& tensor, const Typed& how) {
  PlanEntry e;
  e.phase = phase;
  e.module_re = module_re;
  e.tensor = tensor;
  e.loc = e.module_loc = e.tensor_loc = next_builder_loc();
  for (const auto& [dim, p] : how) {
    DimPlacement d;
    d.dim = dim;
    d.placement = p;
    d.loc = e.loc;
    e.how.push_back(std::move(d));
  }
  add_entry(std::move(e));
  return *this;
}

Plan& Plan::place(const std::string& m, const std::string& t, const std::string& how) {
  return add_text(PlanEntryKind::kPlace, PlanPhase::kBoth, m, t, how);
}
Plan& Plan::init(const std::string& m, const std::string& t, const std::string& how) {
  return add_text(PlanEntryKind::kPlace, PlanPhase::kInit, m, t, how);
}
Plan& Plan::run(const std::string& m, const std::string& t, const std::string& how) {
  return add_text(PlanEntryKind::kPlace, PlanPhase::kRun, m, t, how);
}
Plan& Plan::place(const std::string& m, const std::string& t, const Typed& how) {
  return add_typed(PlanPhase::kBoth, m, t, how);
}
Plan& Plan::init(const std::string& m, const std::string& t, const Typed& how) {
  return add_typed(PlanPhase::kInit, m, t, how);
}
Plan& Plan::run(const std::string& m, const std::string& t, const Typed& how) {
  return add_typed(PlanPhase::kRun, m, t, how);
}
Plan& Plan::annotate(const std::string& m, const std::string& t, const std::string& how) {
  return add_text(PlanEntryKind::kAnnotate, PlanPhase::kBoth, m, t, how);
}
Plan& Plan::factory(const std::string& m, const std::string& name, const std::string& how) {
  return add_text(PlanEntryKind::kFactory, PlanPhase::kBoth, m, name, how);
}

Plan& Plan::dispatch(const std::string& m, const std::string& how) {
  return add_text(PlanEntryKind::kDispatch, PlanPhase::kBoth, m, "experts", how);
}

Plan& Plan::fsdp(const std::string& m, const std::string& params, const std::string& how) {
  return add_text(PlanEntryKind::kFsdp, PlanPhase::kBoth, m, params, how);
}

Plan& Plan::redistribute(const std::string& m, const std::string& t, const std::string& src, const std::string& dst,
                         const std::string& grad_src, const std::string& grad_dst) {
  PlanEntry e;
  e.kind = PlanEntryKind::kRedistribute;
  e.module_re = m;
  e.tensor = t;
  e.loc = e.module_loc = e.tensor_loc = next_builder_loc();
  e.src = parse_how_text(src, e.loc);
  e.how = parse_how_text(dst, e.loc);
  e.grad_src = parse_how_text(grad_src, e.loc);
  e.grad_dst = parse_how_text(grad_dst, e.loc);
  add_entry(std::move(e));
  return *this;
}

PlanMesh Plan::resolve_mesh(int64_t world) const {
  MT_CHECK(!mesh_.empty(), "plan {}: no mesh declared; expected a 'mesh NAME=SIZE ...' line", source_);
  PlanMesh m;
  int64_t fixed = 1;
  int star = -1;
  bool too_big = false;
  std::string decl;
  for (size_t i = 0; i < mesh_.size(); ++i) {
    m.names.push_back(mesh_[i].name);
    if (mesh_[i].size < 0)
      star = static_cast<int>(i);
    else if (!checked_mul(fixed, mesh_[i].size, &fixed))
      too_big = true;  // the product does not even fit in 64 bits
    decl += fmt::format("{}{}={}", i ? " " : "", mesh_[i].name, mesh_[i].size < 0 ? "*" : std::to_string(mesh_[i].size));
  }
  MT_CHECK(!too_big, "{}: mesh {} needs more ranks than the world has ({}); expected the sizes to multiply to "
           "the world size (or one dim to be *)",
           mesh_loc_.str(), decl, world);
  if (star >= 0) {
    MT_CHECK(world % fixed == 0 && world >= fixed,
             "{}: mesh {} does not fit a world of {} ranks: the fixed dims take {} ranks, which must divide "
             "the world size",
             mesh_loc_.str(), decl, world, fixed);
  } else {
    MT_CHECK(world == fixed, "{}: mesh {} has {} ranks but the world has {}; expected the sizes to multiply to "
             "the world size (or one dim to be *)",
             mesh_loc_.str(), decl, fixed, world);
  }
  for (size_t i = 0; i < mesh_.size(); ++i)
    m.shape.push_back(static_cast<int>(i) == star ? world / fixed : mesh_[i].size);
  return m;
}

std::string Plan::str() const {
  std::string s = "mesh";
  for (const auto& d : mesh_) s += fmt::format(" {}={}", d.name, d.size < 0 ? "*" : std::to_string(d.size));
  s += "\n";
  for (const auto& e : entries_) s += e.str() + "\n";
  for (const auto& e : stages_) s += e.str() + "\n";
  if (schedule_set_)
    s += fmt::format("schedule {}={}{}\n", pipeline_dim_, schedule_name(schedule_),
                     schedule_ == PipelineScheduleKind::kInterleaved ? fmt::format("({})", virtual_stages_) : "");
  return s;
}

// ---- parser ----

Plan parse_plan(std::string_view text, const std::string& filename) {
  MT_CHECK(text.size() <= kMaxPlanBytes, "{}: the plan file is {} bytes; expected a text file of at most {} bytes",
           filename, text.size(), kMaxPlanBytes);
  // A UTF-8 byte-order mark (editors on Windows write one) is not part of the first keyword.
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
  // Binary data is not a plan: name the first control byte in the file instead of echoing it back,
  // before any line is parsed (so the error does not depend on what precedes the byte).
  for (size_t i = 0, line = 1, col = 1; i < text.size(); ++i, ++col) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      ++line;
      col = 0;
      continue;
    }
    MT_CHECK(c >= 0x20 || c == '\t' || c == '\r',
             "{}:{}:{}: byte 0x{:02x} is a control character; expected a text plan file (docs/plans.md)", filename, line,
             col, c);
  }
  Plan plan;
  plan.set_source(filename);
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    auto toks = tokenize(line, 3);
    if (toks.empty()) continue;
    PlanLoc line_loc{filename, line_no, 1};
    auto loc_of = [&](const Token& t) { return PlanLoc{filename, line_no, t.column}; };
    const std::string& kw = toks[0].text;
    if (kw == "mesh") {
      MT_CHECK(toks.size() >= 2, "{}: the mesh has no dims; expected e.g. 'mesh dp=* tp=2'", loc_of(toks[0]).str());
      std::vector<MeshDimDecl> dims;
      for (size_t i = 1; i < toks.size(); ++i) {
        const std::string& t = toks[i].text;
        size_t eq = t.find('=');
        std::string size = eq == std::string::npos ? "" : t.substr(eq + 1);
        bool digits = !size.empty() && size.find_first_not_of("0123456789") == std::string::npos;
        MT_CHECK(eq != std::string::npos && eq > 0 && (size == "*" || digits),
                 "{}: '{}' is not a mesh dim; expected NAME=SIZE or NAME=* (the rest of the world), e.g. tp=2",
                 loc_of(toks[i]).str(), t);
        MT_CHECK(size == "*" || size.size() < 12, "{}: mesh dim '{}' has size {}: too large for any world",
                 loc_of(toks[i]).str(), t.substr(0, eq), size.substr(0, 40));
        dims.push_back({t.substr(0, eq), size == "*" ? -1 : std::stoll(size), loc_of(toks[i])});
      }
      plan.set_mesh(std::move(dims), loc_of(toks[0]));
      continue;
    }
    if (kw == "stage" || kw == "stages" || kw == "schedule") {
      const char* expect = kw == "stage"    ? "'stage REGEX pp=K', e.g. 'stage model\\.layers\\.[01] pp=0'"
                           : kw == "stages" ? "'stages pp=even'"
                                            : "'schedule pp=1f1b', 'schedule pp=gpipe' or 'schedule pp=interleaved(2)'";
      const size_t want = kw == "stage" ? 3 : 2;
      MT_CHECK(toks.size() == want, "{}: '{}' takes {} word{}; expected {}", loc_of(toks[0]).str(), kw, want - 1,
               want == 2 ? "" : "s", expect);
      if (kw == "schedule") {
        auto [dim, value] = dim_value(toks[1].text, loc_of(toks[1]), expect);
        auto [kind, v] = parse_schedule_value(value, loc_of(toks[1]));
        plan.set_schedule(dim, kind, loc_of(toks[0]), v);
        continue;
      }
      StageEntry e;
      e.loc = loc_of(toks[0]);
      e.module_loc = loc_of(toks[1]);
      e.how_loc = loc_of(toks[want - 1]);
      if (kw == "stage") {
        e.module_re = toks[1].text == "()" ? "" : toks[1].text;
        plan.add_stage(parse_stage_how(std::move(e), toks[2].text));
      } else {
        auto [dim, value] = dim_value(toks[1].text, e.how_loc, expect);
        MT_CHECK(value == "even", "{}: '{}': expected {}=even (an even split of the layers by count)", e.how_loc.str(),
                 printable(toks[1].text), dim);
        e.dim = dim;
        plan.add_stage(std::move(e));
      }
      continue;
    }
    PlanEntry e;
    e.loc = loc_of(toks[0]);
    if (kw == "place" || kw == "init" || kw == "run") {
      e.kind = PlanEntryKind::kPlace;
      e.phase = kw == "init" ? PlanPhase::kInit : kw == "run" ? PlanPhase::kRun : PlanPhase::kBoth;
    } else if (kw == "redistribute") {
      e.kind = PlanEntryKind::kRedistribute;
    } else if (kw == "annotate") {
      e.kind = PlanEntryKind::kAnnotate;
    } else if (kw == "factory") {
      e.kind = PlanEntryKind::kFactory;
    } else if (kw == "dispatch") {
      e.kind = PlanEntryKind::kDispatch;
    } else if (kw == "fsdp") {
      e.kind = PlanEntryKind::kFsdp;
    } else {
      MT_FAIL("{}: unknown keyword '{}'; expected one of: {}", e.loc.str(), printable(kw), kKeywords);
    }
    MT_CHECK(toks.size() >= 4,
             "{}: '{}' needs a module regex, a tensor and a placement; expected e.g. '{}'", e.loc.str(), kw,
             kw == "dispatch" ? "dispatch model\\.layers\\.\\d+\\.block_sparse_moe experts ep=all_to_all"
             : kw == "fsdp"   ? "fsdp model\\.layers\\.\\d+ .* dp=rows"
                              : (kw == "redistribute" ? std::string("place") : kw) +
                                    " model\\.layers\\.\\d+\\.mlp\\.up_proj weight tp=S(0)");
    e.module_re = toks[1].text == "()" ? "" : toks[1].text;
    e.module_loc = loc_of(toks[1]);
    e.tensor = toks[2].text;
    e.tensor_loc = loc_of(toks[2]);
    PlanLoc zero{filename, line_no, 1};
    if (e.kind == PlanEntryKind::kRedistribute) {
      // SRC... -> DST... [grad GSRC... -> GDST...]
      std::vector<size_t> arrows;
      size_t grad = toks.size();
      for (size_t i = 3; i < toks.size(); ++i) {
        if (toks[i].text == "->") arrows.push_back(i);
        if (toks[i].text == "grad" && grad == toks.size()) grad = i;
      }
      const char* expect = "expected 'redistribute REGEX TENSOR SRC -> DST [grad GSRC -> GDST]', e.g. "
                           "'redistribute model\\.norm <out>:0 tp=S(1) -> tp=R'";
      MT_CHECK(!arrows.empty() && arrows[0] < grad, "{}: redistribute has no '->' between source and "
               "destination; {}", e.loc.str(), expect);
      e.src = parse_how_tokens(toks, 3, arrows[0], zero);
      e.how = parse_how_tokens(toks, arrows[0] + 1, grad, zero);
      if (grad < toks.size()) {
        MT_CHECK(arrows.size() == 2 && arrows[1] > grad, "{}: the gradient part has no '->'; {}",
                 loc_of(toks[grad]).str(), expect);
        e.grad_src = parse_how_tokens(toks, grad + 1, arrows[1], zero);
        e.grad_dst = parse_how_tokens(toks, arrows[1] + 1, toks.size(), zero);
      } else {
        MT_CHECK(arrows.size() == 1, "{}: a second '->' without 'grad'; {}", loc_of(toks[arrows[1]]).str(), expect);
      }
    } else {
      for (size_t i = 3; i < toks.size(); ++i)
        MT_CHECK(toks[i].text != "->" && toks[i].text != "grad",
                 "{}: '{}' belongs to redistribute entries; expected DIM=PLACEMENT", loc_of(toks[i]).str(),
                 toks[i].text);
      if (e.kind == PlanEntryKind::kFsdp) take_fsdp_options(toks, 3, e, zero);
      e.how = parse_how_tokens(toks, 3, toks.size(), zero);
    }
    plan.add_entry(std::move(e));
  }
  MT_CHECK(!plan.mesh_dims().empty(), "{}:1: the plan declares no mesh; expected a line such as 'mesh dp=* tp=2'",
           filename);
  return plan;
}

Plan load_plan(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "load_plan: cannot open plan file '{}'", path);
  // Read at most one byte past the limit: a huge file (or a device) is rejected without reading it all.
  std::string text(kMaxPlanBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  MT_CHECK(!in.bad(), "load_plan: cannot read plan file '{}' (is it a directory?)", path);
  text.resize(static_cast<size_t>(in.gcount()));
  MT_CHECK(text.size() <= kMaxPlanBytes, "{}: the plan file is larger than {} bytes; expected a text file",
           path, kMaxPlanBytes);
  return parse_plan(text, path);
}

}  // namespace mt
