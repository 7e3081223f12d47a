// Meshes shared by the multi-rank tests: the world as one dim, and a 2x2 mesh (only valid when
// the test runs on 4 ranks). Built once per process so their communicators are created once.
#pragma once

#include <fmt/format.h>

#include <string>

#include "mesh/collective_count.h"
#include "mesh/device_mesh.h"
#include "mesh/world.h"

namespace mt::testing {

inline int world_size() { return world().size(); }

inline DeviceMesh& mesh_1d() {
  static DeviceMesh m({world_size()}, {"x"});
  return m;
}

inline DeviceMesh& mesh_2d() {
  static DeviceMesh m({2, 2}, {"a", "b"});
  return m;
}

// "kind@dims: N calls B B; ..." (or "none"): collective tallies in a failure message.
inline std::string counts_str(const CollectiveCounts& c) {
  std::string s;
  for (const auto& [k, t] : c)
    s += fmt::format("{}{}@{}: {} calls {} B", s.empty() ? "" : "; ", k.kind, k.dims, t.calls, t.bytes);
  return s.empty() ? "none" : s;
}

}  // namespace mt::testing
