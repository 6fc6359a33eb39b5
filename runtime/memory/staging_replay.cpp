#include "memory/staging_replay.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace strata::memory {

Result<ReplayResult> replay_step(BufferPool& pool, std::span<const StagedTensor> tensors,
                                 std::span<const Window> windows, const ReplayOptions& options) {
  ReplayResult r;
  std::vector<PoolBuffer> held(tensors.size());
  std::vector<uint8_t> wanted(tensors.size(), 0);
  std::vector<uint8_t> waiting_flag(tensors.size(), 0);
  std::vector<uint32_t> waiting;  // in arrival order
  std::vector<uint32_t> still;

  auto verify = [&](uint32_t i) -> Status {
    if (!options.verify_data || !held[i].valid()) return Status::ok();
    uint32_t seen = 0;
    std::memcpy(&seen, held[i].data(), sizeof seen);
    if (seen == i) return Status::ok();
    return Status::error(STRATA_E_CORRUPT, "tensor " + std::to_string(i) +
                                               "'s buffer was overwritten by tensor " +
                                               std::to_string(seen));
  };

  for (const Window& w : windows) {
    std::fill(wanted.begin(), wanted.end(), 0);
    for (uint32_t i : w.tensors) wanted[i] = 1;
    for (uint32_t i = 0; i < tensors.size(); ++i) {
      if (wanted[i] || !held[i].valid()) continue;
      STRATA_TRY(verify(i));
      held[i].reset();
    }
    std::erase_if(waiting, [&](uint32_t i) {
      if (wanted[i]) return false;
      waiting_flag[i] = 0;
      return true;
    });
    for (uint32_t i : w.tensors) {
      if (held[i].valid() || waiting_flag[i]) continue;
      waiting_flag[i] = 1;
      waiting.push_back(i);
    }
    still.clear();
    for (uint32_t i : waiting) {
      Result<PoolBuffer> b = pool.try_acquire(tensors[i].bytes, tensors[i].kind);
      if (!b.is_ok()) return std::move(b).take_status();
      ++r.acquires;
      if (!b->valid()) {
        ++r.deferred;
        still.push_back(i);
        continue;
      }
      waiting_flag[i] = 0;
      if (options.verify_data) std::memcpy(b->data(), &i, sizeof i);
      held[i] = std::move(b).value();
    }
    waiting.swap(still);

    uint64_t in_flight = 0;
    for (uint32_t i : w.tensors) {
      if (held[i].valid()) in_flight += tensors[i].bytes;
    }
    r.peak_in_flight_bytes = std::max(r.peak_in_flight_bytes, in_flight);
    // The first visit's tensors are computed on now: all of them must be staged.
    for (uint32_t n = 0; n < w.first_visit_tensors; ++n) {
      if (!held[w.tensors[n]].valid()) {
        ++r.unstaged_at_use;
        break;
      }
    }
  }
  for (uint32_t i = 0; i < tensors.size(); ++i) STRATA_TRY(verify(i));
  return r;
}

}  // namespace strata::memory
