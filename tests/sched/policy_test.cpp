#include "sched/policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sched/memory_plan.h"
#include "sched/sched_test_util.h"

namespace strata::sched {
namespace {

TEST(SizeClass, ExactRoundsToAlignmentOnly) {
  EXPECT_EQ(charged_bytes({SizeClass::kExact, 4096, 0}, 1).value(), 4096u);
  EXPECT_EQ(charged_bytes({SizeClass::kExact, 4096, 0}, 4097).value(), 8192u);
  EXPECT_EQ(charged_bytes({SizeClass::kExact, 256, 0}, 1000).value(), 1024u);
  EXPECT_EQ(charged_bytes({SizeClass::kExact, 3000, 0}, 1).status().code(), STRATA_E_INVALID);
}

TEST(SizeClass, PowerOfTwoWastesUpToHalf) {
  // The offload baseline's example: a 129.5 MiB tensor pins 256 MiB.
  EXPECT_EQ(charged_bytes({SizeClass::kPowerOfTwo, 4096, 0}, 259u << 19).value(), 256u << 20);
  EXPECT_EQ(charged_bytes({SizeClass::kPowerOfTwo, 4096, 0}, 4096).value(), 4096u);
}

TEST(SizeClass, UniformSlotChargesTheSlotAndRejectsLargerTensors) {
  const SizeRule rule{SizeClass::kUniformSlot, 4096, 1 << 20};
  EXPECT_EQ(charged_bytes(rule, 10).value(), 1u << 20);
  const Status too_big = charged_bytes(rule, (1 << 20) + 1).status();
  EXPECT_EQ(too_big.code(), STRATA_E_INVALID);
  EXPECT_NE(too_big.message().find("buffer_size too small"), std::string::npos);
  EXPECT_EQ(charged_bytes(rule, 0).status().code(), STRATA_E_INVALID);
}

TEST(Belady, EvictsTheCandidateUsedFarthestAway) {
  const std::vector<EvictionCandidate> c = {
      {0, 3, 100, false}, {1, 9, 100, false}, {2, 5, 100, false}};
  EXPECT_EQ(choose_victim(c, 0, true), 1u);
}

TEST(Belady, NeverUsedAgainBeatsEverything) {
  const std::vector<EvictionCandidate> c = {{0, 1000000, 1, false}, {1, kNeverUsed, 1, false}};
  EXPECT_EQ(choose_victim(c, 0, true), 1u);
}

TEST(Belady, PrefetchNeverEvictsWhatIsNeededSoonerThanWhatItBringsIn) {
  const std::vector<EvictionCandidate> c = {{0, 2, 100, false}, {1, 3, 100, false}};
  // Prefetching for distance 3 may only evict candidates needed after phase 3.
  EXPECT_EQ(choose_victim(c, 4, true), kNoVictim);
  EXPECT_EQ(choose_victim(c, 3, true), 1u);
}

TEST(Belady, DirtyCandidatesWaitForACleaningLink) {
  const std::vector<EvictionCandidate> c = {{0, 9, 100, true}, {1, 4, 100, false}};
  EXPECT_EQ(choose_victim(c, 0, true), 0u);
  EXPECT_EQ(choose_victim(c, 0, false), 1u);
}

TEST(Belady, TiesPreferCleanThenLargerThenLowerSlot) {
  const std::vector<EvictionCandidate> c = {
      {5, 7, 100, true}, {6, 7, 100, false}, {7, 7, 200, false}, {3, 7, 200, false}};
  EXPECT_EQ(choose_victim(c, 0, true), 3u);
  EXPECT_TRUE(better_victim(c[1], c[0]));
  EXPECT_TRUE(better_victim(c[2], c[1]));
}

// What fits beside the held tensors, less the sub-group updated, the one written back and one
// of room; the runtime's optimizer and the simulator take it from the same function.
TEST(OptimizerLookahead, IsWhatFitsLessThreeBetweenOneAndTheLimit) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  EXPECT_EQ(optimizer_lookahead(160 * kMiB, 0, 24 * kMiB), 3u);           // 6 fit
  EXPECT_EQ(optimizer_lookahead(160 * kMiB, 16 * kMiB, 24 * kMiB), 3u);   // 6 fit
  EXPECT_EQ(optimizer_lookahead(160 * kMiB, 17 * kMiB, 24 * kMiB), 2u);   // 5 fit
  EXPECT_EQ(optimizer_lookahead(96 * kMiB, 0, 24 * kMiB), 1u);            // 4 fit
  EXPECT_EQ(optimizer_lookahead(48 * kMiB, 0, 24 * kMiB), 1u);            // at least one
  EXPECT_EQ(optimizer_lookahead(160 * kMiB, 160 * kMiB, 24 * kMiB), 1u);  // nothing beside
  EXPECT_EQ(optimizer_lookahead(160 * kMiB, 0, 0), 1u);                   // no sub-groups
  EXPECT_EQ(optimizer_lookahead(64 * 1024 * kMiB, 0, 24 * kMiB), kMaxOptimizerLookahead);
}

// The optimizer writes through when its states do not fit the pool and the pool holds no more
// than the window at its limit and the three spare sub-groups beside what an update holds (19
// sub-groups); states that fit, or a pool with room to keep whole sub-groups beyond that, are left
// to the room search.
TEST(OptimizerWritesThrough, OnlyWhereStatesStreamThroughAPoolLittleLargerThanTheWindow) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  constexpr uint64_t kUnit = 24 * kMiB;
  const uint64_t limit = (kMaxOptimizerLookahead + 3) * kUnit;  // 19 sub-groups
  EXPECT_TRUE(optimizer_writes_through(4096 * kMiB, 160 * kMiB, 0, kUnit));
  EXPECT_TRUE(optimizer_writes_through(4096 * kMiB, limit, 0, kUnit));
  EXPECT_TRUE(optimizer_writes_through(4096 * kMiB, limit + kUnit - 1, 0, kUnit));
  EXPECT_FALSE(optimizer_writes_through(4096 * kMiB, limit + kUnit, 0, kUnit));  // 20 fit
  EXPECT_TRUE(optimizer_writes_through(4096 * kMiB, limit + kUnit, 1, kUnit));   // 19 beside
  EXPECT_FALSE(optimizer_writes_through(160 * kMiB, 160 * kMiB, 0, kUnit));      // they all fit
  EXPECT_TRUE(optimizer_writes_through(4096 * kMiB, 160 * kMiB, 160 * kMiB, kUnit));
  EXPECT_TRUE(optimizer_writes_through(4096 * kMiB, 160 * kMiB, 0, 0));
}

