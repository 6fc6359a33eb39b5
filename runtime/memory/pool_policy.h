// How a buffer pool sizes its pinned buffers: three policies behind one BufferPool, so that
// benchmarks compare them inside the same code.
//
//  strata (adaptive): size classes found in the data. Distinct tensor sizes are clustered (sizes
//    within merge_tolerance of a cluster's largest join it; a cluster's slot is its largest size,
//    so merging wastes at most the tolerance); with more than max_classes clusters, the adjacent
//    pair whose merge wastes least is merged until few enough remain. On Llama-2-70B this finds
//    embedding/head, MLP projections, q/o projections, k/v projections and norms by itself.
//    Buffer counts per class follow from the windows (staging.h) by Hall's rule: sort classes by
//    size, largest first; D_k = the most tensors of classes 1..k in any one window; class k gets
//    D_k - D_(k-1) buffers. A tensor may use a larger class's buffer when its own class is
//    exhausted, so this is the fewest bytes with which every window fits at once: e.g. the
//    embedding's buffer, idle in mid-model windows, carries an MLP projection there instead of an
//    extra MLP buffer being pinned. Those counts suffice when a window's tensors are placed
//    together; acquired one at a time in step order (no tensor moves once staged), a small
//    tensor can hold a larger buffer that a larger tensor entering later needs - on Llama-2-70B
//    at lookahead 2 the MLP projection borrowing the embedding/head buffer alternates between
//    layers and sits in layer 79 when the head arrives, and no assignment avoids that. So the
//    plan replays the step on its counts, acquiring exactly as the pool does (staging_replay.h),
//    and adds a buffer to the class of any tensor that would be missing when its own visit runs.
//    An acquire for a later visit may still wait for a release (its fetch then starts one visit
//    later: `deferred` in the replay); with no_waiting, buffers are added until none ever
//    waits. Under a budget, the lookahead shrinks until the plan fits.
//  zero-infinity: DeepSpeed's parameter swapper. One pinned block of uniform slots, each of
//    buffer_size elements (at least the largest tensor: DeepSpeed requires it), buffer_count slots
//    (DeepSpeed's default 5) or as many as the window's peak tensor count (DeepSpeed fails with
//    "not enough swap buffers" below that, so a user must raise buffer_count to it). Optionally
//    the block is rounded to a power of two as torch's pin_memory() does (zero_pow2_block).
//  pow2: PyTorch's caching host allocator: each tensor pinned on demand at its size rounded up to
//    a power of two (at least a page), cached on release and reused best-fit by later requests;
//    it grows whenever no cached block is large enough and never shrinks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "memory/staging.h"

namespace strata::memory {

enum class PoolPolicy : uint8_t { kStrata = 0, kZeroInfinity = 1, kPow2 = 2 };
const char* to_string(PoolPolicy policy);  // "strata", "zero-infinity", "pow2"
std::optional<PoolPolicy> parse_pool_policy(std::string_view name);

struct PoolOptions {
  PoolPolicy policy = PoolPolicy::kStrata;
  uint32_t lookahead = 2;     // visits in flight (see staging.h); >= 1
  uint64_t budget_bytes = 0;  // pinned bytes the pool may map; 0: whatever the arena has left
  // strata
  double merge_tolerance = 0.02;
  uint32_t max_classes = 16;
  bool no_waiting = false;  // size so that no acquire along the windows ever waits
  // zero-infinity (DeepSpeed offload_param defaults)
  uint32_t zero_buffer_count = 5;
  uint64_t zero_buffer_size_elements = 100'000'000;
  bool zero_pow2_block = false;
};

struct SizeClass {
  uint64_t slot_bytes = 0;      // each buffer's capacity
  uint32_t count = 0;           // buffers
  uint64_t smallest_bytes = 0;  // smallest tensor whose own class this is
  uint32_t distinct_sizes = 0;  // distinct tensor sizes merged into it
  uint32_t tensors = 0;         // tensors whose own class this is
};

struct PoolPlan {
  PoolPolicy policy = PoolPolicy::kStrata;
  uint32_t lookahead = 0;          // the lookahead the plan holds (may be below the asked one)
  std::vector<SizeClass> classes;  // ascending slot_bytes; empty for pow2 (grown on demand)
  uint64_t requested_bytes = 0;    // peak bytes in flight over the windows
  uint32_t peak_tensors = 0;       // most tensors in flight at once
  // Pinned bytes the plan maps up front, in 4 KiB pages (pow2: 0, it grows while running).
  uint64_t reserved_bytes = 0;
  uint64_t zero_block_bytes = 0;  // zero-infinity: the one block (count x slot, maybe pow2)
};

// Clustered size classes of the tensors, ascending (counts left 0).
std::vector<SizeClass> derive_size_classes(std::span<const StagedTensor> tensors,
                                           double merge_tolerance, uint32_t max_classes);

// The plan for these tensors. budget_bytes: pinned bytes available (0: unlimited). Fails with
// STRATA_E_PINNED_BUDGET (and the numbers) when even a lookahead of 1 does not fit (strata), or
// the uniform slots do not (zero-infinity); STRATA_E_INVALID for bad options or no tensors.
Result<PoolPlan> plan_pool(std::span<const StagedTensor> tensors, const PoolOptions& options,
                           uint64_t budget_bytes);

}  // namespace strata::memory
