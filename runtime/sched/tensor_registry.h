// Registered tensors: slot + generation handles, the spec, the home tier, residency, buffers,
// and the use counts that keep a tensor in use from ever being evicted.
//
// Thread rules: the registry itself is not synchronized. It is owned by the Scheduler and every
// access happens under the scheduler's one lock (one lock for all residency state keeps the
// transitions of a tensor and the budget accounting atomic together). The Scheduler's public
// members (register_tensor, describe, ...) are the thread-safe way in.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/assert.h"
#include "common/status.h"
#include "sched/policy.h"
#include "sched/residency.h"
#include "sched/tensor_handle.h"
#include "sched/tier_backend.h"
#include "vocabulary/tensor_spec.h"

namespace strata::sched {

struct RegisterOptions {
  // Where the tensor rests. kNvme (usual): evicted from memory when others need the room.
  // kPinned / kDevice: never evicted from that tier once materialized, never written back unless
  // flushed (strata_malloc without OFFLOADABLE).
  Tier home = Tier::kNvme;
  // Size in bytes; 0 means spec.bytes(). (The C API registers sizes without shapes.)
  uint64_t bytes = 0;
  // Its contents already sit in NVMe space the backend can name (simulation: every tensor of a
  // model in steady state; a restored swap file). Starts OnNvme instead of Unwritten.
  bool contents_on_nvme = false;
  // A strata_malloc allocation rather than a registered tensor: strata_free takes it,
  // strata_tensor_unregister refuses it (and the other way round).
  bool allocation = false;
  // STRATA_TENSOR_READ_ONLY: a frozen weight. The scheduler treats it as any tensor (it is never
  // released dirty, so its memory copies stay clean); the C API refuses the calls that would
  // write it (c_api.cpp), so the flag is kept here for them and for describe().
  bool read_only = false;
};

inline constexpr uint32_t kNoOp = std::numeric_limits<uint32_t>::max();
inline constexpr uint32_t kNotResident = std::numeric_limits<uint32_t>::max();
inline constexpr int kNoPool = -1;

// The two memory tiers a tensor can hold a buffer on, in per-tensor arrays: device = 0,
// pinned = 1. NVMe is an extent, not a buffer; the pageable host tier holds no tensor.
inline constexpr int kMemoryTierCount = 2;
constexpr int memory_index(Tier tier) {
  STRATA_ASSERT(tier == Tier::kDevice || tier == Tier::kPinned);
  return tier == Tier::kDevice ? 0 : 1;
}

// A failed read or copy-in has no data to give: the tensor's next acquire reports it. A failed
// write-back (durability) keeps the data in memory: the next sync, flush or end_step reports it,
// the earliest first (sequence), after which the write-back may be tried again.
struct AsyncFailure {
  Status status;
  bool durability = false;
  uint64_t sequence = 0;
};

// The fields the scheduler's scans read for every resident tensor (evictable(), next_use(),
// walk_schedule's residency checks) come first and the spec (name, shape) last, so that a scan
// touches one or two cache lines per record instead of four: the simulator of a 70B plan spends
// most of its time in these scans.
struct TensorRecord {
  uint64_t bytes = 0;
  Tier home = Tier::kNvme;
  TensorHandle handle;
  bool allocation = false;  // RegisterOptions::allocation
  bool read_only = false;   // RegisterOptions::read_only

  // Placement, per memory tier: the pool the tensor is charged to (kNoPool: none serves its
  // kind there) and what one buffer costs in it.
  int pool[kMemoryTierCount] = {kNoPool, kNoPool};
  uint64_t charged[kMemoryTierCount] = {0, 0};
  // Scheduler::next_use's last answer per memory tier, kept while the cursor stays where it was
  // (next_use_epoch: the scheduler's cursor epoch then; 0: none) for the same filter: the pool
  // scans ask for the same residents' next uses on every pump, a binary search each. A cache of
  // a pure function of the schedule, so it may change under the scheduler's const members.
  mutable uint64_t next_use_memo[kMemoryTierCount] = {0, 0};
  mutable uint64_t next_use_epoch[kMemoryTierCount] = {0, 0};
  mutable uint8_t next_use_filter[kMemoryTierCount] = {0, 0};

  ResidencyState residency;
  Buffer buffer[kMemoryTierCount];  // allocated while valid there, or while a transfer fills it
  Extent extent;                    // allocated on the first write-back (or at registration)
  uint32_t resident_pos[kMemoryTierCount] = {kNotResident, kNotResident};  // in the pool's list
  // Whether the scheduler counts this buffer in its pool's droppable bytes (Scheduler::note_state
  // keeps it equal to Scheduler::droppable after every change of the fields that decides).
  bool counted_droppable[kMemoryTierCount] = {false, false};
  // Where Scheduler::list_victim put this tensor in its pool's victim sets, per tier.
  bool victim_listed[kMemoryTierCount] = {false, false};
  bool victim_dirty[kMemoryTierCount] = {false, false};
  VictimKey victim_key[kMemoryTierCount] = {};
  // Its node there while listed, so that unlisting needs no search of the set. (The key is kept
  // above as well: list_victim's check that nothing changed, on every note_state, then reads no
  // node.)
  VictimSet::iterator victim_at[kMemoryTierCount] = {};

