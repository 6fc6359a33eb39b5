// Which of the schedule's accesses a prefetch could start now, and over which link: the index the
// scheduler's schedule walk follows, so that a pump looks only at accesses whose link has room
// instead of at every access in the prefetch window (a 70B plan's walks looked at ~600 accesses
// per pump and found ~150 of them waiting for a busy link).
//
// An access's lane names what its prefetch would start: the pool it makes room in and the link
// it starts a transfer on (an NVMe read into pinned memory, also the first leg of a device
// access with no pinned copy; a pinned -> device copy; a device -> pinned copy). No lane: a
// prefetch of it would do nothing whatever the links and the pools (an overwrite, a stale handle,
// a copy already there or in flight, a tensor in use, failed or without contents). The scheduler
// numbers the lanes and decides them (Scheduler::lane_of), and sets them again after every change
// of a tensor's state; this class only keeps them, as one bitset per lane over the access
// positions (AccessSchedule::access), so that the next access in any of a set of lanes (those
// whose pool is not full and whose link has room) is a few word loads away. Not synchronized:
// the scheduler's lock guards it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sched/access_schedule.h"

namespace strata::sched {

class AccessLanes {
 public:
  static constexpr uint32_t kMaxLanes = 64;  // a set of lanes is a uint64_t, bit per lane
  static constexpr uint32_t kNoLane = 0xFF;

  // Sizes the index for `schedule` and `lanes` lanes (allocates: a schedule is declared or
  // recorded once), every access without a lane.
  void reset(const AccessSchedule& schedule, uint32_t lanes);

  uint32_t size() const { return static_cast<uint32_t>(lane_.size()); }
  // The positions of the reads of registry slot `slot` (of any generation), ascending: the only
  // accesses that ever have a lane, and the ones to set again when that slot's tensor changes.
  std::span<const uint32_t> reads_of(uint32_t slot) const;
  // The phase of the access at `position`.
  uint32_t phase_of(uint32_t position) const { return phase_[position]; }

  uint32_t lane(uint32_t position) const;  // or kNoLane
  void set(uint32_t position, uint32_t lane);
  // The first position in [from, end) whose lane is in `lanes` (bit per lane), else end.
  uint32_t next(uint32_t from, uint32_t end, uint64_t lanes) const;
  // Whether the bitsets say what the lanes say (check_invariants recomputes them; O(size)).
  bool bitsets_match_lanes() const;

 private:
  uint32_t lane_count_ = 0;
  std::vector<uint8_t> lane_;    // per position: its lane, or kNoLane
  std::vector<uint32_t> phase_;  // per position
  std::vector<uint64_t> words_;  // word w of lane l at w * lane_count_ + l
  // Bit w % 64 of summary word (w / 64) * lane_count_ + l: word w of lane l is not zero.
  std::vector<uint64_t> summary_;
  std::vector<uint32_t> begin_;  // per slot + 1: reads_[begin_[s] .. begin_[s + 1])
  std::vector<uint32_t> reads_;
};

}  // namespace strata::sched
