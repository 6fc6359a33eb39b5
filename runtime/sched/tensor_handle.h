// A registered tensor's name inside Strata: a registry slot and that slot's generation, so a
// handle kept after unregister is detected (STRATA_E_BAD_HANDLE) instead of reaching whichever
// tensor reuses the slot.
#pragma once

#include <cstdint>

namespace strata::sched {

struct TensorHandle {
  uint32_t index = 0;
  uint32_t generation = 0;  // 0 is never issued: a zero handle is always invalid

  // The C API's strata_tensor: generation in the high half, so 0 stays "none".
  uint64_t to_u64() const { return (uint64_t{generation} << 32) | index; }
  static TensorHandle from_u64(uint64_t value) {
    return {static_cast<uint32_t>(value), static_cast<uint32_t>(value >> 32)};
  }
  friend bool operator==(const TensorHandle& a, const TensorHandle& b) {
    return a.index == b.index && a.generation == b.generation;
  }
};

}  // namespace strata::sched
