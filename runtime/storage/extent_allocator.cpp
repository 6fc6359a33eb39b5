#include "storage/extent_allocator.h"

#include <iterator>

#include "common/align.h"
#include "common/assert.h"
#include "common/units.h"

namespace strata::storage {

Result<ExtentAllocator> ExtentAllocator::create(uint64_t capacity, uint64_t unit,
                                                uint64_t max_extents) {
  if (!is_power_of_two(unit)) {
    return invalid_argument("extent allocator: unit " + std::to_string(unit) +
                            " is not a power of two");
  }
  if (align_down(capacity, unit) == 0) {
    return invalid_argument("extent allocator: capacity " + std::to_string(capacity) +
                            " bytes is less than one unit of " + std::to_string(unit));
  }
  if (max_extents == 0) return invalid_argument("extent allocator: max_extents is 0");
  return ExtentAllocator(capacity, unit, max_extents);
}

ExtentAllocator::ExtentAllocator(uint64_t capacity, uint64_t unit, uint64_t max_extents)
    : capacity_(align_down(capacity, unit)), unit_(unit), max_extents_(max_extents) {
  STRATA_ASSERT(is_power_of_two(unit_));
  STRATA_ASSERT(capacity_ > 0);
  insert_free(0, capacity_);
}

uint64_t ExtentAllocator::reserved_length(uint64_t bytes) const {
  // Callers reject bytes > capacity first, so this cannot overflow.
  return align_up(bytes, unit_);
}

void ExtentAllocator::insert_free(uint64_t offset, uint64_t length) {
  STRATA_ASSERT(length > 0);
  const bool inserted_offset = free_by_offset_.emplace(offset, length).second;
  const bool inserted_size = free_by_size_.emplace(length, offset).second;
  STRATA_ASSERT(inserted_offset && inserted_size);
  free_bytes_ += length;
}

void ExtentAllocator::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
  const size_t erased = free_by_size_.erase({it->second, it->first});
  STRATA_ASSERT(erased == 1);
  free_bytes_ -= it->second;
  free_by_offset_.erase(it);
}

Status ExtentAllocator::out_of_space(uint64_t length) const {
  const uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  // The two cases call for different remedies (a larger tier vs. freeing or compacting), so the
  // message names which one this is.
  if (free_bytes_ >= length) {
    return Status::error(STRATA_E_NOSPACE,
                         "NVMe tier fragmented: requested " + format_bytes(length) +
                             ", largest free extent " + format_bytes(largest) + ", total free " +
                             format_bytes(free_bytes_) + " in " +
                             std::to_string(free_by_offset_.size()) +
                             " free extents; raise nvme_capacity_bytes (strata_config)");
  }
  return Status::error(STRATA_E_NOSPACE, "NVMe tier full: requested " + format_bytes(length) +
                                             ", largest free extent " + format_bytes(largest) +
                                             ", total free " + format_bytes(free_bytes_) + " of " +
                                             format_bytes(capacity_) +
                                             "; raise nvme_capacity_bytes (strata_config) or "
                                             "unregister tensors");
}

Result<uint64_t> ExtentAllocator::allocate(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("extent allocator: cannot allocate 0 bytes");
  if (bytes > capacity_) return out_of_space(bytes);
  if (allocated_.size() >= max_extents_) {
    return Status::error(STRATA_E_LIMIT, "extent allocator: " + std::to_string(max_extents_) +
                                             " extents already allocated (the configured limit)");
  }
  const uint64_t length = reserved_length(bytes);

  const auto best = free_by_size_.lower_bound({length, 0});
  if (best == free_by_size_.end()) return out_of_space(length);
  const uint64_t free_length = best->first;
  const uint64_t offset = best->second;
  STRATA_ASSERT(free_length >= length);

  if (free_length == length) {
    const auto by_offset = free_by_offset_.find(offset);
    STRATA_ASSERT(by_offset != free_by_offset_.end());
    erase_free(by_offset);
  } else {
    // Keep the tail free. Re-keying the extracted nodes in place avoids a free/malloc pair per
    // split on a path the scheduler takes for every tensor it spills.
    auto size_node = free_by_size_.extract(best);
    size_node.value() = {free_length - length, offset + length};
    free_by_size_.insert(std::move(size_node));
    auto offset_node = free_by_offset_.extract(offset);
    STRATA_ASSERT(!offset_node.empty());
    offset_node.key() = offset + length;
    offset_node.mapped() = free_length - length;
    free_by_offset_.insert(std::move(offset_node));
    free_bytes_ -= length;
  }
  const bool inserted = allocated_.emplace(offset, length).second;
  STRATA_ASSERT(inserted);
  return offset;
}

