// The pool policies `strata bench pool` compares with the runtime's recycler (bench/pool/), and
// the replay of a pinned trace through each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "common/align.h"
#include "memory/pinned_arena.h"
#include "pool/buffer_pool.h"
#include "pool/pool_policy.h"
#include "pool/trace_replay.h"

namespace strata::bench {
namespace {

using memory::PinnedTrace;
using memory::PinnedTraceEvent;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// An arena whose pages stay virtual until touched.
std::unique_ptr<memory::PinnedArena> dry_arena(uint64_t budget) {
  memory::PinnedArenaOptions o;
  o.budget_bytes = budget;
  o.lock_pages = false;
  o.bind_numa = false;
  Result<std::unique_ptr<memory::PinnedArena>> arena = memory::PinnedArena::create(o);
  EXPECT_TRUE(arena.is_ok()) << arena.status().message();
  return std::move(arena).value();
}

// Builds a trace the way the recycler writes one: ids are live at most once.
struct TraceBuilder {
  PinnedTrace trace;
  uint64_t next_id = 1;
  uint64_t take(uint64_t bytes, TensorKind kind = TensorKind::kParameter) {
    const uint64_t id = next_id++;
    trace.events.push_back(
        {PinnedTraceEvent::Op::kTake, id, bytes, align_up(bytes, kPageSize), kind, false, 0});
    return id;
  }
  void give(uint64_t id) {
    for (const PinnedTraceEvent& e : trace.events) {
      if (e.op == PinnedTraceEvent::Op::kTake && e.id == id) {
        trace.events.push_back({PinnedTraceEvent::Op::kGive, id, 0, e.reserved, e.kind, false, 0});
        return;
      }
    }
    ADD_FAILURE() << "give of an id never taken";
  }
};

// Three steps of a layered job: each layer's two tensors live while the next layer's are taken,
// then an optimizer phase with larger fp32 states, one at a time.
PinnedTrace layered_steps() {
  TraceBuilder b;
  for (int step = 0; step < 3; ++step) {
    std::vector<uint64_t> previous;
    for (int layer = 0; layer < 4; ++layer) {
      std::vector<uint64_t> current = {b.take(3 * kMiB), b.take(kMiB + 100)};
      for (uint64_t id : previous) b.give(id);
      previous = current;
    }
    for (uint64_t id : previous) b.give(id);
    for (int layer = 0; layer < 4; ++layer) {
      const uint64_t m = b.take(6 * kMiB, TensorKind::kAdamM);
      const uint64_t v = b.take(6 * kMiB, TensorKind::kAdamV);
      b.give(m);
      b.give(v);
    }
  }
  return b.trace;
}

TEST(PoolClasses, SizesWithinTheToleranceMergeAndTheClassCountIsCapped) {
  const std::vector<uint64_t> sizes = {1000, 1010, 1019, 2000, 4000, 4050, 9000};
  const std::vector<SizeClass> merged = derive_size_classes(sizes, 0.02, 16);
  ASSERT_EQ(merged.size(), 4u);
  EXPECT_EQ(merged[0].slot_bytes, 1019u);  // a class's slot is its largest member
  EXPECT_EQ(merged[0].distinct_sizes, 3u);
  EXPECT_EQ(merged[0].smallest_bytes, 1000u);
  EXPECT_EQ(merged[2].slot_bytes, 4050u);

  const std::vector<SizeClass> exact = derive_size_classes(sizes, 0.0, 16);
  EXPECT_EQ(exact.size(), sizes.size());
  // At most two classes: the cheapest merges happen first, the largest size always survives.
  const std::vector<SizeClass> two = derive_size_classes(sizes, 0.0, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two.back().slot_bytes, 9000u);
}

TEST(PoolPlan, AdaptiveCountsAreTheFewestThatServeEveryTakeWithoutWaiting) {
  // A small request arrives while the large buffer is free and borrows it; the large request
  // that follows then needs a second large buffer: the counts follow the placement, not the mix.
  TraceBuilder b;
  const uint64_t large = b.take(8 * kMiB);
  b.give(large);
  const uint64_t small = b.take(kMiB);
  const uint64_t small2 = b.take(kMiB);
  const uint64_t large2 = b.take(8 * kMiB);
  for (uint64_t id : {small, small2, large2}) b.give(id);
  Result<PoolPlan> plan = plan_for_trace(b.trace, PoolPolicy::kAdaptive, {});
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  ASSERT_EQ(plan->classes.size(), 2u);
  EXPECT_EQ(plan->classes[0].slot_bytes, kMiB);
  EXPECT_EQ(plan->classes[0].count, 1u);  // the first small one sits in the large buffer
  EXPECT_EQ(plan->classes[1].slot_bytes, 8 * kMiB);
  EXPECT_EQ(plan->classes[1].count, 2u);
  EXPECT_EQ(plan->reserved_bytes, 17 * kMiB);

  Result<ReplayResult> r = replay_through_pool(b.trace, *plan, {.passes = 3});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->waits, 0u);
  EXPECT_EQ(r->peak_reserved_bytes, 17 * kMiB);
  EXPECT_EQ(r->mapped_first_pass, 3u);
  EXPECT_EQ(r->mapped_per_later_pass, 0.0);

