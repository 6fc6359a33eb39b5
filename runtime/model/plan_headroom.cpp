#include "model/plan_headroom.h"

#include <cmath>

#include "common/align.h"

namespace strata {

uint64_t recommended_host_bytes(uint64_t job_bytes, const HostHeadroom& headroom) {
  // Rounded to the nearest byte first: 1.1 is not exact in binary, and a stray byte would add
  // a MiB.
  const auto with_margin =
      static_cast<uint64_t>(std::llround(static_cast<double>(job_bytes) * (1 + headroom.fraction)));
  return align_up(with_margin + headroom.reserve_bytes, uint64_t{1} << 20);
}

uint64_t usable_host_bytes(uint64_t host_ram_bytes, const HostHeadroom& headroom) {
  // The recommended figure is whole MiB: a RAM that is not would otherwise leave a pool whose
  // recommendation, rounded up, passes it by a fraction of a MiB (and the plan not fit).
  const uint64_t whole = align_down(host_ram_bytes, uint64_t{1} << 20);
  if (whole <= headroom.reserve_bytes) return 0;
  const double usable =
      static_cast<double>(whole - headroom.reserve_bytes) / (1 + headroom.fraction);
  uint64_t pool = align_down(static_cast<uint64_t>(usable), kPageSize);
  // The division's rounding can leave it a page over.
  while (pool >= kPageSize && recommended_host_bytes(pool, headroom) > host_ram_bytes) {
    pool -= kPageSize;
  }
  return pool;
}

}  // namespace strata
