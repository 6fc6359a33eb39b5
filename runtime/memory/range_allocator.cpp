#include "memory/range_allocator.h"

#include <bit>

#include "common/align.h"
#include "common/assert.h"

namespace strata::memory {

RangeAllocator::RangeAllocator(uint64_t capacity, uint64_t alignment, uint32_t max_allocations)
    : capacity_(align_down(capacity, alignment)),
      alignment_(alignment),
      max_allocations_(max_allocations) {
  STRATA_ASSERT(is_power_of_two(alignment));
  STRATA_ASSERT(max_allocations > 0);
  // Each allocation splits at most one free block in two, so blocks <= 2 * allocations + 1.
  const uint64_t block_capacity = 2ull * max_allocations + 2;
  blocks_.resize(block_capacity);
  unused_blocks_.reserve(block_capacity);
  for (uint64_t i = block_capacity; i-- > 0;) unused_blocks_.push_back(static_cast<uint32_t>(i));
  bin_heads_.fill(kNone);
  // Load factor <= 1/2 keeps linear probing short.
  table_.resize(std::max<uint64_t>(16, next_power_of_two(2ull * max_allocations)));
  table_mask_ = table_.size() - 1;

  if (capacity_ > 0) {
    const uint32_t all = new_block();
    blocks_[all].offset = 0;
    blocks_[all].size = capacity_;
    blocks_[all].free = true;
    bin_insert(all);
  }
}

int RangeAllocator::bin_of(uint64_t size) {
  STRATA_ASSERT(size > 0);
  const int msb = 63 - std::countl_zero(size);
  const int sub = msb >= 2 ? static_cast<int>((size >> (msb - 2)) & 3) : 0;
  return msb * 4 + sub;
}

uint32_t RangeAllocator::new_block() {
  STRATA_ASSERT(!unused_blocks_.empty());
  const uint32_t index = unused_blocks_.back();
  unused_blocks_.pop_back();
  blocks_[index] = Block{};
  return index;
}

void RangeAllocator::delete_block(uint32_t index) {
  unused_blocks_.push_back(index);
}

void RangeAllocator::bin_insert(uint32_t index) {
  Block& b = blocks_[index];
  const int bin = bin_of(b.size);
  b.bin_prev = kNone;
  b.bin_next = bin_heads_[bin];
  if (b.bin_next != kNone) blocks_[b.bin_next].bin_prev = index;
  bin_heads_[bin] = index;
  bin_bitmap_[bin / 64] |= uint64_t{1} << (bin % 64);
}

void RangeAllocator::bin_remove(uint32_t index) {
  Block& b = blocks_[index];
  const int bin = bin_of(b.size);
  if (b.bin_prev != kNone) {
    blocks_[b.bin_prev].bin_next = b.bin_next;
  } else {
    bin_heads_[bin] = b.bin_next;
  }
  if (b.bin_next != kNone) blocks_[b.bin_next].bin_prev = b.bin_prev;
  if (bin_heads_[bin] == kNone) bin_bitmap_[bin / 64] &= ~(uint64_t{1} << (bin % 64));
  b.bin_prev = b.bin_next = kNone;
}

std::optional<uint64_t> RangeAllocator::allocate(uint64_t bytes, uint64_t tag) {
  if (bytes == 0 || bytes > capacity_ || allocations_ == max_allocations_) return std::nullopt;
  const uint64_t size = align_up(bytes, alignment_);

  // The request's own bin may hold blocks smaller than it: look for the first that fits.
  uint32_t found = kNone;
  const int first_bin = bin_of(size);
  for (uint32_t i = bin_heads_[first_bin]; i != kNone; i = blocks_[i].bin_next) {
    if (blocks_[i].size >= size) {
      found = i;
      break;
    }
  }
  // Any block of a higher bin fits; take the lowest non-empty one.
  for (int bin = first_bin + 1; found == kNone && bin < kBins;) {
    const uint64_t word = bin_bitmap_[bin / 64] & (~uint64_t{0} << (bin % 64));
    if (word != 0) {
      found = bin_heads_[(bin / 64) * 64 + std::countr_zero(word)];
    } else {
      bin = (bin / 64 + 1) * 64;
    }
  }
  if (found == kNone) return std::nullopt;

  bin_remove(found);
  Block& b = blocks_[found];
  if (b.size > size) {
    // Split: the tail stays free.
    const uint32_t tail = new_block();
    Block& t = blocks_[tail];
    Block& head = blocks_[found];  // blocks_ never reallocates, but keep the reference explicit
    t.offset = head.offset + size;
    t.size = head.size - size;
    t.free = true;
    t.prev = found;
    t.next = head.next;
    if (head.next != kNone) blocks_[head.next].prev = tail;
    head.next = tail;
    head.size = size;
    bin_insert(tail);
  }
  blocks_[found].free = false;
  blocks_[found].tag = tag;
  table_insert(blocks_[found].offset, found);
  allocated_bytes_ += size;
  ++allocations_;
  return blocks_[found].offset;
}

std::optional<RangeAllocator::Freed> RangeAllocator::free(uint64_t offset) {
  uint32_t index = table_find(offset);
  if (index == kNone) return std::nullopt;
  table_erase(offset);
  Freed freed;
  freed.bytes = blocks_[index].size;
  freed.tag = blocks_[index].tag;
  allocated_bytes_ -= freed.bytes;
  --allocations_;

  blocks_[index].free = true;
  // Merge with the next block, then with the previous one.
  if (const uint32_t next = blocks_[index].next; next != kNone && blocks_[next].free) {
    bin_remove(next);
    blocks_[index].size += blocks_[next].size;
    blocks_[index].next = blocks_[next].next;
    if (blocks_[next].next != kNone) blocks_[blocks_[next].next].prev = index;
    delete_block(next);
  }
  if (const uint32_t prev = blocks_[index].prev; prev != kNone && blocks_[prev].free) {
    bin_remove(prev);
    blocks_[prev].size += blocks_[index].size;
    blocks_[prev].next = blocks_[index].next;
    if (blocks_[index].next != kNone) blocks_[blocks_[index].next].prev = prev;
    delete_block(index);
    index = prev;
  }
  bin_insert(index);
  freed.free_offset = blocks_[index].offset;
  freed.free_bytes = blocks_[index].size;
  return freed;
}

uint64_t RangeAllocator::size_at(uint64_t offset) const {
  const uint32_t index = table_find(offset);
  return index == kNone ? 0 : blocks_[index].size;
}

uint64_t RangeAllocator::tag_at(uint64_t offset) const {
  const uint32_t index = table_find(offset);
  return index == kNone ? 0 : blocks_[index].tag;
}

uint64_t RangeAllocator::largest_free_range() const {
  for (int word = kBins / 64 - 1; word >= 0; --word) {
    if (bin_bitmap_[word] == 0) continue;
    const int bin = word * 64 + 63 - std::countl_zero(bin_bitmap_[word]);
    uint64_t largest = 0;
    for (uint32_t i = bin_heads_[bin]; i != kNone; i = blocks_[i].bin_next) {
      largest = std::max(largest, blocks_[i].size);
    }
    return largest;
  }
  return 0;
}

std::vector<std::pair<uint64_t, uint64_t>> RangeAllocator::live() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const Slot& slot : table_) {
    if (slot.block != kNone) out.emplace_back(slot.offset, blocks_[slot.block].tag);
  }
  return out;
}