  EXPECT_EQ(plan_for_trace(PinnedTrace{}, PoolPolicy::kAdaptive, {}).status().code(),
            STRATA_E_INVALID);
}

TEST(PoolPlan, ZeroInfinitySlotsAreUniformForTheLargestRequestAndTheLivePeak) {
  const PinnedTrace trace = layered_steps();
  PoolOptions o;
  o.zero_buffer_count = 3;
  Result<PoolPlan> plan = plan_for_trace(trace, PoolPolicy::kZeroInfinity, o);
  ASSERT_TRUE(plan.is_ok());
  ASSERT_EQ(plan->classes.size(), 1u);
  EXPECT_EQ(plan->classes[0].slot_bytes, 6 * kMiB);
  EXPECT_EQ(plan->classes[0].count, 4u);  // two layers' two tensors live at once
  EXPECT_EQ(plan->zero_block_bytes, 24 * kMiB);
  // DeepSpeed's buffer_size raises the slot; buffer_count the minimum number of slots.
  o.zero_buffer_size_bytes = 10 * kMiB;
  o.zero_buffer_count = 6;
  Result<PoolPlan> raised = plan_for_trace(trace, PoolPolicy::kZeroInfinity, o);
  EXPECT_EQ(raised->classes[0].slot_bytes, 10 * kMiB);
  EXPECT_EQ(raised->classes[0].count, 6u);
}

TEST(BufferPool, ZeroInfinityHandsOutItsUniformSlotsAndNoMore) {
  auto arena = dry_arena(2ull << 30);
  PoolPlan plan;
  plan.policy = PoolPolicy::kZeroInfinity;
  plan.classes = {{2 * kMiB, 5, 4096, 2, 3}};
  plan.zero_block_bytes = 10 * kMiB;
  Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, plan);
  ASSERT_TRUE(pool.is_ok()) << pool.status().message();
  BufferPool& p = **pool;
  EXPECT_EQ(p.stats().buffers, 5u);
  EXPECT_EQ(arena->stats().reserved_bytes, 10 * kMiB);
  EXPECT_EQ(arena->stats().allocations, 1u);  // one block

  std::vector<PoolBuffer> held;
  std::set<std::byte*> addresses;
  for (int i = 0; i < 5; ++i) {
    Result<PoolBuffer> b = p.try_acquire(i % 2 ? 4096 : kMiB);
    ASSERT_TRUE(b.is_ok() && b->valid());
    EXPECT_EQ(b->capacity(), 2 * kMiB);  // every request takes a whole slot
    addresses.insert(b->data());
    held.push_back(std::move(b).value());
  }
  EXPECT_EQ(addresses.size(), 5u);
  // DeepSpeed would fail here ("not enough swap buffers"); the pool says busy.
  Result<PoolBuffer> sixth = p.try_acquire(4096);
  ASSERT_TRUE(sixth.is_ok());
  EXPECT_FALSE(sixth->valid());
  EXPECT_EQ(p.stats().busy, 1u);
  EXPECT_EQ(p.try_acquire(2 * kMiB + 1).status().code(), STRATA_E_INVALID);
  held.pop_back();
  EXPECT_TRUE(p.try_acquire(4096)->valid());
}

