// Alignment arithmetic for direct I/O and page-granular allocation.
#pragma once

#include <cstdint>

namespace strata {

inline constexpr uint64_t kPageSize = 4096;

constexpr bool is_power_of_two(uint64_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}
constexpr uint64_t align_up(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}
constexpr uint64_t align_down(uint64_t x, uint64_t alignment) {
  return x / alignment * alignment;
}
constexpr bool is_aligned(uint64_t x, uint64_t alignment) {
  return x % alignment == 0;
}
inline bool is_aligned(const void* p, uint64_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}
constexpr uint64_t next_power_of_two(uint64_t x) {
  uint64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

}  // namespace strata
