// Pure placement policy: how many bytes a buffer costs, which resident tensor to evict, how far
// prefetch may look. No state, no locks, no I/O: the scheduler (over real or simulated tiers), the
// simulator's ZeRO-Infinity model and the planners all call these same functions.
#pragma once

#include <cstdint>
#include <limits>
#include <memory_resource>
#include <set>
#include <span>

#include "common/align.h"
#include "common/status.h"

namespace strata::sched {

// "Not used again in the schedule" as a next-use distance.
inline constexpr uint64_t kNeverUsed = std::numeric_limits<uint64_t>::max();

// How a buffer's size follows from the tensor's.
enum class SizeClass : uint8_t {
  kExact = 0,       // rounded up to `alignment` only (Strata: page-exact pinned buffers)
  kPowerOfTwo = 1,  // next power of two of the page-rounded size (PyTorch's caching host allocator)
  kUniformSlot = 2  // every tensor takes one slot of `slot_bytes` (ZeRO-Infinity's param buffers)
};
const char* to_string(SizeClass size_class);

struct SizeRule {
  SizeClass size_class = SizeClass::kExact;
  uint64_t alignment = kPageSize;  // kExact; a power of two
  uint64_t slot_bytes = 0;         // kUniformSlot
};

// Bytes a buffer for a tensor of `bytes` occupies under `rule`. STRATA_E_INVALID for a zero-size
// tensor, a bad rule, or a tensor larger than the uniform slot (ZeRO-Infinity's "buffer_size too
// small").
Result<uint64_t> charged_bytes(const SizeRule& rule, uint64_t bytes);

// A resident buffer the scheduler could give up to make room.
struct EvictionCandidate {
  uint32_t tensor = 0;          // registry slot; the final tie-breaker, for determinism
  uint64_t next_use = 0;        // phases until the tensor is read on this tier again (kNeverUsed)
  uint64_t charged_bytes = 0;   // what evicting it frees
  bool needs_cleaning = false;  // holds the only newest copy: must be written out before freeing
};

// Belady's choice: the candidate used farthest in the future, among those whose next use is at
// least `min_next_use` (prefetching for distance d passes d + 1, so it never evicts something
// needed sooner than what it brings in; a demand passes 0). Candidates that need cleaning qualify
// only when `allow_cleaning`. Ties go to clean over dirty, then to the larger buffer (fewer
// evictions), then to the lower tensor slot. Returns the index into `candidates`, or npos.
inline constexpr size_t kNoVictim = std::numeric_limits<size_t>::max();
size_t choose_victim(std::span<const EvictionCandidate> candidates, uint64_t min_next_use,
                     bool allow_cleaning);
// The order choose_victim uses: true when a is the better victim.
bool better_victim(const EvictionCandidate& a, const EvictionCandidate& b);

// A candidate as a pool's victim set keeps it (Scheduler): rank orders as the next use does.
struct VictimKey {
  uint64_t rank = 0;
  uint64_t charged_bytes = 0;
  uint32_t tensor = 0;
  bool operator==(const VictimKey&) const = default;
};
// better_victim's order within one class (clean or dirty): rank, then bytes, then slot.
struct VictimOrder {
  bool operator()(const VictimKey& a, const VictimKey& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    if (a.charged_bytes != b.charged_bytes) return a.charged_bytes > b.charged_bytes;
    return a.tensor < b.tensor;
  }
};
// A pool's candidates of one class, best first (Scheduler::PoolState::victims).
using VictimSet = std::pmr::set<VictimKey, VictimOrder>;

// How far ahead of the current phase prefetch walks the schedule.
struct PrefetchWindow {
  uint32_t max_phases = 64;      // phases ahead, the current one included
  uint32_t max_accesses = 4096;  // accesses examined per walk (bounds the work per event)
};

// The TieredOptimizer's read-ahead window: how many sub-groups its loader holds ahead of the one
// being updated. What fits of `unit` (the largest sub-group's three fp32 states) in the pinned
// pool beside `held_pinned` (the parameter and gradient held there, whole or as pieces), less the
// one being updated, the one being written back and one of room, so that the next read runs
// while that write does; at least 1, at most kMaxOptimizerLookahead. The optimizer and the
// simulator's play of it (sched/simulator.cpp) both take it from here.
inline constexpr uint32_t kMaxOptimizerLookahead = 16;
uint32_t optimizer_lookahead(uint64_t pool_bytes, uint64_t held_pinned, uint64_t unit);

// Whether the optimizer writes each sub-group back as soon as it has updated it
// (Scheduler::write_behind with kNow) rather than leaving it dirty until its room is needed.
// Yes when its states, `state_bytes` in all, do not fit the pinned pool of `pool_bytes` and the
// pool holds no more than the read-ahead window (optimizer_lookahead, of `unit`-byte sub-groups
// beside `held_pinned`) and its three spare sub-groups: a step then writes out nearly every
// sub-group anyway, and which few stayed dirty from one step to the next, unwritten, was a matter
// of thread timing. Left to the room search, the main job's identical steps wrote up to 3.9 MB
// apart, in the pinned pool's last partial sub-groups, and no plan could say which
// (docs/planner.md, "Predicted against measured"); written through, every state is written once
// per step, the same bytes every step. A larger pool keeps whole sub-groups dirty across steps
// on purpose (about 440 GB a step at 70B with 512 GiB of RAM), which writing through gives up:
// there the room search decides, as before. The optimizer and the simulator's play of it both ask
// here.
bool optimizer_writes_through(uint64_t state_bytes, uint64_t pool_bytes, uint64_t held_pinned,
                              uint64_t unit);

// Write-behind: whether a pool should start cleaning (writing out) dirty buffers so that an
// eviction later finds clean victims instead of waiting for a write. The pool wants either
// `headroom` x budget or the bytes that requests waiting for its room need (`waiting_bytes`),
// whichever is more, to be free, clean (droppable at once) or already being cleaned. The second
// term is why a reader several buffers ahead of a writer keeps the drive busy in both
// directions: room freed one write at a time let one read start per finished write, so the drive
// saw one request each way however far ahead the reads were hinted.
bool wants_cleaning(uint64_t budget, uint64_t used, uint64_t droppable_bytes,
                    uint64_t cleaning_bytes, double headroom, uint64_t waiting_bytes = 0);

}  // namespace strata::sched