TEST(Belady, HandMadeSequenceMatchesTheOptimalMissCount) {
  // A cache of 2 over the reference string a b c a b d a, replayed through choose_victim.
  const std::vector<int> refs = {0, 1, 2, 0, 1, 3, 0};
  std::vector<int> cache;
  int misses = 0;
  for (size_t t = 0; t < refs.size(); ++t) {
    const int want = refs[t];
    if (std::find(cache.begin(), cache.end(), want) != cache.end()) continue;
    ++misses;
    if (cache.size() == 2) {
      std::vector<EvictionCandidate> c;
      for (int x : cache) {
        uint64_t next = kNeverUsed;
        for (size_t u = t + 1; u < refs.size(); ++u) {
          if (refs[u] == x) {
            next = u - t;
            break;
          }
        }
        c.push_back({static_cast<uint32_t>(x), next, 1, false});
      }
      cache.erase(cache.begin() + static_cast<long>(choose_victim(c, 0, true)));
    }
    cache.push_back(want);
  }
  // Optimal: a b c(evict b) a b(evict c) d(evict b) a -> 5 misses; LRU would miss 7 times.
  EXPECT_EQ(misses, 5);
}

TEST(WriteBehind, CleansOnlyBelowTheHeadroom) {
  EXPECT_FALSE(wants_cleaning(100, 50, 0, 0, 0.1));   // half free
  EXPECT_TRUE(wants_cleaning(100, 95, 0, 0, 0.1));    // 5 free, want 10
  EXPECT_FALSE(wants_cleaning(100, 95, 10, 0, 0.1));  // clean buffers count
  EXPECT_FALSE(wants_cleaning(100, 95, 0, 5, 0.1));   // so does cleaning in flight
  EXPECT_FALSE(wants_cleaning(100, 100, 0, 0, 0.0));  // disabled
}

