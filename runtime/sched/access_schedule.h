// The access order of one training step: phases (forward layer 0..N-1, backward N-1..0, the
// optimizer, ...) each listing the tensors it touches, on which tier, and whether their old
// contents are needed. Recorded during the first step (Builder fed by begin_phase / acquire) or
// declared by the framework. Steps repeat, so the schedule wraps around: after the last phase
// comes the first phase of the next step. That is what makes Belady's rule usable: the next use
// of any tensor is known, in O(log n).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "sched/policy.h"
#include "sched/residency.h"
#include "sched/tensor_handle.h"

namespace strata::sched {

// Values equal STRATA_PHASE_* in strata.h (kOther is internal: accesses outside any phase).
enum class PhaseKind : uint8_t { kForward = 0, kBackward = 1, kOptimizer = 2, kOther = 3 };
const char* to_string(PhaseKind kind);

struct PhaseKey {
  PhaseKind kind = PhaseKind::kOther;
  int32_t layer = -1;
  friend bool operator==(const PhaseKey& a, const PhaseKey& b) {
    return a.kind == b.kind && a.layer == b.layer;
  }
};

enum class AccessMode : uint8_t {
  kRead = 0,       // the current contents are needed (they may also be modified)
  kOverwrite = 1,  // the contents will be replaced (acquire with DISCARD): nothing to load
};

struct Access {
  TensorHandle tensor;
  Tier tier = Tier::kDevice;  // kDevice or kPinned
  AccessMode mode = AccessMode::kRead;
};

// Which reads next_read counts.
enum class UseFilter : uint8_t { kAnyTier = 0, kPinned = 1, kDevice = 2 };
inline constexpr int kUseFilterCount = 3;
constexpr UseFilter filter_for(Tier tier) {
  return tier == Tier::kDevice ? UseFilter::kDevice : UseFilter::kPinned;
}

// clang-tidy 14 flags the '__i0' loop of the implicit copy of the array members, not a name
// written here.
class AccessSchedule {  // NOLINT(bugprone-reserved-identifier)
 public:
  // Explicit limits: a 405B model has ~1,000 parameters and ~10,000 accesses per step.
  static constexpr uint32_t kMaxPhases = 1u << 20;
  static constexpr uint32_t kMaxAccesses = 1u << 24;

  class Builder {
   public:
    // Starts a new phase; accesses added until the next begin_phase belong to it.
    void begin_phase(PhaseKey key);
    // Appends an access to the current phase (an implicit kOther phase when none was begun).
    // A repeat of the same (tensor, tier) within a phase is dropped at build(): the first one
    // decides whether contents must be loaded. STRATA_E_INVALID for a nvme tier or past limits.
    Status add(const Access& access);
    uint32_t phase_count() const { return static_cast<uint32_t>(phase_keys_.size()); }
    bool empty() const { return accesses_.empty(); }
    // STRATA_E_INVALID when no access was added.
    Result<AccessSchedule> build() &&;

   private:
    std::vector<PhaseKey> phase_keys_;
    std::vector<uint32_t> phase_begin_;  // index into accesses_
    std::vector<Access> accesses_;
  };

  AccessSchedule() = default;

  uint32_t phase_count() const { return static_cast<uint32_t>(phase_keys_.size()); }
  uint32_t access_count() const { return static_cast<uint32_t>(accesses_.size()); }
  PhaseKey phase_key(uint32_t phase) const { return phase_keys_[phase]; }
  std::span<const Access> phase_accesses(uint32_t phase) const;
  // Accesses are numbered in schedule order (phase by phase): the position of a phase's first
  // access (phase_count(): access_count()), and the access at a position.
  uint32_t access_begin(uint32_t phase) const;
  const Access& access(uint32_t position) const;

  // The first phase at or after `from` (wrapping) whose key is `key`; nullopt when none has it.
  // Keys may repeat (one optimizer phase per parameter, gradient-accumulation micro-steps).
  std::optional<uint32_t> find_phase(PhaseKey key, uint32_t from) const;

  // Phases from `from` (0: `from` itself) to the next phase that reads `tensor` on the filtered
  // tier, wrapping into the next step; kNeverUsed when no phase does (or the handle is stale).
  // Overwrites are not reads: data whose next access overwrites it is not needed in memory.
  uint64_t next_read(TensorHandle tensor, UseFilter filter, uint32_t from) const;

  // Every (slot, generation) the schedule mentions appears here; for tests and tools.
  bool mentions(TensorHandle tensor) const;

 private:
  std::vector<PhaseKey> phase_keys_;
  std::vector<uint32_t> phase_begin_;  // phase_count + 1 entries
  std::vector<Access> accesses_;
  // Per registry slot: the generation the uses belong to, and per filter the sorted phases
  // reading it (compressed rows: uses_[f][use_begin_[f][slot] .. use_begin_[f][slot + 1])).
  std::vector<uint32_t> slot_generation_;
  std::vector<uint32_t> use_begin_[kUseFilterCount];
  std::vector<uint32_t> uses_[kUseFilterCount];
  // (key, phase) sorted, for find_phase.
  struct KeyedPhase {
    PhaseKey key;
    uint32_t phase;
  };
  std::vector<KeyedPhase> keyed_phases_;
};

}  // namespace strata::sched
