#include "storage/extent_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

namespace strata::storage {
namespace {

constexpr uint64_t kUnit = 4096;

ExtentAllocator make(uint64_t units, uint64_t max_extents = ExtentAllocator::kDefaultMaxExtents) {
  auto allocator = ExtentAllocator::create(units * kUnit, kUnit, max_extents);
  EXPECT_TRUE(allocator.is_ok()) << allocator.status().message();
  return std::move(allocator).value();
}

// The reference model: one flag per unit. Slow and obviously right.
class BitmapModel {
 public:
  explicit BitmapModel(uint64_t units) : used_(units, false) {}

  void mark(uint64_t offset, uint64_t length, bool used) {
    for (uint64_t u = offset / kUnit; u < (offset + length) / kUnit; ++u) {
      ASSERT_NE(used_[u], used) << "unit " << u << (used ? " handed out twice" : " freed twice");
      used_[u] = used;
    }
  }
  uint64_t free_bytes() const {
    return static_cast<uint64_t>(std::count(used_.begin(), used_.end(), false)) * kUnit;
  }
  // Lengths of the maximal runs of free units, in bytes.
  std::vector<uint64_t> free_runs() const {
    std::vector<uint64_t> runs;
    uint64_t run = 0;
    for (bool used : used_) {
      if (!used) {
        ++run;
      } else if (run > 0) {
        runs.push_back(run * kUnit);
        run = 0;
      }
    }
    if (run > 0) runs.push_back(run * kUnit);
    return runs;
  }

 private:
  std::vector<bool> used_;
};

void expect_matches_model(const ExtentAllocator& allocator, const BitmapModel& model) {
  const AllocatorStats stats = allocator.stats();
  const std::vector<uint64_t> runs = model.free_runs();
  EXPECT_EQ(stats.free_bytes, model.free_bytes());
  EXPECT_EQ(stats.used_bytes, stats.capacity - model.free_bytes());
  // Coalescing is complete exactly when the allocator's free extents are the model's free runs.
  EXPECT_EQ(stats.free_extents, runs.size());
  EXPECT_EQ(stats.largest_free, runs.empty() ? 0 : *std::max_element(runs.begin(), runs.end()));
  allocator.check_invariants();
}

TEST(ExtentAllocator, RoundsRequestsUpToTheUnit) {
  ExtentAllocator allocator = make(8);
  auto a = allocator.allocate(1);
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(allocator.reserved_length(1), kUnit);
  auto b = allocator.allocate(kUnit + 1);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(*b, kUnit);
  EXPECT_EQ(allocator.stats().used_bytes, 3 * kUnit);
  allocator.check_invariants();
}

TEST(ExtentAllocator, ChoosesTheSmallestFreeExtentThatFits) {
  ExtentAllocator allocator = make(32);
  // Carve holes of 5 units (at 0) and 2 units (at 6 units), separated by live extents.
  std::vector<uint64_t> offsets;
  for (uint64_t units : {5, 1, 2, 1}) offsets.push_back(*allocator.allocate(units * kUnit));
  ASSERT_TRUE(allocator.free(offsets[0], 5 * kUnit).is_ok());
  ASSERT_TRUE(allocator.free(offsets[2], 2 * kUnit).is_ok());

  auto two = allocator.allocate(2 * kUnit);
  ASSERT_TRUE(two.is_ok());
  EXPECT_EQ(*two, 6 * kUnit) << "best fit takes the 2-unit hole, not the first one";
  auto three = allocator.allocate(3 * kUnit);
  ASSERT_TRUE(three.is_ok());
  EXPECT_EQ(*three, 0u) << "then the 5-unit hole, split from its start";
  allocator.check_invariants();
}

TEST(ExtentAllocator, FreeingEverythingCoalescesBackToOneExtent) {
  constexpr uint64_t kUnits = 4096;
  ExtentAllocator allocator = make(kUnits);
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (;;) {
    const uint64_t bytes = 1 + rng() % (9 * kUnit);
    auto offset = allocator.allocate(bytes);
    if (!offset) break;
    live.emplace_back(*offset, allocator.reserved_length(bytes));
  }
  EXPECT_LT(allocator.stats().free_bytes, 9 * kUnit);
  std::shuffle(live.begin(), live.end(), rng);
  for (const auto& [offset, length] : live) ASSERT_TRUE(allocator.free(offset, length).is_ok());

  const AllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.free_extents, 1u);
  EXPECT_EQ(stats.largest_free, kUnits * kUnit);
  EXPECT_EQ(stats.free_bytes, kUnits * kUnit);
  EXPECT_EQ(stats.allocated_extents, 0u);
  allocator.check_invariants();
}

TEST(ExtentAllocator, RandomWorkloadAgreesWithABitmapModel) {
  constexpr uint64_t kUnits = 2048;
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    ExtentAllocator allocator = make(kUnits);
    BitmapModel model(kUnits);
    std::mt19937_64 rng(seed);
    std::map<uint64_t, uint64_t> live;  // offset -> reserved length
    uint64_t refusals = 0;
    for (int step = 0; step < 20000; ++step) {
      const bool allocate = live.empty() || rng() % 100 < 55;
      if (allocate) {
        // Mostly small requests, some large ones, so that the space fragments.
        const uint64_t bytes =
            rng() % 10 == 0 ? 1 + rng() % (128 * kUnit) : 1 + rng() % (6 * kUnit);
        auto offset = allocator.allocate(bytes);
        const uint64_t length = allocator.reserved_length(bytes);
        const std::vector<uint64_t> runs = model.free_runs();
        const bool fits =
            std::any_of(runs.begin(), runs.end(), [&](uint64_t r) { return r >= length; });
        // Best fit never refuses a request that some free run could hold.
        ASSERT_EQ(offset.is_ok(), fits) << "request of " << length << " bytes";
        if (!offset) {
          EXPECT_EQ(offset.status().code(), STRATA_E_NOSPACE);
          ++refusals;
          continue;
        }
        ASSERT_EQ(*offset % kUnit, 0u);
        ASSERT_LE(*offset + length, kUnits * kUnit);
        model.mark(*offset, length, true);
        live.emplace(*offset, length);
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        ASSERT_TRUE(allocator.free(it->first, it->second).is_ok());
        model.mark(it->first, it->second, false);
        live.erase(it);
      }
      if (step % 97 == 0) expect_matches_model(allocator, model);
    }
    expect_matches_model(allocator, model);
    EXPECT_GT(refusals, 0u) << "the workload should reach the limits of the space";
    EXPECT_EQ(allocator.stats().allocated_extents, live.size());
  }
}

