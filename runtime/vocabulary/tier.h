// The four places a tensor's bytes can live. One enum for the whole runtime: the scheduler's
// residency, the accounting behind strata_get_stats and the C API all use it, and its values
// equal strata.h's STRATA_TIER_* (checked at compile time in c_api_values.cpp), so crossing the
// C boundary is a checked conversion, never a cast between enums that could disagree.
#pragma once

#include <cstdint>

namespace strata {

enum class Tier : uint8_t {
  kHost = 0,    // pageable host memory: Strata's own scratch, never a tensor's home
  kPinned = 1,  // page-locked host buffers
  kDevice = 2,  // GPU memory (or the host-emulated device)
  kNvme = 3,    // the extent store
};
inline constexpr int kTierCount = 4;

const char* to_string(Tier tier);

}  // namespace strata
