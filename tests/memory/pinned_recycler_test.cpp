#include "memory/pinned_recycler.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace strata::memory {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct Fixture {
  explicit Fixture(uint64_t budget) {
    PinnedArenaOptions options;
    options.budget_bytes = budget;
    options.lock_pages = false;  // the recycler's logic, not the kernel's locking, is under test
    Result<std::unique_ptr<PinnedArena>> made = PinnedArena::create(options);
    EXPECT_TRUE(made.is_ok()) << made.status().message();
    if (made.is_ok()) arena = std::move(made).value();
  }
  std::unique_ptr<PinnedArena> arena;
};

TEST(PinnedRecycler, ASizeGivenBackIsReusedWithoutMappingAgain) {
  Fixture f(16 * kMiB);
  ASSERT_NE(f.arena, nullptr);
  PinnedRecycler recycler(*f.arena);
  Result<PinnedBuffer> first = recycler.take(3 * kMiB + 5, TensorKind::kAdamM);
  ASSERT_TRUE(first.is_ok()) << first.status().message();
  std::byte* address = first->data();
  EXPECT_EQ(first->reserved_bytes(), 3 * kMiB + 4096);  // exact, rounded to a page only
  recycler.give_back(std::move(first).value(), TensorKind::kAdamM);
  EXPECT_EQ(recycler.stats().kept_bytes, 3 * kMiB + 4096);

  // Any request that rounds to the same page count gets the kept buffer back.
  Result<PinnedBuffer> second = recycler.take(3 * kMiB + 4000, TensorKind::kAdamV);
  ASSERT_TRUE(second.is_ok());
  EXPECT_EQ(second->data(), address);
  EXPECT_EQ(recycler.stats().reused, 1u);
  EXPECT_EQ(recycler.stats().kept_bytes, 0u);
  EXPECT_EQ(f.arena->stats().allocations, 1u);  // mapped once
}

TEST(PinnedRecycler, KeptMemoryStaysReservedUntilTrimmed) {
  Fixture f(16 * kMiB);
  ASSERT_NE(f.arena, nullptr);
  PinnedRecycler recycler(*f.arena);
  Result<PinnedBuffer> buffer = recycler.take(2 * kMiB, TensorKind::kGradient);
  ASSERT_TRUE(buffer.is_ok());
  EXPECT_EQ(f.arena->stats().reserved_bytes, 2 * kMiB);
  recycler.give_back(std::move(buffer).value(), TensorKind::kGradient);
  EXPECT_EQ(f.arena->stats().reserved_bytes, 2 * kMiB);  // kept: still mapped
  EXPECT_EQ(recycler.stats().kept_bytes, 2 * kMiB);
  recycler.trim();
  EXPECT_EQ(f.arena->stats().reserved_bytes, 0u);
  EXPECT_EQ(recycler.stats().kept_bytes, 0u);
}

TEST(PinnedRecycler, KeptBuffersOfOtherSizesMakeRoomUnderTheBudget) {
  Fixture f(8 * kMiB);
  ASSERT_NE(f.arena, nullptr);
  PinnedRecycler recycler(*f.arena);
  std::vector<PinnedBuffer> small;
  for (int i = 0; i < 6; ++i) {
    Result<PinnedBuffer> b = recycler.take(kMiB, TensorKind::kParameter);
    ASSERT_TRUE(b.is_ok()) << b.status().message();
    small.push_back(std::move(b).value());
  }
  for (PinnedBuffer& b : small) recycler.give_back(std::move(b), TensorKind::kParameter);
  EXPECT_EQ(recycler.stats().kept_bytes, 6 * kMiB);

  // 5 MiB does not fit beside 6 MiB kept in an 8 MiB budget: kept buffers are unmapped for it.
  Result<PinnedBuffer> big = recycler.take(5 * kMiB, TensorKind::kMasterWeight);
  ASSERT_TRUE(big.is_ok()) << big.status().message();
  EXPECT_GE(recycler.stats().trimmed, 3u);
  EXPECT_LE(f.arena->stats().reserved_bytes, 8 * kMiB);
  EXPECT_EQ(recycler.stats().kept_bytes + 5 * kMiB, f.arena->stats().reserved_bytes);
}

TEST(PinnedRecycler, ARequestPastTheBudgetFailsWithTheArenasNumbers) {
  Fixture f(4 * kMiB);
  ASSERT_NE(f.arena, nullptr);
  PinnedRecycler recycler(*f.arena);
  Result<PinnedBuffer> held = recycler.take(3 * kMiB, TensorKind::kOther);
  ASSERT_TRUE(held.is_ok());
  Result<PinnedBuffer> more = recycler.take(2 * kMiB, TensorKind::kOther);
  ASSERT_FALSE(more.is_ok());
  EXPECT_EQ(more.status().code(), STRATA_E_PINNED_BUDGET);
  EXPECT_NE(more.status().message().find("budget"), std::string::npos) << more.status().message();
  EXPECT_EQ(recycler.take(0, TensorKind::kOther).status().code(), STRATA_E_INVALID);
}

}  // namespace
}  // namespace strata::memory
