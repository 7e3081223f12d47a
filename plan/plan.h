// Plan: how a single-device model is spread over a device mesh (DESIGN.md "Plans",
// docs/plans.md). A plan declares its mesh (named dims, one of them may be "*" = the rest of the
// world) and entries saying *which* tensor (a regex fully matched against module paths, plus a
// parameter-name regex, `<in>:k` or `<out>:k`), *how* (a placement per named mesh dim; unnamed
// dims replicate) and *when* (INIT: storage of parameters, RUN: compute). The same plan is built
// with the C++ builder below or read from a plan file (parse_plan / load_plan); both give equal
// Plans. Nothing here looks at a model: plan/lower.h resolves the regexes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mesh/placement.h"
#include "runtime/shape.h"

namespace mt {

// Where a plan item came from: "file:line:column" (a builder call has line = call number and
// column 0, printed "<builder>:3").
struct PlanLoc {
  std::string file;
  int line = 0;
  int column = 0;
  std::string str() const;
};

// A placement on one named mesh dim: `tp=S(0)`. `owner(k)` / `owner(k,d)` is plan sugar for "the
// whole tensor lives on coordinate k of this dim", as a ragged split of tensor dim d (default 0):
// RS(d,[0,..,1,..,0],b<size of d>), resolved against the tensor shape when lowering. Used for
// expert parallelism over separate expert modules; the dim matters for compute (a down
// projection owned along its input dim makes the product a Partial sum over the owners).
struct DimPlacement {
  std::string dim;
  Placement placement;
  int64_t owner = -1;  // >= 0: owner(k)
  int owner_dim = 0;   // owner(k, d)
  // `dispatch` entries: how a MoE layer's experts run over this dim ("all_to_all"); empty elsewhere.
  std::string dispatch;
  // `fsdp` entries: the sharding granularity over this dim, in rows of tensor dim 0: `rows` (1),
  // `rows(N)`, `whole` (kFsdpWhole: the tensor on one rank); 0 elsewhere.
  static constexpr int64_t kFsdpWhole = -1;
  int64_t fsdp_rows = 0;
  PlanLoc loc;
  std::string placement_str() const;  // "S(0)", "owner(1)", "all_to_all", "rows(32)"
  std::string str() const { return dim + "=" + placement_str(); }
};
using How = std::vector<DimPlacement>;

enum class PlanPhase { kBoth, kInit, kRun };  // keyword place / init / run
enum class PlanEntryKind { kPlace, kRedistribute, kAnnotate, kFactory, kDispatch, kFsdp };

struct PlanEntry {
  PlanEntryKind kind = PlanEntryKind::kPlace;
  PlanPhase phase = PlanPhase::kBoth;  // kPlace only
  std::string module_re;  // fully matched against module paths ("" is the root)
  // A regex over parameter names (fully matched), "<in>:k" / "<out>:k", for factory a label of
  // the tensors created in the module's forward ("*" = all), for dispatch "experts", for fsdp a
  // regex over parameter paths relative to the unit module ("mlp\\..*").
  std::string tensor;
  How how;                    // place, annotate, factory: the placement; redistribute: dst;
                              // dispatch: one dim with `dispatch` set; fsdp: one
                              // dim with `fsdp_rows` set
  How src;                    // redistribute
  How grad_src, grad_dst;     // redistribute, optional: gradient redistribution
  // fsdp, optional, after the granularity: `reshard=yes|no` (free the unit's gathered buffer
  // after its forward, gather again for its backward) and `prefetch=yes|no` (start the unit's
  // gathers while the unit before it computes). -1: not given (yes); 0: no; 1: yes.
  int fsdp_reshard = -1, fsdp_prefetch = -1;
  PlanLoc loc, module_loc, tensor_loc;
  std::string keyword() const;  // place, init, run, redistribute, annotate, factory, dispatch, fsdp
  std::string str() const;      // the entry in plan-file syntax
};

struct MeshDimDecl {
  std::string name;
  int64_t size = -1;  // -1: "*"
  PlanLoc loc;
};

// Pipeline parallelism (docs/pipeline.md): `stage REGEX pp=K` puts the pipeline units (the model's
// top-level blocks in forward order: embedding, each decoder layer, final norm, lm_head) whose
// paths fully match REGEX on stage K of mesh dim pp; `stages pp=even` splits the layers evenly
// instead (the embedding with the first stage, norm and lm_head with the last). `schedule
// pp=1f1b|gpipe` picks the schedule (default 1f1b). The dim these lines name is the plan's
// pipeline dim; no other entry may name it.
struct StageEntry {
  std::string module_re;  // empty for `stages DIM=even`
  std::string dim;
  int64_t stage = -1;     // -1: `stages DIM=even`
  PlanLoc loc, module_loc, how_loc;
  bool even() const { return stage < 0; }
  std::string str() const;  // "stage model\.layers\.[01] pp=0" / "stages pp=even"
};

// The one dim of a stage's mesh when the pipeline dim is the plan's only mesh dim.
inline constexpr const char* kStageDim = "stage";

// kInterleaved: interleaved 1F1B with virtual stages (`schedule pp=interleaved(V)`: each rank runs
// V chunks of the layers, chunk c of the p * V on stage c % p).
enum class PipelineScheduleKind { kOneFOneB, kGPipe, kInterleaved };
const char* schedule_name(PipelineScheduleKind k);  // "1f1b", "gpipe", "interleaved"

// A plan's mesh resolved for a world size.
struct PlanMesh {
  std::vector<std::string> names;
  Shape shape;
  int ndim() const { return static_cast<int>(names.size()); }
  int64_t size() const { return shape.numel(); }
  int dim_index(const std::string& name) const;  // -1 when absent
  std::vector<int64_t> coordinate_of(int64_t rank) const;  // row-major, as DeviceMesh orders ranks
  std::string str() const;                       // "[dp=2, tp=2]"
};

class Plan {
 public:
  Plan() = default;