TEST(WriteBehind, CleansForWhatWaitingRequestsNeedBeyondTheHeadroom) {
  EXPECT_TRUE(wants_cleaning(100, 80, 0, 0, 0.1, 30));     // 20 free, 30 waited for
  EXPECT_FALSE(wants_cleaning(100, 80, 5, 5, 0.1, 30));    // 20 + 5 clean + 5 cleaning
  EXPECT_FALSE(wants_cleaning(100, 80, 0, 0, 0.1, 15));    // the headroom (10) is less
  EXPECT_TRUE(wants_cleaning(100, 100, 0, 90, 0.1, 500));  // at most the whole budget
  EXPECT_FALSE(wants_cleaning(100, 0, 0, 0, 0.1, 500));
  EXPECT_FALSE(wants_cleaning(100, 80, 0, 0, 0.0, 30));  // disabled
}

TEST(MemoryPlan, StrataPlanServesEveryKindOnBothTiers) {
  const MemoryPlan plan = strata_memory_plan(1 << 30, 1 << 30);
  ASSERT_TRUE(validate(plan).is_ok());
  for (int k = 0; k < kTensorKindCount; ++k) {
    EXPECT_GE(find_pool(plan, Tier::kPinned, static_cast<TensorKind>(k)), 0);
    EXPECT_GE(find_pool(plan, Tier::kDevice, static_cast<TensorKind>(k)), 0);
  }
  EXPECT_EQ(reserved_bytes(plan, Tier::kPinned), 0u);  // on demand
}

TEST(MemoryPlan, ZeroInfinityReservesItsBlocksUpFront) {
  const std::vector<TensorSpec> inventory =
      testing::llama_like_inventory(4, 1024, 2816, 256, 32000);
  Result<MemoryPlan> plan = zero_infinity_memory_plan(inventory, {}, 8ull << 30);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  // Parameters: 5 slots of max(1e8, largest) bf16 elements in one power-of-two block.
  const int params = find_pool(*plan, Tier::kPinned, TensorKind::kParameter);
  ASSERT_GE(params, 0);
  EXPECT_EQ(plan->pools[params].size.slot_bytes, 200'000'000u);
  EXPECT_EQ(plan->pools[params].reserved_bytes, next_power_of_two(1'000'000'000));
  // Optimizer: sub-group = all parameters (fewer than 1e9), fp32, 4 + 1 rounded buffers.
  uint64_t elements = 0, grad_bytes = 0;
  for (const TensorSpec& s : inventory) {
    if (s.kind == TensorKind::kParameter) elements += s.elements();
    if (s.kind == TensorKind::kGradient) grad_bytes += s.bytes();
  }
  const int optimizer = find_pool(*plan, Tier::kPinned, TensorKind::kAdamM);
  EXPECT_EQ(plan->pools[optimizer].reserved_bytes,
            5 * next_power_of_two(align_up(elements * 4, 4096)));
  // Gradients: one flat block holding all of them, resident for good.
  const int grads = find_pool(*plan, Tier::kPinned, TensorKind::kGradient);
  EXPECT_GE(plan->pools[grads].reserved_bytes, next_power_of_two(grad_bytes));
  EXPECT_NE(plan->pinned_home_kinds & kind_bit(TensorKind::kGradient), 0u);
  EXPECT_EQ(plan->overflow_check_temp_bytes, elements);  // 1 byte per gradient element
  EXPECT_GT(plan->startup_transient_bytes, 0u);
}

TEST(MemoryPlan, BadPlansAreRejected) {
  MemoryPlan plan = strata_memory_plan(0, 1 << 20);
  EXPECT_EQ(validate(plan).code(), STRATA_E_INVALID);
  plan = strata_memory_plan(1 << 20, 1 << 20);
  plan.pools[0].tier = Tier::kNvme;
  EXPECT_EQ(validate(plan).code(), STRATA_E_INVALID);
  plan = strata_memory_plan(1 << 20, 1 << 20);
  plan.pools[0].reserved_bytes = 10;
  EXPECT_EQ(validate(plan).code(), STRATA_E_INVALID);
  EXPECT_EQ(zero_infinity_memory_plan({}, {}, 1 << 20).status().code(), STRATA_E_INVALID);
}

}  // namespace
}  // namespace strata::sched
