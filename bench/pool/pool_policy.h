// How the policies `strata bench pool` compares with the runtime's exact-size recycler
// (memory/pinned_recycler.h) would size pinned buffers for the same recorded requests
// (memory/pinned_trace.h). They are models for the benchmark, not part of the runtime: measured on
// the main job's trace, each pins more than the recycler (docs/memory.md).
//
//  adaptive (MemAscend's size-class pool): size classes found in the data. Distinct request sizes
//    are clustered (sizes within merge_tolerance of a cluster's largest join it; a cluster's slot
//    is its largest size, so merging wastes at most the tolerance); with more than max_classes
//    clusters, the adjacent pair whose merge wastes least is merged until few enough remain. A
//    request takes a free buffer of the smallest class that holds it, else of the next larger
//    class with one free (borrowing). Buffer counts come from replaying the whole trace on counts
//    alone and adding a buffer to a request's own class whenever nothing free holds it: the
//    fewest buffers with which this greedy placement serves every request at once, without
//    waiting. That is the pool's best case: it is sized knowing the whole run in advance.
//  zero-infinity (DeepSpeed's fixed-buffer swapper): one pinned block of uniform slots, each of the
//    largest request (or buffer_size_bytes when larger, as DeepSpeed's offload_param.buffer_size
//    does), as many slots as the most requests live at once (at least buffer_count, DeepSpeed's
//    default 5: below the live count DeepSpeed fails with "not enough swap buffers").
//  pow2 (PyTorch's caching host allocator): each request pinned on demand at its size rounded up
//    to a power of two (at least a page), cached on release and reused best-fit by later
//    requests; it grows whenever no cached block is large enough and never shrinks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "memory/pinned_trace.h"

namespace strata::bench {

enum class PoolPolicy : uint8_t { kAdaptive = 0, kZeroInfinity = 1, kPow2 = 2 };
const char* to_string(PoolPolicy policy);  // "adaptive", "zero-infinity", "pow2"

struct PoolOptions {
  // adaptive
  double merge_tolerance = 0.02;
  uint32_t max_classes = 16;
  // zero-infinity
  uint32_t zero_buffer_count = 5;
  uint64_t zero_buffer_size_bytes = 0;  // 0: the largest request
};

struct SizeClass {
  uint64_t slot_bytes = 0;      // each buffer's capacity
  uint32_t count = 0;           // buffers
  uint64_t smallest_bytes = 0;  // smallest request whose own class this is
  uint32_t distinct_sizes = 0;  // distinct request sizes merged into it
  uint64_t requests = 0;        // requests whose own class this is
};

struct PoolPlan {
  PoolPolicy policy = PoolPolicy::kAdaptive;
  std::vector<SizeClass> classes;  // ascending slot_bytes; empty for pow2 (grown on demand)
  uint64_t reserved_bytes = 0;     // mapped up front, in 4 KiB pages (pow2: 0)
  uint64_t zero_block_bytes = 0;   // zero-infinity: the one block (count x slot)
};

// Clustered size classes of the request sizes (one entry per request), ascending, counts 0.
std::vector<SizeClass> derive_size_classes(std::span<const uint64_t> requests,
                                           double merge_tolerance, uint32_t max_classes);

// The policy's buffers for this trace. STRATA_E_INVALID for bad options or a trace without takes.
Result<PoolPlan> plan_for_trace(const memory::PinnedTrace& trace, PoolPolicy policy,
                                const PoolOptions& options);

}  // namespace strata::bench
