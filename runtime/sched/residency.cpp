#include "sched/residency.h"

#include <array>

#include "common/assert.h"

namespace strata::sched {

namespace {

constexpr int index(Residency state) {
  return static_cast<int>(state);
}

using R = Residency;

// kLegal[from][to]. Written out in full so a reviewer can check each cell against the diagram in
// residency.h; the test restates it independently.
constexpr std::array<std::array<bool, kResidencyCount>, kResidencyCount> make_table() {
  std::array<std::array<bool, kResidencyCount>, kResidencyCount> t{};
  auto allow = [&t](R from, R to) { t[index(from)][index(to)] = true; };
  allow(R::kUnwritten, R::kDirty);  // first write

  allow(R::kOnNvme, R::kReading);
  allow(R::kOnNvme, R::kDirty);      // overwritten without reading
  allow(R::kOnNvme, R::kUnwritten);  // discarded

  allow(R::kReading, R::kPinned);  // read succeeded
  allow(R::kReading, R::kOnNvme);  // read failed: the NVMe copy is untouched

  allow(R::kPinned, R::kCopyingToDevice);
  allow(R::kPinned, R::kOnNvme);  // pinned copy dropped (clean)
  allow(R::kPinned, R::kDirty);   // modified or overwritten
  allow(R::kPinned, R::kUnwritten);

  allow(R::kCopyingToDevice, R::kOnDevice);  // clean source, copied
  allow(R::kCopyingToDevice, R::kPinned);    // clean source, copy failed
  allow(R::kCopyingToDevice, R::kDirty);     // dirty source, copied or failed

  allow(R::kOnDevice, R::kOnDevice);  // pinned copy dropped, device and NVMe remain
  allow(R::kOnDevice, R::kPinned);    // device copy dropped, pinned remains
  allow(R::kOnDevice, R::kOnNvme);    // device copy dropped, only NVMe remains
  allow(R::kOnDevice, R::kCopyingToHost);
  allow(R::kOnDevice, R::kDirty);
  allow(R::kOnDevice, R::kUnwritten);

  allow(R::kDirty, R::kDirty);  // one of two memory copies dropped, or modified again
  allow(R::kDirty, R::kWritingBack);
  allow(R::kDirty, R::kCopyingToDevice);
  allow(R::kDirty, R::kCopyingToHost);
  allow(R::kDirty, R::kUnwritten);

  allow(R::kWritingBack, R::kPinned);    // written; no device copy
  allow(R::kWritingBack, R::kOnDevice);  // written; a device copy exists too
  allow(R::kWritingBack, R::kDirty);     // write failed: data stays dirty in memory

  allow(R::kCopyingToHost, R::kDirty);     // dirty source, copied or failed
  allow(R::kCopyingToHost, R::kOnDevice);  // clean source, copied or failed

  allow(R::kOnNvme, R::kStreamingIn);
  allow(R::kStreamingIn, R::kOnDevice);  // streamed in
  allow(R::kStreamingIn, R::kOnNvme);    // failed: the NVMe copy is untouched

  allow(R::kDirty, R::kStreamingOut);
  allow(R::kStreamingOut, R::kOnDevice);  // streamed out: NVMe holds the device's contents
  allow(R::kStreamingOut, R::kDirty);     // failed: the data stays dirty on the device
  return t;
}

constexpr auto kLegal = make_table();

bool has(TierMask valid, TierMask bits) {
  return (valid & bits) == bits;
}

}  // namespace

const char* to_string(Residency state) {
  switch (state) {
    case R::kUnwritten:
      return "Unwritten";
    case R::kOnNvme:
      return "OnNvme";
    case R::kReading:
      return "Reading";
    case R::kPinned:
      return "Pinned";
    case R::kCopyingToDevice:
      return "CopyingToDevice";
    case R::kOnDevice:
      return "OnDevice";
    case R::kDirty:
      return "Dirty";
    case R::kWritingBack:
      return "WritingBack";
    case R::kCopyingToHost:
      return "CopyingToHost";
    case R::kStreamingIn:
      return "StreamingIn";
    case R::kStreamingOut:
      return "StreamingOut";
  }
  return "?";
}

bool is_legal_transition(Residency from, Residency to) {
  const int f = index(from), t = index(to);
  if (f < 0 || f >= kResidencyCount || t < 0 || t >= kResidencyCount) return false;
  return kLegal[f][t];
}

bool is_transient(Residency state) {
  return state == R::kReading || state == R::kCopyingToDevice || state == R::kWritingBack ||
         state == R::kCopyingToHost || state == R::kStreamingIn || state == R::kStreamingOut;
}

bool is_consistent(Residency state, TierMask valid) {
  if ((valid & ~(kNvmeBit | kPinnedBit | kDeviceBit)) != 0) return false;
  const bool nvme = has(valid, kNvmeBit), pinned = has(valid, kPinnedBit),
             device = has(valid, kDeviceBit);
  switch (state) {
    case R::kUnwritten:
      return valid == 0;
    case R::kOnNvme:
    case R::kReading:
      return valid == kNvmeBit;
    case R::kPinned:
      return valid == (kNvmeBit | kPinnedBit);
    case R::kCopyingToDevice:
      return pinned && !device;
    case R::kOnDevice:
      return nvme && device;
    case R::kDirty:
      return !nvme && (pinned || device);
    case R::kWritingBack:
      return !nvme && pinned;
    case R::kCopyingToHost:
      return device && !pinned;
    case R::kStreamingIn:
      return valid == kNvmeBit;
    case R::kStreamingOut:
      return valid == kDeviceBit;
  }
  return false;
}

Residency stable_state_for(TierMask valid) {
  if (valid == 0) return R::kUnwritten;
  if (!has(valid, kNvmeBit)) return R::kDirty;
  if (has(valid, kDeviceBit)) return R::kOnDevice;
  if (has(valid, kPinnedBit)) return R::kPinned;
  return R::kOnNvme;
}

std::string describe_copies(TierMask valid) {
  std::string out = "{";
  const Tier order[] = {Tier::kNvme, Tier::kPinned, Tier::kDevice};
  for (Tier tier : order) {
    if ((valid & tier_bit(tier)) == 0) continue;
    if (out.size() > 1) out += ',';
    out += to_string(tier);
  }
  out += '}';
  return out;
}

Tier ResidencyState::transfer_target() const {
  switch (state_) {
    case R::kReading:
    case R::kCopyingToHost:
      return Tier::kPinned;
    case R::kCopyingToDevice:
    case R::kStreamingIn:
      return Tier::kDevice;
    case R::kWritingBack:
    case R::kStreamingOut:
      return Tier::kNvme;
    default:
      break;
  }
  STRATA_ASSERT(!"transfer_target() without a transfer in flight");
  return Tier::kNvme;
}

Status ResidencyState::transition(Residency to, TierMask valid, std::string_view event,
                                  std::string_view name) {
  if (!is_legal_transition(state_, to) || !is_consistent(to, valid)) {
    return Status::error(STRATA_E_STATE,
                         "tensor '" + std::string(name) + "': " + std::string(event) +
                             " is not allowed: " + to_string(state_) + describe_copies(valid_) +
                             " -> " + to_string(to) + describe_copies(valid));
  }
  state_ = to;
  valid_ = valid;
  return Status::ok();
}

Status ResidencyState::begin_read(std::string_view name) {
  return transition(R::kReading, valid_, "read", name);
}

Status ResidencyState::begin_copy_to_device(std::string_view name) {
  return transition(R::kCopyingToDevice, valid_, "copy to device", name);
}

Status ResidencyState::begin_copy_to_host(std::string_view name) {
  return transition(R::kCopyingToHost, valid_, "copy to host", name);
}

Status ResidencyState::begin_write_back(std::string_view name) {
  return transition(R::kWritingBack, valid_, "write-back", name);
}

Status ResidencyState::begin_stream_to_device(std::string_view name) {
  return transition(R::kStreamingIn, valid_, "stream to device", name);
}

Status ResidencyState::begin_stream_to_nvme(std::string_view name) {
  return transition(R::kStreamingOut, valid_, "stream to nvme", name);
}

Status ResidencyState::finish(bool ok, std::string_view name) {
  if (!in_flight()) {
    return Status::error(STRATA_E_STATE, "tensor '" + std::string(name) +
                                             "': transfer finished in state " + to_string(state_) +
                                             ", which has none in flight");
  }
  const TierMask valid = ok ? static_cast<TierMask>(valid_ | tier_bit(transfer_target())) : valid_;
  return transition(stable_state_for(valid), valid, ok ? "transfer completion" : "transfer failure",
                    name);
}

Status ResidencyState::drop(Tier tier, std::string_view name) {
  if (tier == Tier::kNvme || in_flight() || !valid_on(tier)) {
    return Status::error(STRATA_E_STATE, "tensor '" + std::string(name) + "': cannot drop the " +
                                             to_string(tier) + " copy in state " +
                                             to_string(state_) + describe_copies(valid_));
  }
  const TierMask valid = static_cast<TierMask>(valid_ & ~tier_bit(tier));
  if (valid == 0) {
    return Status::error(STRATA_E_STATE, "tensor '" + std::string(name) + "': the " +
                                             to_string(tier) +
                                             " copy is the last valid one and cannot be dropped");
  }
  return transition(stable_state_for(valid), valid, "drop", name);
}

Status ResidencyState::modified(Tier tier, std::string_view name) {
  if (tier == Tier::kNvme || !valid_on(tier)) {
    return Status::error(STRATA_E_STATE, "tensor '" + std::string(name) + "': the " +
                                             to_string(tier) + " copy was modified but is not " +
                                             "valid in state " + to_string(state_) +
                                             describe_copies(valid_));
  }
  return transition(R::kDirty, tier_bit(tier), "modification", name);
}

Status ResidencyState::overwrite(Tier tier, std::string_view name) {
  if (tier == Tier::kNvme) {
    return Status::error(STRATA_E_STATE,
                         "tensor '" + std::string(name) + "': cannot overwrite on nvme");
  }
  return transition(R::kDirty, tier_bit(tier), "overwrite", name);
}

Status ResidencyState::discard(std::string_view name) {
  return transition(R::kUnwritten, 0, "discard", name);
}

}  // namespace strata::sched
