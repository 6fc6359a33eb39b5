#include "pool/buffer_pool.h"

#include <algorithm>
#include <bit>

#include "common/align.h"
#include "common/assert.h"
#include "common/units.h"

namespace strata::bench {
namespace {

// pow2 classes: every power of two from a page up (smaller requests still take a page).
constexpr int kPow2MinShift = 12;
constexpr int kPow2Classes = 63 - kPow2MinShift;

uint64_t pow2_size(uint64_t bytes) {
  return std::max(next_power_of_two(bytes), kPageSize);
}

}  // namespace

// --- PoolBuffer --------------------------------------------------------------------------------

PoolBuffer::PoolBuffer(PoolBuffer&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      slot_(std::exchange(other.slot_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

PoolBuffer& PoolBuffer::operator=(PoolBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    slot_ = std::exchange(other.slot_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void PoolBuffer::reset() {
  if (pool_ != nullptr) pool_->give_back(*slot_, bytes_);
  pool_ = nullptr;
  slot_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

uint64_t PoolBuffer::capacity() const {
  return slot_ != nullptr ? slot_->capacity : 0;
}
uint32_t PoolBuffer::size_class() const {
  return slot_ != nullptr ? slot_->size_class : 0;
}

// --- BufferPool --------------------------------------------------------------------------------

Result<std::unique_ptr<BufferPool>> BufferPool::create(memory::PinnedArena& arena, PoolPlan plan) {
  std::unique_ptr<BufferPool> pool(new BufferPool(arena, std::move(plan)));
  STRATA_TRY(pool->map_buffers());
  return pool;
}

BufferPool::BufferPool(memory::PinnedArena& arena, PoolPlan plan)
    : arena_(arena), plan_(std::move(plan)) {}

BufferPool::~BufferPool() {
  // Loaned buffers point into the pool: releasing them later would touch freed memory.
  STRATA_ASSERT(stats_.buffers_in_use == 0);
}

Status BufferPool::map_buffers() {
  switch (plan_.policy) {
    case PoolPolicy::kAdaptive:
      for (const SizeClass& c : plan_.classes) {
        const auto class_index = static_cast<uint32_t>(classes_.size());
        classes_.push_back({c.slot_bytes, kNone});
        for (uint32_t i = 0; i < c.count; ++i) {
          Result<memory::PinnedBuffer> memory = arena_.allocate(c.slot_bytes);
          if (!memory.is_ok()) {
            return std::move(memory).take_status().with_context(
                "mapping the adaptive pool's buffers of " + format_bytes(c.slot_bytes));
          }
          Slot& slot = slots_.emplace_back();
          slot.index = static_cast<uint32_t>(slots_.size() - 1);
          slot.data = memory->data();
          slot.capacity = c.slot_bytes;
          slot.size_class = class_index;
          slot.memory = std::move(memory).value();
          slot.next_free = classes_[class_index].free_head;
          classes_[class_index].free_head = slot.index;
        }
      }
      break;
    case PoolPolicy::kZeroInfinity: {
      const SizeClass& c = plan_.classes.front();
      Result<memory::PinnedBuffer> block = arena_.allocate(plan_.zero_block_bytes);
      if (!block.is_ok()) {
        return std::move(block).take_status().with_context("mapping the zero-infinity block");
      }
      zero_block_ = std::move(block).value();
      classes_.push_back({c.slot_bytes, kNone});
      // Slot 0 first in the free list: DeepSpeed hands out buffers from the front.
      for (uint32_t i = c.count; i-- > 0;) {
        Slot& slot = slots_.emplace_back();
        slot.index = static_cast<uint32_t>(slots_.size() - 1);
        slot.data = zero_block_.data() + uint64_t{i} * c.slot_bytes;
        slot.capacity = c.slot_bytes;
        slot.next_free = classes_[0].free_head;
        classes_[0].free_head = slot.index;
      }
      break;
    }
    case PoolPolicy::kPow2:
      for (int shift = kPow2MinShift; shift < kPow2MinShift + kPow2Classes; ++shift) {
        classes_.push_back({uint64_t{1} << shift, kNone});
      }
      break;
  }
  stats_.buffers = static_cast<uint32_t>(slots_.size());
  stats_.reserved_bytes = zero_block_.reserved_bytes();
  for (const Slot& slot : slots_) stats_.reserved_bytes += slot.memory.reserved_bytes();
  return Status::ok();
}

uint32_t BufferPool::take(uint64_t bytes, bool* borrowed) {
  const uint64_t wanted = plan_.policy == PoolPolicy::kPow2 ? pow2_size(bytes) : bytes;
  const auto first =
      std::lower_bound(classes_.begin(), classes_.end(), wanted,
                       [](const ClassState& c, uint64_t b) { return c.slot_bytes < b; });
  for (auto it = first; it != classes_.end(); ++it) {
    if (it->free_head == kNone) continue;
    const uint32_t index = it->free_head;
    it->free_head = slots_[index].next_free;
    slots_[index].next_free = kNone;
    slots_[index].on_loan = true;
    *borrowed = it != first;
    return index;
  }
  return kNone;
}

Result<uint32_t> BufferPool::grow(uint64_t bytes) {
  // The caching allocator's miss path: pin a new block of the rounded size.
  const uint64_t size = pow2_size(bytes);
  Result<memory::PinnedBuffer> memory = arena_.allocate(size);
  if (!memory.is_ok()) return std::move(memory).take_status();
  Slot& slot = slots_.emplace_back();
  slot.index = static_cast<uint32_t>(slots_.size() - 1);
  slot.data = memory->data();
  slot.capacity = size;
  slot.size_class = static_cast<uint32_t>(std::countr_zero(size) - kPow2MinShift);
  slot.on_loan = true;
  stats_.reserved_bytes += memory->reserved_bytes();
  slot.memory = std::move(memory).value();
  ++stats_.buffers;
  return slot.index;
}

PoolBuffer BufferPool::lend(uint32_t slot_index, uint64_t bytes) {
  Slot& slot = slots_[slot_index];
  PoolBuffer buffer;
  buffer.pool_ = this;
  buffer.slot_ = &slot;
  buffer.data_ = slot.data;
  buffer.bytes_ = bytes;
  ++stats_.acquires;
  ++stats_.buffers_in_use;
  stats_.in_use_bytes += bytes;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return buffer;
}

Result<PoolBuffer> BufferPool::try_acquire(uint64_t bytes) {
  if (bytes == 0 || (plan_.policy != PoolPolicy::kPow2 &&
                     (classes_.empty() || classes_.back().slot_bytes < bytes))) {
    return invalid_argument("no buffer of the " + std::string(to_string(plan_.policy)) +
                            " pool holds " + std::to_string(bytes) + " bytes (largest: " +
                            std::to_string(classes_.empty() ? 0 : classes_.back().slot_bytes) +
                            ")");
  }
  std::lock_guard lock(mutex_);
  bool borrowed = false;
  uint32_t index = take(bytes, &borrowed);
  if (index == kNone && plan_.policy == PoolPolicy::kPow2) {
    STRATA_ASSIGN_OR_RETURN(uint32_t grown, grow(bytes));
    index = grown;
  }
  if (index == kNone) {
    ++stats_.busy;
    return PoolBuffer();
  }
  if (borrowed) ++stats_.borrowed;
  return lend(index, bytes);
}

void BufferPool::give_back(Slot& slot, uint64_t bytes) noexcept {
  std::lock_guard lock(mutex_);
  STRATA_ASSERT(slot.on_loan && stats_.buffers_in_use > 0);  // released twice otherwise
  slot.on_loan = false;
  ClassState& c = classes_[slot.size_class];
  slot.next_free = c.free_head;
  c.free_head = slot.index;
  --stats_.buffers_in_use;
  stats_.in_use_bytes -= bytes;
}

PoolStats BufferPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace strata::bench
