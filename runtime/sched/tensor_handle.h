// A registered tensor's name inside Strata: a registry slot, that slot's generation and the
// registry's owner tag. The generation detects a handle kept after unregister (STRATA_E_BAD_HANDLE
// instead of reaching whichever tensor reuses the slot); the owner tag detects a handle of another
// runtime, whose first tensor would otherwise carry the same slot and generation.
//
// The C API's strata_tensor packs the three into 64 bits: owner (16) | generation (24) |
// index (24). Generation 0 is never issued, so 0 stays "none" whatever the owner.
#pragma once

#include <cstdint>

namespace strata::sched {

inline constexpr uint32_t kHandleIndexBits = 24;
inline constexpr uint32_t kHandleGenerationBits = 24;
inline constexpr uint32_t kMaxHandleIndex = (1u << kHandleIndexBits) - 1;
inline constexpr uint32_t kMaxHandleGeneration = (1u << kHandleGenerationBits) - 1;

struct TensorHandle {
  uint32_t index = 0;
  uint32_t generation = 0;  // 0 is never issued: a zero handle is always invalid
  uint16_t owner = 0;       // the issuing registry's tag

  uint64_t to_u64() const {
    return (uint64_t{owner} << (kHandleIndexBits + kHandleGenerationBits)) |
           (uint64_t{generation & kMaxHandleGeneration} << kHandleIndexBits) |
           (index & kMaxHandleIndex);
  }
  static TensorHandle from_u64(uint64_t value) {
    return {static_cast<uint32_t>(value & kMaxHandleIndex),
            static_cast<uint32_t>((value >> kHandleIndexBits) & kMaxHandleGeneration),
            static_cast<uint16_t>(value >> (kHandleIndexBits + kHandleGenerationBits))};
  }
  friend bool operator==(const TensorHandle& a, const TensorHandle& b) {
    return a.index == b.index && a.generation == b.generation && a.owner == b.owner;
  }
};

}  // namespace strata::sched