TEST(BufferPool, Pow2RoundsUpCachesAndReusesBestFit) {
  auto arena = dry_arena(1ull << 30);
  PoolPlan plan;
  plan.policy = PoolPolicy::kPow2;
  Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, plan);
  ASSERT_TRUE(pool.is_ok());
  BufferPool& p = **pool;
  EXPECT_EQ(p.stats().reserved_bytes, 0u);  // grows on demand
  {
    Result<PoolBuffer> a = p.try_acquire(5 * kMiB + 1);
    ASSERT_TRUE(a.is_ok() && a->valid());
    EXPECT_EQ(a->capacity(), 8 * kMiB);  // the caching allocator's doubling
    Result<PoolBuffer> b = p.try_acquire(3 * kMiB);
    EXPECT_EQ(b->capacity(), 4 * kMiB);
    EXPECT_EQ(arena->stats().reserved_bytes, 12 * kMiB);
  }
  // Cached: the same requests again map nothing new; a small one reuses a cached larger block.
  Result<PoolBuffer> c = p.try_acquire(3 * kMiB);
  Result<PoolBuffer> d = p.try_acquire(3 * kMiB);
  EXPECT_EQ(c->capacity(), 4 * kMiB);
  EXPECT_EQ(d->capacity(), 8 * kMiB);
  EXPECT_EQ(arena->stats().reserved_bytes, 12 * kMiB);
  EXPECT_EQ(p.stats().borrowed, 1u);
}

TEST(BufferPool, RandomAcquireReleaseNeitherLeaksNorGrowsNorOverlaps) {
  auto arena = dry_arena(4ull << 30);
  PoolPlan plan;
  plan.policy = PoolPolicy::kAdaptive;
  plan.classes = {{64 * 1024, 8, 0, 1, 0}, {kMiB, 4, 0, 1, 0}, {3 * kMiB, 2, 0, 1, 0}};
  Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, plan);
  ASSERT_TRUE(pool.is_ok());
  BufferPool& p = **pool;
  const uint64_t reserved = arena->stats().reserved_bytes;
  EXPECT_EQ(reserved, 8 * 64 * 1024 + 4 * kMiB + 6 * kMiB);
  const uint64_t sizes[] = {4096, 60000, kMiB - 1, 3 * kMiB};

  std::mt19937_64 rng(7);
  // Real pages: the stamps written at each buffer's ends catch two loans sharing memory.
  std::map<std::byte*, std::pair<PoolBuffer, uint64_t>> held;  // data -> (buffer, stamp)
  uint64_t stamp = 0;
  for (int step = 0; step < 20000; ++step) {
    if (held.empty() || rng() % 100 < 50) {
      const uint64_t bytes = sizes[rng() % std::size(sizes)];
      Result<PoolBuffer> b = p.try_acquire(bytes);
      ASSERT_TRUE(b.is_ok());
      if (!b->valid()) continue;
      ASSERT_GE(b->capacity(), bytes);
      auto next = held.lower_bound(b->data());
      if (next != held.end()) ASSERT_LE(b->data() + b->capacity(), next->first);
      if (next != held.begin()) {
        const auto& prev = *std::prev(next);
        ASSERT_LE(prev.first + prev.second.first.capacity(), b->data());
      }
      ++stamp;
      std::memcpy(b->data(), &stamp, sizeof stamp);
      std::memcpy(b->data() + bytes - sizeof stamp, &stamp, sizeof stamp);
      std::byte* key = b->data();
      held.emplace(key, std::make_pair(std::move(b).value(), stamp));
    } else {
      auto it = held.begin();
      std::advance(it, static_cast<long>(rng() % held.size()));
      uint64_t head = 0;
      uint64_t tail = 0;
      const PoolBuffer& b = it->second.first;
      std::memcpy(&head, b.data(), sizeof head);
      std::memcpy(&tail, b.data() + b.size() - sizeof tail, sizeof tail);
      ASSERT_EQ(head, it->second.second);
      ASSERT_EQ(tail, it->second.second);
      held.erase(it);
    }
  }
  held.clear();
  EXPECT_EQ(p.stats().buffers_in_use, 0u);
  EXPECT_EQ(p.stats().in_use_bytes, 0u);
  EXPECT_EQ(arena->stats().reserved_bytes, reserved);
  EXPECT_GT(p.stats().acquires, 1000u);
}