Status ExtentAllocator::free(uint64_t offset, uint64_t length) {
  const auto live = allocated_.find(offset);
  if (live == allocated_.end()) {
    return Status::error(STRATA_E_STATE, "extent allocator: free of [" + std::to_string(offset) +
                                             ", +" + std::to_string(length) +
                                             ") which is not allocated (double free?)");
  }
  if (live->second != length) {
    return Status::error(STRATA_E_STATE, "extent allocator: free of [" + std::to_string(offset) +
                                             ", +" + std::to_string(length) +
                                             ") but the extent allocated there has " +
                                             std::to_string(live->second) + " bytes");
  }
  allocated_.erase(live);

  uint64_t start = offset;
  uint64_t end = offset + length;
  auto next = free_by_offset_.lower_bound(offset);
  // An allocated range never overlaps a free one; if it did, the indexes are already corrupt.
  STRATA_ASSERT(next == free_by_offset_.end() || next->first >= end);
  if (next != free_by_offset_.begin()) {
    const auto prev = std::prev(next);
    STRATA_ASSERT(prev->first + prev->second <= start);
    if (prev->first + prev->second == start) {
      start = prev->first;
      erase_free(prev);
    }
  }
  if (next != free_by_offset_.end() && next->first == end) {
    end += next->second;
    erase_free(next);
  }
  insert_free(start, end - start);
  return Status::ok();
}

AllocatorStats ExtentAllocator::stats() const {
  AllocatorStats s;
  s.capacity = capacity_;
  s.free_bytes = free_bytes_;
  s.used_bytes = capacity_ - free_bytes_;
  s.largest_free = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.free_extents = free_by_offset_.size();
  s.allocated_extents = allocated_.size();
  return s;
}

void ExtentAllocator::check_invariants() const {
  STRATA_ASSERT(free_by_offset_.size() == free_by_size_.size());
  // Coalescing keeps free extents separated by allocated ones.
  STRATA_ASSERT(free_by_offset_.size() <= allocated_.size() + 1);

  uint64_t free_sum = 0;
  uint64_t prev_end = 0;
  bool first = true;
  for (const auto& [offset, length] : free_by_offset_) {
    STRATA_ASSERT(length > 0 && is_aligned(offset, unit_) && is_aligned(length, unit_));
    STRATA_ASSERT(offset + length <= capacity_);
    // Sorted, disjoint and never adjacent (adjacent free extents must have been coalesced).
    STRATA_ASSERT(first || offset > prev_end);
    STRATA_ASSERT(free_by_size_.count({length, offset}) == 1);
    STRATA_ASSERT(allocated_.find(offset) == allocated_.end());
    free_sum += length;
    prev_end = offset + length;
    first = false;
  }
  STRATA_ASSERT(free_sum == free_bytes_);

  // Free and allocated extents together tile [0, capacity) exactly.
  uint64_t used_sum = 0;
  auto free_it = free_by_offset_.begin();
  auto used_it = allocated_.begin();
  uint64_t cursor = 0;
  while (free_it != free_by_offset_.end() || used_it != allocated_.end()) {
    if (free_it != free_by_offset_.end() && free_it->first == cursor) {
      cursor += free_it->second;
      ++free_it;
    } else {
      STRATA_ASSERT(used_it != allocated_.end() && used_it->first == cursor);
      STRATA_ASSERT(used_it->second > 0 && is_aligned(used_it->second, unit_));
      cursor += used_it->second;
      used_sum += used_it->second;
      ++used_it;
    }
  }
  STRATA_ASSERT(cursor == capacity_);
  STRATA_ASSERT(used_sum + free_bytes_ == capacity_);
}

}  // namespace strata::storage
