// DTensor op dispatch (docs/sharding.md): the handler tensor/ calls for an op with a DTensor input.
// It looks the op up in the propagation cache (keyed by op, interned input specs and the
// rule-relevant arguments), runs the op on the local shards, and wraps the results; autograd sees
// one boundary node per DTensor input and output. Installed when the first spec is interned.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/dist_dispatch.h"

namespace mt {

void install_dist_dispatch();

// Explicit by default: an input placement the rule cannot take is an error. In implicit mode
// (MT_DTENSOR_IMPLICIT=1 or set_implicit_redistribute(true)) such inputs are first redistributed
// to Replicate on the offending mesh dims, and the op retried.
void set_implicit_redistribute(bool on);
bool implicit_redistribute();

// A note appended to every DTensor op error, computed when the error is raised (plan/ installs
// one that spots a dropped parallelize() result). nullptr: none.
using DistErrorNote = std::string (*)();
void set_dist_error_note(DistErrorNote note);

struct DispatchStats {
  int64_t hits = 0, misses = 0;
  int64_t flushes = 0;  // times the cache reached its bound (4096 entries) and was emptied
  int64_t entries = 0;  // entries now
};
DispatchStats dispatch_stats();  // this thread's propagation cache
void clear_dispatch_cache();     // this thread's (the cache bounds itself; this frees it now)

}  // namespace mt
