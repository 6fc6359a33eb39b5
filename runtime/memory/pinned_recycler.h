// Exact-size pinned buffers, recycled.
//
// A training step asks for the same buffer sizes every step, and a fresh pinned allocation is
// expensive: mmap, clearing every page, mlock, GPU and io_uring registration, and the reverse on
// free, all paid on the scheduler's path. The recycler keeps what is
// given back, by exact (page-rounded) size, and hands it to the next request of that size, so
// sizes stay exact (no power-of-two rounding) and steady-state steps make no system call.
//
// Kept buffers stay inside the arena's hard budget: when a new size does not fit beside them,
// kept buffers are unmapped, those of other sizes first, until it does. Kept memory counts as
// pinned "reserved" (the arena maps it), never as "in use" (the scheduler charges only what a
// tensor holds).
//
// A buffer's GPU registration (cudaHostRegister, through the arena's Device) and its io_uring
// fixed-buffer registration happen once, when it is mapped; a recycled buffer keeps both, so only
// a step that asks for a size not seen before pays them. With STRATA_PINNED_TRACE set, every take
// and give-back is written to that file (pinned_trace.h) for `strata bench pool --trace`.
//
// Thread rules: any thread, concurrently. Must not outlive its arena.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "memory/pinned_arena.h"
#include "memory/pinned_trace.h"
#include "vocabulary/tensor_spec.h"

namespace strata::memory {

struct PinnedRecyclerStats {
  uint64_t taken = 0;         // buffers handed out
  uint64_t reused = 0;        // of which recycled
  uint64_t trimmed = 0;       // kept buffers unmapped to make room for another size
  uint64_t mapped_bytes = 0;  // reserved bytes of the takes that mapped a new buffer
  uint64_t kept_bytes = 0;    // reserved bytes kept now
  uint32_t kept_buffers = 0;
};

class PinnedRecycler {
 public:
  // Records to STRATA_PINNED_TRACE when it is set.
  explicit PinnedRecycler(PinnedArena& arena)
      : PinnedRecycler(arena, PinnedTraceWriter::from_environment(arena.budget_bytes())) {}
  // Records to `trace` (may be nullptr: no recording).
  PinnedRecycler(PinnedArena& arena, std::unique_ptr<PinnedTraceWriter> trace)
      : arena_(arena), trace_(std::move(trace)) {}
  ~PinnedRecycler() = default;
  PinnedRecycler(const PinnedRecycler&) = delete;
  PinnedRecycler& operator=(const PinnedRecycler&) = delete;

  // A buffer of at least `bytes` whose reserved size is `bytes` rounded up to 4 KiB, for a tensor
  // of `kind` (recorded in the trace, nothing else: what is in use is the scheduler's record).
  // STRATA_E_PINNED_BUDGET (the arena's message) when it cannot fit even with nothing kept.
  Result<PinnedBuffer> take(uint64_t bytes, TensorKind kind);
  // Keeps a buffer taken from this recycler for the next take of its size.
  void give_back(PinnedBuffer buffer, TensorKind kind);
  // Unmaps every kept buffer.
  void trim();

  PinnedRecyclerStats stats() const;

 private:
  // Unmaps kept buffers, other sizes than `keep_size` first, until `bytes` more fit the budget
  // or nothing is kept. Returns whether anything was unmapped.
  bool make_room(uint64_t bytes, uint64_t keep_size);

  PinnedArena& arena_;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, std::vector<PinnedBuffer>> kept_;  // by reserved size
  PinnedRecyclerStats stats_;                                     // guarded by mutex_
  const std::unique_ptr<PinnedTraceWriter> trace_;                // may be nullptr
};

}  // namespace strata::memory