// --- offset table ------------------------------------------------------------------------------

namespace {
uint64_t hash_offset(uint64_t offset) {
  return (offset >> 8) * 0x9E3779B97F4A7C15ull;
}
}  // namespace

void RangeAllocator::table_insert(uint64_t offset, uint32_t block) {
  uint64_t i = hash_offset(offset) & table_mask_;
  while (table_[i].block != kNone) i = (i + 1) & table_mask_;
  table_[i] = {offset, block};
}

uint32_t RangeAllocator::table_find(uint64_t offset) const {
  for (uint64_t i = hash_offset(offset) & table_mask_;; i = (i + 1) & table_mask_) {
    if (table_[i].block == kNone) return kNone;
    if (table_[i].offset == offset) return table_[i].block;
  }
}

void RangeAllocator::table_erase(uint64_t offset) {
  uint64_t i = hash_offset(offset) & table_mask_;
  while (table_[i].offset != offset) i = (i + 1) & table_mask_;
  // Backward-shift deletion: move later entries of the probe run into the hole so that lookups
  // never need tombstones.
  for (uint64_t j = (i + 1) & table_mask_; table_[j].block != kNone; j = (j + 1) & table_mask_) {
    const uint64_t home = hash_offset(table_[j].offset) & table_mask_;
    // Entry j may move to i when its home is not inside the cyclic range (i, j].
    const bool home_in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!home_in_range) {
      table_[i] = table_[j];
      i = j;
    }
  }
  table_[i] = Slot{};
}

bool RangeAllocator::check_invariants() const {
  uint64_t expected_offset = 0;
  uint64_t allocated = 0;
  uint32_t live = 0;
  uint32_t free_blocks = 0;
  uint32_t previous = kNone;
  bool previous_free = false;
  // The first block has offset 0 and no predecessor; find it by walking back from any block in
  // the list. Simplest: it is the one whose prev is kNone among used blocks.
  uint32_t first = kNone;
  std::vector<bool> unused(blocks_.size(), false);
  for (uint32_t u : unused_blocks_) unused[u] = true;
  for (uint32_t i = 0; i < blocks_.size(); ++i) {
    if (!unused[i] && blocks_[i].prev == kNone) {
      if (first != kNone) return false;  // two list heads
      first = i;
    }
  }
  for (uint32_t i = first; i != kNone; i = blocks_[i].next) {
    const Block& b = blocks_[i];
    if (b.offset != expected_offset || b.size == 0 || b.prev != previous) return false;
    if (b.offset % alignment_ != 0 || b.size % alignment_ != 0) return false;
    if (b.free && previous_free) return false;  // unmerged neighbours
    if (b.free) {
      ++free_blocks;
    } else {
      allocated += b.size;
      ++live;
      if (table_find(b.offset) != i) return false;
    }
    expected_offset += b.size;
    previous = i;
    previous_free = b.free;
  }
  if (expected_offset != capacity_ || allocated != allocated_bytes_ || live != allocations_) {
    return false;
  }
  uint32_t binned = 0;
  for (int bin = 0; bin < kBins; ++bin) {
    const bool marked = (bin_bitmap_[bin / 64] >> (bin % 64)) & 1;
    if (marked != (bin_heads_[bin] != kNone)) return false;
    for (uint32_t i = bin_heads_[bin]; i != kNone; i = blocks_[i].bin_next) {
      if (!blocks_[i].free || bin_of(blocks_[i].size) != bin) return false;
      ++binned;
    }
  }
  return binned == free_blocks;
}

}  // namespace strata::memory
