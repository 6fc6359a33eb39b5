#include "sched/policy.h"

#include <algorithm>

namespace strata::sched {

const char* to_string(SizeClass size_class) {
  switch (size_class) {
    case SizeClass::kExact:
      return "exact";
    case SizeClass::kPowerOfTwo:
      return "pow2";
    case SizeClass::kUniformSlot:
      return "uniform-slot";
  }
  return "?";
}

Result<uint64_t> charged_bytes(const SizeRule& rule, uint64_t bytes) {
  if (bytes == 0) return invalid_argument("a tensor of 0 bytes has no buffer size");
  // Keeps every rounding below overflow: no tensor comes near 2^62 bytes.
  constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 62;
  if (bytes > kMaxTensorBytes) return invalid_argument("tensor size above 2^62 bytes");
  switch (rule.size_class) {
    case SizeClass::kExact:
      if (!is_power_of_two(rule.alignment)) {
        return invalid_argument("exact size rule needs a power-of-two alignment");
      }
      return align_up(bytes, rule.alignment);
    case SizeClass::kPowerOfTwo:
      return next_power_of_two(align_up(bytes, kPageSize));
    case SizeClass::kUniformSlot:
      if (rule.slot_bytes == 0) return invalid_argument("uniform slot rule with 0-byte slots");
      if (bytes > rule.slot_bytes) {
        return invalid_argument("tensor of " + std::to_string(bytes) +
                                " bytes does not fit a uniform slot of " +
                                std::to_string(rule.slot_bytes) + " bytes (buffer_size too small)");
      }
      return rule.slot_bytes;
  }
  return invalid_argument("unknown size class");
}

bool better_victim(const EvictionCandidate& a, const EvictionCandidate& b) {
  if (a.next_use != b.next_use) return a.next_use > b.next_use;
  if (a.needs_cleaning != b.needs_cleaning) return !a.needs_cleaning;
  if (a.charged_bytes != b.charged_bytes) return a.charged_bytes > b.charged_bytes;
  return a.tensor < b.tensor;
}

size_t choose_victim(std::span<const EvictionCandidate> candidates, uint64_t min_next_use,
                     bool allow_cleaning) {
  size_t best = kNoVictim;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const EvictionCandidate& c = candidates[i];
    if (c.next_use < min_next_use) continue;
    if (c.needs_cleaning && !allow_cleaning) continue;
    if (best == kNoVictim || better_victim(c, candidates[best])) best = i;
  }
  return best;
}

uint32_t optimizer_lookahead(uint64_t pool_bytes, uint64_t held_pinned, uint64_t unit) {
  if (unit == 0 || held_pinned >= pool_bytes) return 1;
  const uint64_t fit = (pool_bytes - held_pinned) / unit;
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(fit > 3 ? fit - 3 : 1, 1, kMaxOptimizerLookahead));
}

bool optimizer_writes_through(uint64_t state_bytes, uint64_t pool_bytes, uint64_t held_pinned,
                              uint64_t unit) {
  if (state_bytes <= pool_bytes) return false;
  if (unit == 0 || held_pinned >= pool_bytes) return true;
  return (pool_bytes - held_pinned) / unit <= uint64_t{kMaxOptimizerLookahead} + 3;
}

bool wants_cleaning(uint64_t budget, uint64_t used, uint64_t droppable_bytes,
                    uint64_t cleaning_bytes, double headroom, uint64_t waiting_bytes) {
  if (headroom <= 0 || budget == 0) return false;
  const double want = std::max(headroom * static_cast<double>(budget),
                               static_cast<double>(std::min(waiting_bytes, budget)));
  const uint64_t free = used < budget ? budget - used : 0;
  const double have = static_cast<double>(free) + static_cast<double>(droppable_bytes) +
                      static_cast<double>(cleaning_bytes);
  return have < want;
}

}  // namespace strata::sched