  // ---- builder (same meaning as the file keywords; errors name "<builder>:N") ----
  using Dims = std::vector<std::pair<std::string, int64_t>>;  // size -1 = "*"
  Plan& mesh(const Dims& dims);
  // `how` is the file's text ("dp=S(0) tp=R") or typed pairs.
  Plan& place(const std::string& module_re, const std::string& tensor, const std::string& how);
  Plan& init(const std::string& module_re, const std::string& tensor, const std::string& how);
  Plan& run(const std::string& module_re, const std::string& tensor, const std::string& how);
  Plan& redistribute(const std::string& module_re, const std::string& tensor, const std::string& src,
                     const std::string& dst, const std::string& grad_src = "",
                     const std::string& grad_dst = "");
  Plan& annotate(const std::string& module_re, const std::string& tensor, const std::string& how);
  Plan& factory(const std::string& module_re, const std::string& name, const std::string& how);
  // The experts of the matched MoE layers run over mesh dim DIM: how = "ep=all_to_all".
  Plan& dispatch(const std::string& module_re, const std::string& how);
  // The matched modules are FSDP units over one mesh dim (docs/fsdp.md): their parameters whose
  // paths relative to the unit match `params` are laid out by the FSDP layout planner and stored
  // as RaggedShards, gathered for compute. how = "dp=rows", "dp=rows(32)" or "dp=whole", then
  // optionally "reshard=no" and / or "prefetch=no" (docs/fsdp.md).
  Plan& fsdp(const std::string& module_re, const std::string& params, const std::string& how);
  // Pipeline stages (see StageEntry): stage("model\\.layers\\.[01]", "pp=0"), stages("pp=even"),
  // schedule("pp=gpipe").
  Plan& stage(const std::string& module_re, const std::string& how);
  Plan& stages(const std::string& how);
  Plan& schedule(const std::string& how);
  using Typed = std::vector<std::pair<std::string, Placement>>;
  Plan& place(const std::string& module_re, const std::string& tensor, const Typed& how);
  Plan& init(const std::string& module_re, const std::string& tensor, const Typed& how);
  Plan& run(const std::string& module_re, const std::string& tensor, const Typed& how);

