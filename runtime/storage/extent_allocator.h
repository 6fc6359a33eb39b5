// Free-space allocator for the NVMe tier: hands out aligned extents of [0, capacity).
//
// Best fit by size, splitting the chosen free extent and coalescing neighbours on free, every
// operation O(log n). Not thread-safe: ExtentStore serialises calls under its own mutex.
//
// Three ordered indexes, all keyed so that the operation they serve is a single tree lookup:
//  - free_by_offset_: free extents by offset, to find the neighbours to coalesce with;
//  - free_by_size_:   (length, offset) pairs, so that lower_bound({n, 0}) is the best fit and,
//                     among equal lengths, the lowest offset (deterministic, keeps data low);
//                     a set of pairs rather than a multimap<size, offset> so that erasing one
//                     given free extent is O(log n) instead of a scan of its equal-size range;
//  - allocated_:      live allocations by offset, so that a double free or a free of a range that
//                     was never handed out is refused before it can corrupt the free indexes.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "common/status.h"

namespace strata::storage {

struct AllocatorStats {
  uint64_t capacity = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free = 0;  // length of the largest free extent
  uint64_t free_extents = 0;  // number of free extents (1 when nothing is allocated)
  uint64_t allocated_extents = 0;
};

class ExtentAllocator {
 public:
  // Default ceiling on live allocations: each costs about 150 bytes of host memory across the
  // indexes, so 16M extents is ~2.4 GiB - far above what a model's tensors need, low enough that
  // a runaway caller hits STRATA_E_LIMIT before it exhausts host memory.
  static constexpr uint64_t kDefaultMaxExtents = uint64_t{1} << 24;

  // capacity is rounded down to a multiple of unit; unit must be a power of two. Both checked by
  // create(); the constructor asserts them.
  static Result<ExtentAllocator> create(uint64_t capacity, uint64_t unit,
                                        uint64_t max_extents = kDefaultMaxExtents);

  ExtentAllocator(ExtentAllocator&&) noexcept = default;
  ExtentAllocator& operator=(ExtentAllocator&&) noexcept = default;
  ExtentAllocator(const ExtentAllocator&) = delete;
  ExtentAllocator& operator=(const ExtentAllocator&) = delete;

  // Reserves align_up(bytes, unit) bytes and returns their offset. Errors: STRATA_E_INVALID for
  // bytes == 0; STRATA_E_NOSPACE when no free extent is large enough, the message saying whether
  // the tier is full or only fragmented; STRATA_E_LIMIT at max_extents live allocations.
  Result<uint64_t> allocate(uint64_t bytes);

  // Returns [offset, offset + length) to the free space, where length is what allocate() reserved
  // (align_up of the requested bytes). Anything else - a double free, an offset never handed out,
  // a different length - is STRATA_E_STATE and leaves the allocator untouched.
  Status free(uint64_t offset, uint64_t length);

  // Bytes allocate(bytes) reserves.
  uint64_t reserved_length(uint64_t bytes) const;

  uint64_t capacity() const { return capacity_; }
  uint64_t unit() const { return unit_; }
  uint64_t max_extents() const { return max_extents_; }
  AllocatorStats stats() const;

  // Walks every index and asserts the invariants (O(n)); for tests and debug builds.
  void check_invariants() const;

 private:
  ExtentAllocator(uint64_t capacity, uint64_t unit, uint64_t max_extents);

  void insert_free(uint64_t offset, uint64_t length);
  void erase_free(std::map<uint64_t, uint64_t>::iterator it);
  Status out_of_space(uint64_t length) const;

  uint64_t capacity_ = 0;
  uint64_t unit_ = 0;
  uint64_t max_extents_ = 0;
  uint64_t free_bytes_ = 0;

  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (length, offset)
  std::map<uint64_t, uint64_t> allocated_;                // offset -> length
};

}  // namespace strata::storage
