// Drives a BufferPool through the windows of a training step the way the prefetcher does, to
// measure a policy on the exact same sequence of acquires and releases as the others: on moving
// to the next window, release the tensors that left it, then acquire the ones that entered it, in
// order; an acquire that finds no free buffer waits for a later release (it is retried after each
// window's releases). Used by `strata bench pool` and by the pool's tests.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "memory/buffer_pool.h"
#include "memory/staging.h"

namespace strata::memory {

struct ReplayResult {
  uint64_t acquires = 0;
  uint64_t deferred = 0;         // acquires that found no buffer and had to wait
  uint64_t unstaged_at_use = 0;  // windows whose first visit ran with a tensor still waiting
  uint64_t peak_in_flight_bytes = 0;
};

struct ReplayOptions {
  // Writes each tensor's index into its buffer and checks it is still there before the buffer
  // is released: catches two tensors sharing memory. Touches the memory (tests only).
  bool verify_data = false;
};

// STRATA_E_INVALID when a tensor fits no buffer of the pool; STRATA_E_CORRUPT when verification
// finds a buffer overwritten.
Result<ReplayResult> replay_step(BufferPool& pool, std::span<const StagedTensor> tensors,
                                 std::span<const Window> windows,
                                 const ReplayOptions& options = {});

}  // namespace strata::memory
