// Replays a recorded pinned trace (memory/pinned_trace.h) through the runtime's recycler or
// through a compared pool, on a dry arena (pages never touched or locked, so a trace of any size
// costs no RAM here): the same requests in the same order, each served at once. What differs is
// what each one maps (peak reserved bytes, arena allocations) and what each acquire and release
// costs. Used by `strata bench pool` and its tests.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "memory/pinned_trace.h"
#include "pool/pool_policy.h"

namespace strata::bench {

// What the trace itself asks for, the same for every policy.
struct TraceDemand {
  uint64_t takes = 0;
  uint32_t peak_live = 0;             // most buffers live at once
  uint64_t peak_requested_bytes = 0;  // most bytes asked for by live buffers at once
  uint64_t peak_page_bytes = 0;       // the same with each request rounded up to 4 KiB
  // In the recorded run: takes served by a kept buffer, and the mean wall time of those and of
  // the takes that mapped (mmap, mlock, GPU and io_uring registration on that machine).
  uint64_t reused_in_run = 0;
  double reused_take_ns_in_run = 0;
  double mapped_take_ns_in_run = 0;
  uint64_t mapped_bytes_in_run = 0;  // reserved bytes of the takes that mapped
  double mapped_ns_in_run = 0;       // their total wall time
};
TraceDemand trace_demand(const memory::PinnedTrace& trace);

struct ReplayOptions {
  uint32_t passes = 5;  // the trace is replayed this many times on the same allocator; >= 2
};

struct ReplayResult {
  uint64_t peak_reserved_bytes = 0;  // the arena's peak over every pass
  // Arena allocations (each an mmap, mlock, cudaHostRegister and io_uring registration in the
  // runtime) made by the first pass, a run from a cold start, and by each later pass on average
  // (a steady-state run of the trace's length). The pools map up front: first pass only.
  uint64_t mapped_first_pass = 0;
  double mapped_per_later_pass = 0;
  uint64_t mapped_bytes_first_pass = 0;  // their reserved bytes
  double mapped_bytes_per_later_pass = 0;
  uint64_t waits = 0;  // takes that found no free buffer (a sized pool has none)
  // Mean wall time per call, clock overhead taken off: passes after the first (steady state),
  // and the first pass's takes (which map, here without locking or registering).
  double take_ns = 0;
  double give_ns = 0;
  double first_pass_take_ns = 0;
};

// Through memory::PinnedRecycler under `budget_bytes` (0: unlimited), as the runtime does.
Result<ReplayResult> replay_through_recycler(const memory::PinnedTrace& trace,
                                             uint64_t budget_bytes, const ReplayOptions& options);
// Through a BufferPool of that plan.
Result<ReplayResult> replay_through_pool(const memory::PinnedTrace& trace, const PoolPlan& plan,
                                         const ReplayOptions& options);

}  // namespace strata::bench
