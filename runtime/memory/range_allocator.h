// Carves one contiguous slab (a device's memory) into aligned ranges. Used by both device
// backends. All metadata is allocated once, in the constructor: allocate and free never touch the
// host heap, so they are safe on hot paths and under a framework's allocator hook.
//
// Layout: every range (allocated or free) is a block in an address-ordered doubly linked list;
// free blocks also sit in one of 256 segregated lists (TLSF-style: a power-of-two range split in
// four), with a bitmap of non-empty lists. allocate() takes the best fit from the smallest list
// that can hold the request, splits off the rest, and free() merges with free neighbours, so free
// space never fragments into adjacent pieces. A fixed-capacity open-addressing table maps an
// allocation's offset to its block for free().
//
// Not thread-safe: the owner serialises calls (one mutex per device).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace strata::memory {

class RangeAllocator {
 public:
  // capacity: slab bytes; alignment: power of two; max_allocations: live allocations at once
  // (allocate() fails beyond it even when space is left).
  RangeAllocator(uint64_t capacity, uint64_t alignment, uint32_t max_allocations);

  struct Freed {
    uint64_t bytes = 0;        // the allocation's (aligned) size
    uint64_t tag = 0;          // what allocate() was given
    uint64_t free_offset = 0;  // the free range it now belongs to, after merging
    uint64_t free_bytes = 0;
  };

  // Offset of a range of at least `bytes` (rounded up to the alignment), or nullopt. The tag is
  // the caller's (e.g. the requested size and tensor kind), given back by free() and tag_at().
  std::optional<uint64_t> allocate(uint64_t bytes, uint64_t tag = 0);
  // Frees the allocation that starts at offset; nullopt when there is none.
  std::optional<Freed> free(uint64_t offset);
  // Aligned size / tag of the allocation starting at offset, or 0.
  uint64_t size_at(uint64_t offset) const;
  uint64_t tag_at(uint64_t offset) const;

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t allocated_bytes() const { return allocated_bytes_; }
  uint32_t allocations() const { return allocations_; }
  uint32_t max_allocations() const { return max_allocations_; }
  uint64_t largest_free_range() const;
  // (offset, tag) of every live allocation, in no particular order. Allocates; for teardown.
  std::vector<std::pair<uint64_t, uint64_t>> live() const;

  // Walks the block list and checks every invariant (for tests): blocks tile the slab, no two free
  // neighbours, bins hold exactly the free blocks, counters match.
  bool check_invariants() const;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static constexpr int kBins = 256;

  struct Block {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint64_t tag = 0;
    uint32_t prev = kNone;  // address order
    uint32_t next = kNone;
    uint32_t bin_prev = kNone;  // free list of its bin (free blocks only)
    uint32_t bin_next = kNone;
    bool free = false;
  };

  static int bin_of(uint64_t size);
  uint32_t new_block();
  void delete_block(uint32_t index);
  void bin_insert(uint32_t index);
  void bin_remove(uint32_t index);
  void table_insert(uint64_t offset, uint32_t block);
  uint32_t table_find(uint64_t offset) const;
  void table_erase(uint64_t offset);

  uint64_t capacity_;
  uint64_t alignment_;
  uint32_t max_allocations_;
  uint64_t allocated_bytes_ = 0;
  uint32_t allocations_ = 0;

  std::vector<Block> blocks_;
  std::vector<uint32_t> unused_blocks_;  // a stack of indices into blocks_
  std::array<uint32_t, kBins> bin_heads_;
  std::array<uint64_t, kBins / 64> bin_bitmap_{};

  // offset -> block index for live allocations; linear probing, backward-shift deletion.
  struct Slot {
    uint64_t offset = UINT64_MAX;
    uint32_t block = kNone;
  };
  std::vector<Slot> table_;
  uint64_t table_mask_ = 0;
};

}  // namespace strata::memory
