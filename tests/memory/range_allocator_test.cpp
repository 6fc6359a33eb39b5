#include "memory/range_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

namespace strata::memory {
namespace {

TEST(RangeAllocator, AllocationsAreAlignedAndDisjoint) {
  RangeAllocator a(1 << 20, 256, 64);
  std::map<uint64_t, uint64_t> live;
  for (uint64_t bytes : {1, 255, 256, 257, 1000, 4096, 12345}) {
    const auto offset = a.allocate(bytes);
    ASSERT_TRUE(offset.has_value());
    EXPECT_EQ(*offset % 256, 0u);
    EXPECT_EQ(a.size_at(*offset), (bytes + 255) / 256 * 256);
    live[*offset] = a.size_at(*offset);
  }
  uint64_t end = 0;
  for (const auto& [offset, size] : live) {
    EXPECT_GE(offset, end);
    end = offset + size;
  }
  EXPECT_TRUE(a.check_invariants());
}

TEST(RangeAllocator, FreeMergesNeighboursBackIntoOneRange) {
  RangeAllocator a(1 << 20, 256, 64);
  std::vector<uint64_t> offsets;
  offsets.reserve(16);
  for (int i = 0; i < 16; ++i) offsets.push_back(*a.allocate(4096));
  // Free every other one, then the rest: the slab must end as one free range.
  for (size_t i = 0; i < offsets.size(); i += 2) ASSERT_TRUE(a.free(offsets[i]).has_value());
  EXPECT_TRUE(a.check_invariants());
  EXPECT_EQ(a.largest_free_range(), (1u << 20) - 16 * 4096);  // the tail; holes are 4 KiB
  for (size_t i = 1; i < offsets.size(); i += 2) ASSERT_TRUE(a.free(offsets[i]).has_value());
  EXPECT_TRUE(a.check_invariants());
  EXPECT_EQ(a.largest_free_range(), 1u << 20);
  EXPECT_EQ(a.allocated_bytes(), 0u);
  const auto whole = a.allocate(1 << 20);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(*whole, 0u);
}

TEST(RangeAllocator, ReportsTheMergedFreeRangeAndTag) {
  RangeAllocator a(1 << 16, 256, 8);
  const uint64_t x = *a.allocate(1024, 7);
  const uint64_t y = *a.allocate(1024, 8);
  EXPECT_EQ(a.tag_at(y), 8u);
  const auto freed_x = a.free(x);
  ASSERT_TRUE(freed_x.has_value());
  EXPECT_EQ(freed_x->tag, 7u);
  EXPECT_EQ(freed_x->free_offset, 0u);
  EXPECT_EQ(freed_x->free_bytes, 1024u);
  const auto freed_y = a.free(y);
  ASSERT_TRUE(freed_y.has_value());
  EXPECT_EQ(freed_y->free_offset, 0u);
  EXPECT_EQ(freed_y->free_bytes, 1u << 16);  // merged with x's range and the tail
}

TEST(RangeAllocator, FailsCleanlyWhenFullOrAtTheAllocationLimit) {
  RangeAllocator a(4096, 256, 4);
  EXPECT_FALSE(a.allocate(4097).has_value());
  EXPECT_FALSE(a.allocate(0).has_value());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a.allocate(256).has_value());
  EXPECT_FALSE(a.allocate(256).has_value());  // the metadata limit, not space
  EXPECT_FALSE(a.free(12345).has_value());    // not an allocation's start
  EXPECT_FALSE(a.free(1).has_value());
  EXPECT_TRUE(a.check_invariants());
}

TEST(RangeAllocator, RandomWorkloadKeepsInvariantsAndReturnsToEmpty) {
  RangeAllocator a(64 << 20, 256, 512);
  std::mt19937_64 rng(42);
  std::map<uint64_t, uint64_t> live;  // offset -> size
  for (int step = 0; step < 20000; ++step) {
    const bool allocate = live.empty() || (live.size() < 400 && rng() % 100 < 55);
    if (allocate) {
      const uint64_t bytes = 1 + rng() % (rng() % 4 == 0 ? (4 << 20) : 8192);
      const auto offset = a.allocate(bytes);
      if (!offset) continue;  // full: fine, keep going
      const uint64_t size = a.size_at(*offset);
      // No overlap with any live range.
      auto next = live.lower_bound(*offset);
      if (next != live.end()) ASSERT_LE(*offset + size, next->first);
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *offset);
      }
      live[*offset] = size;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const auto freed = a.free(it->first);
      ASSERT_TRUE(freed.has_value());
      ASSERT_EQ(freed->bytes, it->second);
      live.erase(it);
    }
    if (step % 997 == 0) ASSERT_TRUE(a.check_invariants()) << "step " << step;
  }
  for (const auto& [offset, size] : live) ASSERT_TRUE(a.free(offset).has_value());
  EXPECT_TRUE(a.check_invariants());
  EXPECT_EQ(a.allocated_bytes(), 0u);
  EXPECT_EQ(a.largest_free_range(), 64u << 20);
}

}  // namespace
}  // namespace strata::memory
