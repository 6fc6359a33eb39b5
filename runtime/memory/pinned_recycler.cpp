#include "memory/pinned_recycler.h"

#include <chrono>
#include <utility>

#include "common/align.h"
#include "common/assert.h"

namespace strata::memory {

Result<PinnedBuffer> PinnedRecycler::take(uint64_t bytes, TensorKind kind) {
  if (bytes == 0) return invalid_argument("pinned recycler: zero bytes");
  const uint64_t size = align_up(bytes, kPageSize);
  const auto start =
      trace_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  bool reused = false;
  PinnedBuffer buffer;
  {
    std::lock_guard lock(mutex_);
    ++stats_.taken;
    auto it = kept_.find(size);
    if (it != kept_.end() && !it->second.empty()) {
      buffer = std::move(it->second.back());
      it->second.pop_back();
      ++stats_.reused;
      reused = true;
      --stats_.kept_buffers;
      stats_.kept_bytes -= size;
    }
  }
  if (!buffer.valid()) {
    // The number of retries is bounded: each one unmapped at least one kept buffer.
    for (;;) {
      Result<PinnedBuffer> mapped = arena_.allocate(size);
      if (mapped) {
        buffer = std::move(mapped.value());
        break;
      }
      if (mapped.status().code() != STRATA_E_PINNED_BUDGET || !make_room(size, size)) {
        return std::move(mapped).take_status();
      }
    }
  }
  STRATA_ASSERT(buffer.reserved_bytes() == size);
  if (!reused) {
    std::lock_guard lock(mutex_);
    stats_.mapped_bytes += size;
  }
  if (trace_) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start);
    trace_->record({PinnedTraceEvent::Op::kTake, reinterpret_cast<uintptr_t>(buffer.data()), bytes,
                    size, kind, reused, static_cast<uint64_t>(ns.count())});
  }
  return buffer;
}

void PinnedRecycler::give_back(PinnedBuffer buffer, TensorKind kind) {
  STRATA_ASSERT(buffer.valid());
  const uint64_t size = buffer.reserved_bytes();
  if (trace_) {
    trace_->record({PinnedTraceEvent::Op::kGive, reinterpret_cast<uintptr_t>(buffer.data()), 0,
                    size, kind, false, 0});
  }
  std::lock_guard lock(mutex_);
  kept_[size].push_back(std::move(buffer));
  ++stats_.kept_buffers;
  stats_.kept_bytes += size;
}

bool PinnedRecycler::make_room(uint64_t bytes, uint64_t keep_size) {
  // Unmapping happens outside the lock: it is the slow part (munlock, munmap, unregistration).
  std::vector<PinnedBuffer> doomed;
  {
    std::lock_guard lock(mutex_);
    const PinnedArenaStats arena = arena_.stats();
    const uint64_t budget = arena.budget_bytes;
    uint64_t need =
        arena.reserved_bytes + bytes > budget ? arena.reserved_bytes + bytes - budget : 0;
    if (need == 0) need = bytes;  // another thread raced us to the room: free some anyway
    for (int pass = 0; pass < 2 && need > 0; ++pass) {
      for (auto& [size, buffers] : kept_) {
        if (pass == 0 && size == keep_size) continue;
        while (!buffers.empty() && need > 0) {
          doomed.push_back(std::move(buffers.back()));
          buffers.pop_back();
          need = need > size ? need - size : 0;
          --stats_.kept_buffers;
          stats_.kept_bytes -= size;
          ++stats_.trimmed;
        }
      }
    }
  }
  return !doomed.empty();
}

void PinnedRecycler::trim() {
  std::unordered_map<uint64_t, std::vector<PinnedBuffer>> doomed;
  std::lock_guard lock(mutex_);
  doomed.swap(kept_);
  stats_.trimmed += stats_.kept_buffers;
  stats_.kept_buffers = 0;
  stats_.kept_bytes = 0;
}

PinnedRecyclerStats PinnedRecycler::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace strata::memory
