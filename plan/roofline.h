// Roofline step time for an estimate (plan/estimate.h): matmul and attention FLOPs at a GEMM rate,
// every other kernel's bytes at a memory bandwidth, each collective with an alpha-beta model on
// the link its group crosses (inside a node or between nodes), everything added up (no overlap
// assumed: an upper bound where the reducer's buckets overlap backward). Hardware profiles are
// small JSON files (plans/hardware/*.json, docs/estimate.md); `meshtrain plan --calibrate` writes
// one for the machine at hand.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mesh/collective_count.h"
#include "plan/estimate.h"
#include "plan/plan.h"

namespace mt {

struct LinkProfile {
  double alpha_s = 0;    // latency per algorithm step (seconds)
  double bandwidth = 0;  // bus bandwidth per rank (bytes/s)
};

struct HardwareProfile {
  std::string name, description, source;
  double gemm_flops_f32 = 0;   // achievable GEMM rate per device, f32 operands (FLOP/s)
  double gemm_flops_bf16 = 0;  // bf16/f16 operands, f32 accumulation
  double memory_bandwidth = 0; // achievable device memory bandwidth (bytes/s)
  // The memory-bound kernels' bytes per second within a training step, fitted by --calibrate on a
  // CPU host together with the per-kernel overhead (two step sizes); 0: memory_bandwidth.
  double kernel_bandwidth = 0;
  // The optimizer step's bytes per second (KernelCost::optimizer_bytes); 0: memory_bandwidth.
  // --calibrate times AdamW on a CPU host, where its arithmetic makes it slower than a copy.
  double optimizer_bandwidth = 0;
  double memory_bytes = 0;     // device memory (bytes)
  int64_t devices_per_node = 1;  // ranks that share the intra-node link
  LinkProfile intra, inter;
  // Host time per kernel call (op dispatch, autograd, allocation) that is not hidden behind the
  // device's work: measured by --calibrate on a CPU host; 0 for GPU profiles (launches overlap).
  double kernel_overhead_s = 0;
  // Host time per DTensor op dispatch (sharding propagation, wrapping, the DTensor autograd nodes,
  // module hooks and the gradient reducer's bookkeeping, fitted per dispatch) and per DTensor
  // redistribution (its own bookkeeping, beyond the kernels and collectives it runs): fitted by
  // --calibrate on a plan step and on timed redistributions; 0 for GPU profiles.
  double dist_op_overhead_s = 0;
  // The same per DTensor op on a mesh of one rank (a pipeline stage's own mesh under llama_pp, a
  // world of one): no peer to wait for in its redistributions and reducer; fitted by --calibrate on
  // the data-parallel plan over a one-rank mesh per rank. Below 0 (absent): dist_op_overhead_s.
  double local_dist_op_overhead_s = -1;  // < 0: not calibrated
  double redistribute_overhead_s = 0;
  // Time per blocking collective call beyond its alpha-beta time (on a host whose ranks share
  // cores: the wait for a peer that is not running), fitted by --calibrate on a ZeRO-3 step; 0 for
  // GPU profiles.
  double collective_overhead_s = 0;
  // Ranks of one node that compute at full speed at once (cores / threads per rank on a CPU host;
  // default devices_per_node). More ranks than that on a node share the compute.
  int64_t compute_slots = 0;  // 0: devices_per_node
  // The share of its compute slot a rank gets (0 < share <= 1): below 1 on a host that others load
  // too (a shared CPU machine), measured by --calibrate as CPU time / wall time of its ranks; 1 for
  // GPU profiles. Compute is stretched by 1 / share.
  double cpu_share = 1;
  // The GEMM rate of a product whose smallest dim (M, N or the reduction K) is `dim`, as a fraction
  // of the rates above (which are those of large, square products): points (dim, fraction) in
  // increasing dim, measured by --calibrate on a CPU host (JSON "gemm_efficiency_by_min_dim":
  // {"8": 0.2, ...}); empty: every product runs at the full rate (the GPU profiles).
  std::vector<std::pair<int64_t, double>> gemm_efficiency;
};

// The fraction of the GEMM rate `hw` gives a product whose smallest dim is `dim`: interpolated
// between the profile's points in log(dim), the end points' values beyond them; 1 without points.
double gemm_efficiency(const HardwareProfile& hw, int64_t dim);

// `name_or_path`: a file (ends in .json or contains '/'), or a stock profile's name looked up as
// NAME.json in $MT_HARDWARE_DIR, $MT_PLANS_DIR/hardware, ./plans/hardware, the plans/hardware
// of the source tree the executable was built from, and an installed tree's
// <prefix>/share/meshtrain/plans/hardware. Errors name the file and the field.
HardwareProfile load_hardware_profile(const std::string& name_or_path);
HardwareProfile parse_hardware_profile(const std::string& json_text, const std::string& source);
std::string hardware_profile_json(const HardwareProfile& hw);

struct CollectiveTime {
  CollectiveKey key;
  CollectiveTally tally;
  bool inter_node = false;
  double seconds = 0;
};

struct StepTime {
  double matmul_s = 0;    // matmul/attention FLOPs / (GEMM rate x the efficiency of their smallest dim)
  double matmul_full_rate_s = 0;  // the same FLOPs at the full GEMM rate (what the efficiency adds: the difference)
  double memory_s = 0;    // other kernels' bytes / memory bandwidth + the optimizer's / its bandwidth
  double optimizer_s = 0; // the optimizer's part of memory_s
  double overhead_s = 0;  // host overhead: the three terms below
  double kernel_overhead_s = 0;        // kernel calls x the profile's per-kernel overhead
  double dist_overhead_s = 0;          // DTensor op dispatches x the per-dispatch overhead
  double redistribute_overhead_s = 0;  // redistributions x the per-redistribution overhead
  double sharing = 1;     // compute stretched by ranks per node / compute slots (>= 1), and by 1 / cpu_share
  double collective_overhead_s = 0;  // blocking collective calls x the per-collective overhead
  double comm_s = 0;      // sum of the collectives (alpha-beta) + collective_overhead_s
  double pipeline_stretch = 1;  // pipeline plans: 1 / (1 - bubble), (V m + p - 1) / (V m); else 1
  // The micro-batches' compute: crowding without a pipeline; with one, pipeline_stretch, or where
  // ranks share slots (crowding > 1) pipeline_shared_stretch of the schedule; / cpu_share.
  double micro_stretch = 1;
  double total_s = 0;
  std::vector<CollectiveTime> collectives;
};

// Whether a group over the mesh dims `dims` ("dp,tp") spans more ranks than a node holds
// (row-major ranks, nodes of devices_per_node consecutive ranks).
bool crosses_nodes(const PlanMesh& mesh, const std::string& dims, int64_t devices_per_node);
// Seconds of `calls` collectives of `kind` moving `bytes` in all over groups of `k` ranks.
double collective_seconds(const std::string& kind, int64_t calls, int64_t bytes, int64_t k, const LinkProfile& link);
// total = (matmul + memory + overhead - optimizer) x micro_stretch + optimizer x sharing + comm
// (sharing = crowding / cpu_share): the bubble stretches the micro-batches' work, not the
// optimizer step that follows them, and where ranks share a slot (crowding > 1) the bubble's idle
// time is the others' compute time (the schedule run with the sharing). Without a pipeline this
// is (matmul + memory + overhead) x sharing + comm.
StepTime roofline(const RankEstimate& est, const PlanMesh& mesh, const HardwareProfile& hw, DType precision);

}  // namespace mt