TEST(TraceReplay, TheDemandIsWhatTheTraceAsksForAtOnce) {
  const TraceDemand d = trace_demand(layered_steps());
  EXPECT_EQ(d.takes, 3u * (8 + 8));
  EXPECT_EQ(d.peak_live, 4u);
  EXPECT_EQ(d.peak_requested_bytes, std::max(2 * (4 * kMiB + 100), 12 * kMiB));
  EXPECT_EQ(d.peak_page_bytes, 12 * kMiB);
}

TEST(TraceReplay, TheRecyclerMapsEachSizeOnceAndTrimsUnderItsBudget) {
  const PinnedTrace trace = layered_steps();
  const uint64_t small = align_up(kMiB + 100, kPageSize);
  // Unlimited: it keeps everything, so it maps each size's live peak once, in the first step.
  Result<ReplayResult> kept = replay_through_recycler(trace, 0, {.passes = 3});
  ASSERT_TRUE(kept.is_ok()) << kept.status().message();
  EXPECT_EQ(kept->mapped_first_pass, 2u + 2u + 2u);
  EXPECT_EQ(kept->mapped_per_later_pass, 0.0);
  EXPECT_EQ(kept->peak_reserved_bytes, 2 * 3 * kMiB + 2 * small + 2 * 6 * kMiB);
  EXPECT_EQ(kept->waits, 0u);
  EXPECT_GT(kept->take_ns, 0.0);
  // Under a budget below that, kept buffers of other sizes are unmapped to make room: the peak
  // stays within the budget, and the optimizer's sizes are mapped again every step.
  const uint64_t budget = 14 * kMiB;
  Result<ReplayResult> trimmed = replay_through_recycler(trace, budget, {.passes = 3});
  ASSERT_TRUE(trimmed.is_ok()) << trimmed.status().message();
  EXPECT_LE(trimmed->peak_reserved_bytes, budget);
  EXPECT_GT(trimmed->mapped_per_later_pass, 0.0);
  // Below what is live at once it fails as the runtime would.
  EXPECT_EQ(replay_through_recycler(trace, 8 * kMiB, {.passes = 2}).status().code(),
            STRATA_E_PINNED_BUDGET);
}

TEST(TraceReplay, EveryPolicyServesTheWholeTraceAndNoneReservesBelowThePagePeak) {
  const PinnedTrace trace = layered_steps();
  const TraceDemand d = trace_demand(trace);
  for (PoolPolicy policy : {PoolPolicy::kAdaptive, PoolPolicy::kZeroInfinity, PoolPolicy::kPow2}) {
    Result<PoolPlan> plan = plan_for_trace(trace, policy, {});
    ASSERT_TRUE(plan.is_ok());
    Result<ReplayResult> r = replay_through_pool(trace, *plan, {.passes = 3});
    ASSERT_TRUE(r.is_ok()) << to_string(policy) << ": " << r.status().message();
    EXPECT_EQ(r->waits, 0u) << to_string(policy);
    EXPECT_GE(r->peak_reserved_bytes, d.peak_page_bytes) << to_string(policy);
  }
  Result<PoolPlan> pow2 = plan_for_trace(trace, PoolPolicy::kPow2, {});
  Result<ReplayResult> r = replay_through_pool(trace, *pow2, {.passes = 3});
  // 3 MiB -> 4, 1 MiB + 100 -> 2, 6 MiB -> 8: cached, so mapped once, in the first step.
  EXPECT_EQ(r->peak_reserved_bytes, 2 * 4 * kMiB + 2 * 2 * kMiB + 2 * 8 * kMiB);
  EXPECT_EQ(r->mapped_first_pass, 6u);
  EXPECT_EQ(r->mapped_per_later_pass, 0.0);
  EXPECT_EQ(replay_through_pool(trace, *pow2, {.passes = 1}).status().code(), STRATA_E_INVALID);
}

}  // namespace
}  // namespace strata::bench