  // Uses by the framework: acquired and not yet released, all on one tier at a time. use_tier
  // stays after the last release: the tier of the latest acquire (the optimizer reads it as
  // where backward made a gradient); kDevice until the first.
  uint32_t uses = 0;
  Tier use_tier = Tier::kDevice;
  // Acquires waiting for this tensor per tier: blocking waiters, and one flag for pollers
  // (the simulator), cleared when an acquire on that tier succeeds or is cancelled.
  uint32_t waiters[kMemoryTierCount] = {0, 0};
  bool polled[kMemoryTierCount] = {false, false};

  uint32_t op = kNoOp;           // the transfer in flight (one at a time per tensor)
  uint32_t range_copies = 0;     // range copies in flight from or into its held copy
  bool discard_pending = false;  // discard() came while a transfer was in flight
  // Scheduler::write_behind: the caller is done with it until its next acquire, so write-behind
  // may clean it even while the schedule's current phase lists it.
  bool done_for_now = false;
  // Scheduler::prefetch hinted it and no acquire has used it since: the framework will ask for
  // it soon. A tensor the schedule does not name (registered afresh each step, as strata.torch's
  // offloaded activations are) then ranks as needed in the current phase, not never, so that the
  // room the hint's read took is not the first to go (Scheduler::schedule_next_use).
  bool awaited = false;
  // Scheduler::write_behind(kNow) queued it for a write-back (write_back_queue_); cleared when the
  // queue serves or skips the entry.
  bool write_back_queued = false;
  // Entries of the scheduler's prefetch-hint ring naming this tensor: a change of this record
  // may change what their memos say (Scheduler::note_state counts such changes).
  uint32_t hints_in_ring = 0;
  // An asynchronous failure of this tensor not yet reported; until it is, the scheduler does not
  // retry the transfer on its own. It belongs to the tensor: unregistering or discarding the
  // tensor forgets it.
  std::optional<AsyncFailure> failure;
  uint64_t last_use_tick = 0;  // for LRU when no schedule exists yet
  TensorSpec spec;

  bool failed() const { return failure.has_value(); }
  // A lost write-back (or the device->pinned copy before one): the newest data is still in
  // memory and readable; sync / end_step report it.
  bool durability_failed() const { return failure.has_value() && failure->durability; }

  bool demanded(Tier tier) const {
    return waiters[memory_index(tier)] > 0 || polled[memory_index(tier)];
  }
  bool demanded() const { return demanded(Tier::kDevice) || demanded(Tier::kPinned); }
};

class TensorRegistry {
 public:
  // Explicit limit on live tensors (a 405B model with Adam states has ~6,000), at most
  // kMaxHandleIndex + 1 (a handle's index field). `owner` tags every handle this registry issues.
  TensorRegistry(uint32_t max_tensors, uint16_t owner) : max_tensors_(max_tensors), owner_(owner) {}

  // Adds a record (placement fields left to the caller). STRATA_E_LIMIT past max_tensors,
  // STRATA_E_INVALID for a zero size or a nvme-less home the caller forbids.
  Result<TensorHandle> add(const TensorSpec& spec, const RegisterOptions& options);
  // Frees the slot; the handle and every copy of it become stale.
  void remove(TensorHandle handle);

  // STRATA_E_BAD_HANDLE for a zero, never-issued, or stale (unregistered) handle.
  Result<uint32_t> resolve(TensorHandle handle) const;
  bool is_live(TensorHandle handle) const { return resolve(handle).is_ok(); }

  TensorRecord& at(uint32_t index) { return slot(index).record; }
  const TensorRecord& at(uint32_t index) const { return slot(index).record; }
  bool live(uint32_t index) const {
    return index < live_generation_.size() && live_generation_[index] != 0;
  }

  uint32_t slot_count() const { return slot_count_; }
  uint32_t live_count() const { return live_; }
  uint32_t max_tensors() const { return max_tensors_; }

 private:
  struct Slot {
    TensorRecord record;
    uint32_t generation = 0;
  };
  // Slots in chunks of 64 that never move, so records stay put while others are registered, and
  // finding one is a shift and a mask (at() runs for every record the scheduler reads; a deque of
  // records this size holds one per block and indexes through its map).
  static constexpr uint32_t kChunkShift = 6;
  static constexpr uint32_t kSlotsPerChunk = 1u << kChunkShift;
  Slot& slot(uint32_t index) { return chunks_[index >> kChunkShift][index & (kSlotsPerChunk - 1)]; }
  const Slot& slot(uint32_t index) const {
    return chunks_[index >> kChunkShift][index & (kSlotsPerChunk - 1)];
  }
  std::vector<std::unique_ptr<Slot[]>> chunks_;
  uint32_t slot_count_ = 0;
  // Per slot: the live generation, or 0. resolve() runs for every access the scheduler looks at;
  // a flat array keeps that check to one load.
  std::vector<uint32_t> live_generation_;
  std::vector<uint32_t> free_slots_;
  uint32_t live_ = 0;
  uint32_t max_tensors_;
  uint16_t owner_;
};

}  // namespace strata::sched