  // ---- contents ----
  const std::string& source() const { return source_; }  // file name or "<builder>"
  const std::vector<MeshDimDecl>& mesh_dims() const { return mesh_; }
  const std::vector<PlanEntry>& entries() const { return entries_; }
  const std::vector<StageEntry>& stage_entries() const { return stages_; }
  // The mesh dim the stage lines name; empty for a plan without pipeline parallelism.
  const std::string& pipeline_dim() const { return pipeline_dim_; }
  bool is_pipeline() const { return !pipeline_dim_.empty(); }
  PipelineScheduleKind schedule_kind() const { return schedule_; }
  int64_t virtual_stages() const { return virtual_stages_; }  // V of interleaved(V), else 1
  const PlanLoc& schedule_loc() const { return schedule_loc_; }
  // The plan each pipeline stage runs: the mesh without the pipeline dim (a mesh `stage=1` when
  // that was the only dim), the entries as they are, no stage lines. A plan without a pipeline
  // dim is returned as it is.
  Plan without_pipeline() const;
  // The plan with other sizes on some mesh dims (name -> size, -1 for "*"), every line where it
  // was (so errors still name the plan file's lines): `plan --sweep` over tp sizes.
  Plan with_mesh_sizes(const std::map<std::string, int64_t>& sizes) const;
  // The mesh for `world` ranks: "*" is world / (product of the others). Throws at the mesh line
  // when the world does not fit.
  PlanMesh resolve_mesh(int64_t world) const;
  // The plan in file syntax (parse_plan(str()) gives an equal plan).
  std::string str() const;

  // Used by the parser.
  void add_entry(PlanEntry e);
  void add_stage(StageEntry e);
  void set_schedule(const std::string& dim, PipelineScheduleKind k, PlanLoc loc, int64_t virtual_stages = 1);
  void set_mesh(std::vector<MeshDimDecl> dims, PlanLoc loc);
  void set_source(std::string s) { source_ = std::move(s); }

 private:
  PlanLoc next_builder_loc();
  Plan& add_typed(PlanPhase phase, const std::string& module_re, const std::string& tensor, const Typed& how);
  Plan& add_text(PlanEntryKind kind, PlanPhase phase, const std::string& module_re,
                 const std::string& tensor, const std::string& how);
  std::string source_ = "<builder>";
  int builder_calls_ = 0;
  PlanLoc mesh_loc_;
  std::vector<MeshDimDecl> mesh_;
  std::vector<PlanEntry> entries_;
  std::vector<StageEntry> stages_;
  std::string pipeline_dim_;
  PlanLoc pipeline_loc_;  // the first line that named the pipeline dim
  PipelineScheduleKind schedule_ = PipelineScheduleKind::kOneFOneB;
  PlanLoc schedule_loc_;
  bool schedule_set_ = false;
  int64_t virtual_stages_ = 1;
  void claim_pipeline_dim(const std::string& dim, const PlanLoc& loc);
  void check_not_pipeline_dim(const How& how, const PlanEntry& e) const;
};

// Parses a plan file (syntax: docs/plans.md). Errors: "file:line:column: what is wrong; expected
// what".
Plan parse_plan(std::string_view text, const std::string& filename);
Plan load_plan(const std::string& path);

// "<in>:3" -> {true, 3}; "<out>:0" -> {false, 0}; anything else -> index -1.
struct IoRef {
  bool is_input = false;
  int index = -1;
  bool valid() const { return index >= 0; }
};
IoRef parse_io_ref(std::string_view tensor);

}  // namespace mt