TEST(ExtentAllocator, ExhaustionSaysTheTierIsFull) {
  ExtentAllocator allocator = make(4);
  ASSERT_TRUE(allocator.allocate(3 * kUnit).is_ok());
  auto refused = allocator.allocate(2 * kUnit);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), STRATA_E_NOSPACE);
  EXPECT_NE(refused.status().message().find("full"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("requested 8.00 KiB"), std::string::npos)
      << refused.status().message();
  // Larger than the whole tier: also full, and no overflow in the rounding.
  auto huge = allocator.allocate(UINT64_MAX);
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().code(), STRATA_E_NOSPACE);
  allocator.check_invariants();
}

TEST(ExtentAllocator, FragmentationIsToldApartFromFull) {
  ExtentAllocator allocator = make(8);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 8; ++i) offsets.push_back(*allocator.allocate(kUnit));
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(allocator.free(offsets[i], kUnit).is_ok());

  auto refused = allocator.allocate(2 * kUnit);  // 4 units free, none adjacent
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), STRATA_E_NOSPACE);
  const std::string& message = refused.status().message();
  EXPECT_NE(message.find("fragmented"), std::string::npos) << message;
  EXPECT_NE(message.find("largest free extent 4.00 KiB"), std::string::npos) << message;
  EXPECT_NE(message.find("total free 16.00 KiB"), std::string::npos) << message;
  allocator.check_invariants();
}

TEST(ExtentAllocator, DoubleFreeIsRefusedAndChangesNothing) {
  ExtentAllocator allocator = make(16);
  const uint64_t a = *allocator.allocate(2 * kUnit);
  const uint64_t b = *allocator.allocate(3 * kUnit);
  ASSERT_TRUE(allocator.free(a, 2 * kUnit).is_ok());
  const AllocatorStats before = allocator.stats();

  const Status twice = allocator.free(a, 2 * kUnit);
  EXPECT_EQ(twice.code(), STRATA_E_STATE);
  EXPECT_NE(twice.message().find("double free"), std::string::npos) << twice.message();
  // Never handed out, inside a live extent, and a live extent with the wrong length.
  EXPECT_EQ(allocator.free(10 * kUnit, kUnit).code(), STRATA_E_STATE);
  EXPECT_EQ(allocator.free(b + kUnit, kUnit).code(), STRATA_E_STATE);
  EXPECT_EQ(allocator.free(b, 2 * kUnit).code(), STRATA_E_STATE);

  const AllocatorStats after = allocator.stats();
  EXPECT_EQ(after.free_bytes, before.free_bytes);
  EXPECT_EQ(after.free_extents, before.free_extents);
  EXPECT_EQ(after.allocated_extents, 1u);
  allocator.check_invariants();
  EXPECT_TRUE(allocator.free(b, 3 * kUnit).is_ok());
  EXPECT_EQ(allocator.stats().free_extents, 1u);
}

TEST(ExtentAllocator, ExtentLimitIsEnforced) {
  ExtentAllocator allocator = make(16, /*max_extents=*/3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(allocator.allocate(kUnit).is_ok());
  auto refused = allocator.allocate(kUnit);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), STRATA_E_LIMIT);
  ASSERT_TRUE(allocator.free(0, kUnit).is_ok());
  EXPECT_TRUE(allocator.allocate(kUnit).is_ok());
}

TEST(ExtentAllocator, RejectsBadArguments) {
  EXPECT_EQ(ExtentAllocator::create(16 * kUnit, 3000).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(ExtentAllocator::create(kUnit - 1, kUnit).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(ExtentAllocator::create(16 * kUnit, kUnit, 0).status().code(), STRATA_E_INVALID);
  ExtentAllocator allocator = make(4);
  EXPECT_EQ(allocator.allocate(0).status().code(), STRATA_E_INVALID);
  // A capacity that is not a multiple of the unit is rounded down.
  auto odd = ExtentAllocator::create(5 * kUnit + 100, kUnit);
  ASSERT_TRUE(odd.is_ok());
  EXPECT_EQ(odd->capacity(), 5 * kUnit);
}

}  // namespace
}  // namespace strata::storage
