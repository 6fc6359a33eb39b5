// Where a tensor's data lives and what is being done to it: the residency state machine.
//
// A tensor has up to three copies (NVMe extent, pinned host buffer, device buffer). `valid` is
// the set of tiers whose copy holds the newest contents. The stable states are a function of
// that set alone (see stable_state_for); the transient states name the one transfer in flight.
// Every change goes through an event below, which checks the (from, to) pair against an explicit
// table and the new (state, valid) pair for consistency: an illegal request is a STRATA_E_STATE
// Status naming both states, never undefined behaviour. The rule the table enforces above all:
// the last valid copy is never dropped, so modified data survives until a write-back succeeded.
//
//            read                         copy_to_device
//   OnNvme --------> Reading --> Pinned ----------------> CopyingToDevice --> OnDevice
//     ^  (fail) <------'           |  ^  drop pinned / drop device  |            |
//     '-----------------------------'  '----------------------------+------------'
//   any stable --overwrite / modified--> Dirty --write_back--> WritingBack --> Pinned|OnDevice
//   Dirty <--> CopyingToHost (device -> pinned) ; Dirty --copy_to_device--> CopyingToDevice
//   any stable --discard--> Unwritten --overwrite--> Dirty
//
// Streamed (chunk by chunk through the backend's staging ring, no pinned copy of the tensor):
//
//            stream_to_device                          stream_to_nvme
//   OnNvme -----------------> StreamingIn --> OnDevice <--------------- StreamingOut <-- Dirty
//     ^        (fail) <------------'                     (fail) -----------------------> {device}
//
// StreamingIn starts from the NVMe copy alone and StreamingOut from the device copy alone: with a
// pinned copy the whole-buffer transfers above are the cheaper way.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "vocabulary/tier.h"

namespace strata::sched {

// A set of tiers, one bit per Tier value (vocabulary/tier.h; a tensor's copies are on the
// device, pinned and NVMe tiers, never on the pageable host tier).
using TierMask = uint8_t;
constexpr TierMask tier_bit(Tier tier) {
  return static_cast<TierMask>(1u << static_cast<unsigned>(tier));
}
inline constexpr TierMask kNvmeBit = tier_bit(Tier::kNvme);
inline constexpr TierMask kPinnedBit = tier_bit(Tier::kPinned);
inline constexpr TierMask kDeviceBit = tier_bit(Tier::kDevice);
inline constexpr TierMask kMemoryBits = kPinnedBit | kDeviceBit;

enum class Residency : uint8_t {
  kUnwritten = 0,        // registered, no contents anywhere yet (or discarded)
  kOnNvme = 1,           // only the NVMe copy is valid; no buffers held
  kReading = 2,          // NVMe -> pinned in flight
  kPinned = 3,           // clean: valid in pinned and on NVMe
  kCopyingToDevice = 4,  // pinned -> device in flight (source clean or dirty)
  kOnDevice = 5,         // clean: valid on device and NVMe (pinned maybe)
  kDirty = 6,            // newest contents only in memory (pinned and/or device), NVMe stale
  kWritingBack = 7,      // pinned -> NVMe in flight; the pinned copy stays valid meanwhile
  kCopyingToHost = 8,    // device -> pinned in flight
  kStreamingIn = 9,      // NVMe -> device in flight, chunk by chunk through staging buffers
  kStreamingOut = 10,    // device -> NVMe in flight, the same way; the device copy stays valid
};
inline constexpr int kResidencyCount = 11;
const char* to_string(Residency state);

// The legality table: true when `from -> to` is one of the transitions drawn above.
bool is_legal_transition(Residency from, Residency to);
bool is_transient(Residency state);
// True when `valid` may accompany `state` (e.g. OnNvme needs exactly {nvme}, Dirty needs a
// memory copy and no NVMe copy, CopyingToDevice a pinned source and no device copy yet).
bool is_consistent(Residency state, TierMask valid);
// The stable state that a set of valid copies denotes.
Residency stable_state_for(TierMask valid);

// One tensor's residency. Not synchronized: the scheduler holds its lock around every call.
// Each event returns STRATA_E_STATE (with `name`, both states and the copies) when it is not
// allowed, and then leaves the state unchanged.
class ResidencyState {
 public:
  ResidencyState() = default;
  // A tensor whose contents already sit in its NVMe extent (simulation, restored swap space).
  static ResidencyState on_nvme() { return ResidencyState(Residency::kOnNvme, kNvmeBit); }

  Residency state() const { return state_; }
  TierMask valid() const { return valid_; }
  bool valid_on(Tier tier) const { return (valid_ & tier_bit(tier)) != 0; }
  bool in_flight() const { return is_transient(state_); }
  // Modified since the last successful write-back: losing the memory copies would lose data.
  bool dirty() const { return valid_ != 0 && (valid_ & kNvmeBit) == 0; }
  // The tier a transfer in flight fills; meaningful only while in_flight().
  Tier transfer_target() const;

  Status begin_read(std::string_view name);              // OnNvme -> Reading
  Status begin_copy_to_device(std::string_view name);    // pinned valid, device not -> Copying
  Status begin_copy_to_host(std::string_view name);      // device valid, pinned not -> Copying
  Status begin_write_back(std::string_view name);        // dirty with a pinned copy -> WritingBack
  Status begin_stream_to_device(std::string_view name);  // OnNvme -> StreamingIn
  Status begin_stream_to_nvme(std::string_view name);    // dirty on the device alone -> Out
  // Ends the transfer in flight. On success its target becomes valid; on failure the copies
  // are exactly those before it began (so a failed write-back stays Dirty).
  Status finish(bool ok, std::string_view name);

  // The copy on `tier` is gone (buffer freed). Refused when it is the last valid copy.
  Status drop(Tier tier, std::string_view name);
  // The copy on `tier` (which must be valid) was modified: it alone holds the newest data.
  Status modified(Tier tier, std::string_view name);
  // Whatever the contents were, they are replaced by what the caller writes on `tier` (an
  // acquire with DISCARD, or the first write of an unwritten tensor). `tier` is pinned or device.
  Status overwrite(Tier tier, std::string_view name);
  // The contents are no longer needed (e.g. gradients the optimizer consumed).
  Status discard(std::string_view name);

 private:
  ResidencyState(Residency state, TierMask valid) : state_(state), valid_(valid) {}
  Status transition(Residency to, TierMask valid, std::string_view event, std::string_view name);

  Residency state_ = Residency::kUnwritten;
  TierMask valid_ = 0;
};

// "{nvme,pinned}" for messages.
std::string describe_copies(TierMask valid);

}  // namespace strata::sched
