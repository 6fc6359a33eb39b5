// The pool the compared policies (pool_policy.h) run in: pinned buffers carved from a PinnedArena
// and recycled, so that `strata bench pool` measures each policy's reserved bytes and its cost per
// acquire and release in real code beside the runtime's recycler. A benchmark model, not part of
// the runtime.
//
// Each buffer is an exact-size slab: adaptive and pow2 buffers are their own arena allocations;
// zero-infinity slots are carved from one block as DeepSpeed does. Buffers never split or merge,
// so memory mapped at creation is all the pool uses (pow2 grows on demand, as the caching
// allocator it models does). try_acquire(bytes) takes a free buffer of the smallest class that
// holds `bytes`, else of the next larger class with one free. Acquire and release are a mutex (the
// recycler takes one too), a free-list pop / push and counter updates: no allocation, no system
// call (pow2 growth aside).
//
// Thread rules: any thread, concurrently. Buffers must be released before the pool is destroyed.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "memory/pinned_arena.h"
#include "pool/pool_policy.h"

namespace strata::bench {

class PoolBuffer;

struct PoolStats {
  uint64_t reserved_bytes = 0;  // pinned bytes the pool holds (4 KiB pages)
  uint64_t in_use_bytes = 0;    // bytes asked for by the buffers on loan
  uint64_t peak_in_use_bytes = 0;
  uint32_t buffers = 0;
  uint32_t buffers_in_use = 0;
  uint64_t acquires = 0;
  uint64_t borrowed = 0;  // acquires served by a larger class than the request's own
  uint64_t busy = 0;      // acquires that found no free buffer that fits
};

class BufferPool {
 public:
  // Maps every buffer of the plan up front. The arena must outlive the pool.
  static Result<std::unique_ptr<BufferPool>> create(memory::PinnedArena& arena, PoolPlan plan);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer that holds `bytes`, or an empty handle when every fitting buffer is on loan.
  // STRATA_E_INVALID when no class could ever hold `bytes`; pow2 fails as the arena does when it
  // has to grow.
  Result<PoolBuffer> try_acquire(uint64_t bytes);

  const PoolPlan& plan() const { return plan_; }
  PoolStats stats() const;

 private:
  friend class PoolBuffer;
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Slot {
    uint32_t index = 0;
    memory::PinnedBuffer memory;  // its own allocation (adaptive, pow2); empty in zero-infinity
    std::byte* data = nullptr;
    uint64_t capacity = 0;
    uint32_t size_class = 0;
    uint32_t next_free = kNone;
    bool on_loan = false;
  };
  struct ClassState {
    uint64_t slot_bytes = 0;
    uint32_t free_head = kNone;
  };

  BufferPool(memory::PinnedArena& arena, PoolPlan plan);
  Status map_buffers();
  // Called with mutex_ held. kNone when nothing fits or is free.
  uint32_t take(uint64_t bytes, bool* borrowed);
  Result<uint32_t> grow(uint64_t bytes);  // pow2
  PoolBuffer lend(uint32_t slot_index, uint64_t bytes);
  void give_back(Slot& slot, uint64_t bytes) noexcept;

  memory::PinnedArena& arena_;
  PoolPlan plan_;
  memory::PinnedBuffer zero_block_;  // zero-infinity's single block

  mutable std::mutex mutex_;
  // Guarded by mutex_; grows only for pow2. A deque: loaned buffers point at their slot, and
  // growth must not move it.
  std::deque<Slot> slots_;
  std::vector<ClassState> classes_;  // ascending slot_bytes; for pow2 one per power of two
  PoolStats stats_;                  // guarded by mutex_
};

// A buffer on loan from the pool (RAII: returned with the handle). Move-only.
class PoolBuffer {
 public:
  PoolBuffer() = default;
  PoolBuffer(PoolBuffer&& other) noexcept;
  PoolBuffer& operator=(PoolBuffer&& other) noexcept;
  PoolBuffer(const PoolBuffer&) = delete;
  PoolBuffer& operator=(const PoolBuffer&) = delete;
  ~PoolBuffer() { reset(); }

  bool valid() const { return pool_ != nullptr; }
  std::byte* data() const { return data_; }
  uint64_t size() const { return bytes_; }  // what try_acquire() asked for
  uint64_t capacity() const;                // the slot's size
  // The slot's class: an index into plan().classes (pow2: log2(capacity) - 12).
  uint32_t size_class() const;
  void reset();

 private:
  friend class BufferPool;
  BufferPool* pool_ = nullptr;
  BufferPool::Slot* slot_ = nullptr;
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace strata::bench
