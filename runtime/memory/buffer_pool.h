// Pinned staging buffers for the prefetcher, carved once from the pinned arena and recycled.
//
// The pool is built from the tensors it will stage (an inventory, or bare sizes) and a policy
// (pool_policy.h). Each buffer is an exact-size slab: strata and pow2 buffers are their own arena
// allocations (so each is one I/O fixed buffer when <= 1 GiB); zero-infinity slots are carved from
// one block as DeepSpeed does. Buffers never split or merge, so the pool cannot fragment: memory
// mapped at creation is all the memory it will ever use (pow2 grows on demand, as the caching
// allocator it models does).
//
// acquire(bytes) takes a free buffer of the smallest class that holds `bytes`, else of the next
// larger class with one free (borrowing, which the strata plan counts on). Acquire and release are
// a mutex, a free-list pop / push and counter updates: no allocation, no system call (pow2 growth
// aside). Tensors outside the inventory use allocate_exact(), a separate arena allocation of
// exactly their size.
//
// Thread rules: any thread, concurrently. Buffers must be released before the pool is destroyed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/status.h"
#include "memory/pinned_arena.h"
#include "memory/pool_policy.h"

namespace strata::memory {

class PoolBuffer;

struct PoolStats {
  uint64_t reserved_bytes = 0;  // pinned bytes the pool holds (4 KiB pages)
  uint64_t in_use_bytes = 0;    // bytes asked for by the buffers on loan
  uint64_t peak_in_use_bytes = 0;
  uint32_t buffers = 0;
  uint32_t buffers_in_use = 0;
  uint64_t acquires = 0;
  uint64_t borrowed = 0;  // acquires served by a larger class than the tensor's own
  uint64_t busy = 0;      // acquires that found no free buffer that fits
};

class BufferPool {
 public:
  // Plans (pool_policy.h) and maps every buffer up front. The pool keeps a pointer to the arena,
  // which must outlive it.
  static Result<std::unique_ptr<BufferPool>> create(PinnedArena& arena,
                                                    std::span<const StagedTensor> tensors,
                                                    const PoolOptions& options);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer that holds `bytes`, or an empty handle when every fitting buffer is on loan (the
  // caller waits for a release). STRATA_E_INVALID when no class could ever hold `bytes` (use
  // allocate_exact); pow2 may also fail as the arena does when it has to grow.
  Result<PoolBuffer> try_acquire(uint64_t bytes, TensorKind kind);
  // Waits up to `timeout` for a buffer: STRATA_E_TIMEOUT when none was released in time.
  Result<PoolBuffer> acquire(uint64_t bytes, TensorKind kind, std::chrono::nanoseconds timeout);
  // Whether some class can hold `bytes` (always true for pow2).
  bool fits(uint64_t bytes) const;

  // The generic exact-size path for tensors not in the inventory: its own pinned allocation.
  Result<PinnedBuffer> allocate_exact(uint64_t bytes, TensorKind kind);

  PoolPolicy policy() const { return plan_.policy; }
  const PoolPlan& plan() const { return plan_; }
  PoolStats stats() const;

 private:
  friend class PoolBuffer;
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Slot {
    uint32_t index = 0;
    PinnedBuffer memory;  // its own allocation (strata, pow2); empty for zero-infinity slots
    std::byte* data = nullptr;
    uint64_t capacity = 0;
    uint64_t block_offset = 0;  // zero-infinity: where the slot starts in the block
    uint32_t size_class = 0;
    uint32_t next_free = kNone;
    bool on_loan = false;
  };
  struct ClassState {
    uint64_t slot_bytes = 0;
    uint32_t free_head = kNone;
  };

  BufferPool(PinnedArena& arena, PoolPlan plan);
  Status map_buffers();
  // Called with mutex_ held. kNone when nothing fits or is free.
  uint32_t take(uint64_t bytes, bool* borrowed);
  Result<PoolBuffer> acquire_locked(uint64_t bytes, TensorKind kind);
  Status check_fits(uint64_t bytes) const;
  Result<uint32_t> grow(uint64_t bytes);  // pow2
  PoolBuffer lend(uint32_t slot_index, uint64_t bytes, TensorKind kind);
  void give_back(Slot& slot, uint64_t bytes, TensorKind kind) noexcept;

  PinnedArena& arena_;
  PoolPlan plan_;
  PinnedBuffer zero_block_;  // zero-infinity's single block

  mutable std::mutex mutex_;
  std::condition_variable released_;
  // Guarded by mutex_; grows only for pow2. A deque: loaned buffers point at their slot, and
  // growth must not move it.
  std::deque<Slot> slots_;
  std::vector<ClassState> classes_;  // ascending slot_bytes; for pow2 one per power of two
  PoolStats stats_;                  // guarded by mutex_
  uint64_t releases_ = 0;            // guarded by mutex_; lets acquire() wait without missing one
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
  uint64_t size() const { return bytes_; }  // what acquire() asked for
  uint64_t capacity() const;                // the slot's size
  // The slot's class: an index into plan().classes (pow2: log2(capacity) - 12).
  uint32_t size_class() const;
  // Fixed-buffer index for I/O on [offset, offset + length) of this buffer, or -1.
  int32_t io_buffer_index(uint64_t offset, uint64_t length) const;
  void reset();

 private:
  friend class BufferPool;
  BufferPool* pool_ = nullptr;
  BufferPool::Slot* slot_ = nullptr;
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
  TensorKind kind_ = TensorKind::kOther;
};

}  // namespace strata::memory
