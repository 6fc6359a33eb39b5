#include "memory/buffer_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/align.h"
#include "memory/staging.h"
#include "memory/staging_replay.h"
#include "model/inventory.h"
#include "model/model_config.h"

namespace strata::memory {
namespace {

std::vector<TensorSpec> inventory_of(const std::string& model, InventoryOptions options = {}) {
  Result<ModelConfig> config = load_model(model);
  EXPECT_TRUE(config.is_ok()) << config.status().message();
  return config.is_ok() ? build_inventory(*config, options) : std::vector<TensorSpec>{};
}

// An arena whose pages stay virtual until touched: pool sizing tests map model-sized buffers.
std::unique_ptr<PinnedArena> dry_arena(uint64_t budget, Accounting* accounting = nullptr) {
  PinnedArenaOptions o;
  o.budget_bytes = budget;
  o.lock_pages = false;
  o.accounting = accounting;
  Result<std::unique_ptr<PinnedArena>> arena = PinnedArena::create(o);
  EXPECT_TRUE(arena.is_ok()) << arena.status().message();
  return std::move(arena).value();
}

std::vector<uint64_t> slot_sizes(const PoolPlan& plan) {
  std::vector<uint64_t> sizes;
  for (const SizeClass& c : plan.classes) sizes.push_back(c.slot_bytes);
  return sizes;
}

// --- size classes from a real inventory ----------------------------------------------------------

TEST(PoolClasses, Llama2_70bParametersFallIntoTheFiveShapesThatOccur) {
  const std::vector<TensorSpec> inventory = inventory_of("llama-2-70b");
  const std::vector<StagedTensor> params = staged_tensors(inventory, kParameterStream);
  ASSERT_EQ(params.size(), 80u * 9 + 3);  // 9 per layer, embedding, final norm, head
  const std::vector<SizeClass> classes = derive_size_classes(params, 0.02, 16);
  // Norms (8192 bf16), k/v (1024 x 8192), q/o (8192 x 8192), MLP (28672 x 8192), embedding /
  // head (32000 x 8192), all bf16: found from the data.
  const std::vector<uint64_t> expected = {8192ull * 2, 1024ull * 8192 * 2, 8192ull * 8192 * 2,
                                          28672ull * 8192 * 2, 32000ull * 8192 * 2};
  std::vector<uint64_t> found;
  found.reserve(classes.size());
  for (const SizeClass& c : classes) found.push_back(c.slot_bytes);
  EXPECT_EQ(found, expected);
  EXPECT_EQ(classes[0].tensors, 80u * 2 + 1);  // two norms per layer and the final norm
  EXPECT_EQ(classes[1].tensors, 80u * 2);
  EXPECT_EQ(classes[3].tensors, 80u * 3);
  EXPECT_EQ(classes[4].tensors, 2u);
}

TEST(PoolClasses, SizesWithinTheToleranceMergeAndTheClassCountIsCapped) {
  const std::vector<uint64_t> sizes = {1000, 1010, 1019, 2000, 4000, 4050, 9000};
  const std::vector<StagedTensor> tensors =
      staged_tensors_from_sizes(sizes, TensorKind::kParameter);
  const std::vector<SizeClass> merged = derive_size_classes(tensors, 0.02, 16);
  ASSERT_EQ(merged.size(), 4u);
  EXPECT_EQ(merged[0].slot_bytes, 1019u);  // a class's slot is its largest member
  EXPECT_EQ(merged[0].distinct_sizes, 3u);
  EXPECT_EQ(merged[0].smallest_bytes, 1000u);
  EXPECT_EQ(merged[2].slot_bytes, 4050u);

  const std::vector<SizeClass> exact = derive_size_classes(tensors, 0.0, 16);
  EXPECT_EQ(exact.size(), sizes.size());
  // At most two classes: the cheapest merges happen first, the largest size always survives.
  const std::vector<SizeClass> two = derive_size_classes(tensors, 0.0, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two.back().slot_bytes, 9000u);
}

TEST(PoolPlan, StrataOnLlama2_70bReservesWithinTwoPercentOfWhatIsInFlight) {
  const std::vector<TensorSpec> inventory = inventory_of("llama-2-70b");
  const std::vector<StagedTensor> params = staged_tensors(inventory, kParameterStream);
  // Lookahead 1 (one layer in flight, no overlap) is the exception: the embedding/head buffer can
  // stand in for only one of a layer's three MLP buffers, 52 MiB over 1.6 GiB (3%). That is
  // still the fewest bytes any set of fixed slots could stage the windows with.
  {
    PoolOptions o;
    o.lookahead = 1;
    Result<PoolPlan> plan = plan_pool(params, o, 0);
    ASSERT_TRUE(plan.is_ok());
    const uint64_t layer = 2 * 134217728ull + 2 * 16777216ull + 3 * 469762048ull + 2 * 16384ull;
    EXPECT_EQ(plan->requested_bytes, layer);
    EXPECT_EQ(plan->reserved_bytes, layer + (524288000ull - 469762048ull));
  }
  // The default lookahead of 2, and 3.
  for (uint32_t lookahead : {2u, 3u}) {
    PoolOptions o;
    o.lookahead = lookahead;
    Result<PoolPlan> plan = plan_pool(params, o, 0);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    EXPECT_EQ(plan->lookahead, lookahead);
    EXPECT_GE(plan->reserved_bytes, plan->requested_bytes);
    EXPECT_LE(static_cast<double>(plan->reserved_bytes),
              1.02 * static_cast<double>(plan->requested_bytes))
        << "lookahead " << lookahead;
  }
  // Staged in step order without moving, the buffer an MLP projection borrows from the head can
  // be held by a layer still in flight when the head's turn comes (lookahead 4: layer 79 through
  // the forward/backward turnaround); the plan then holds one more large buffer, never more here.
  for (uint32_t lookahead = 1; lookahead <= 8; ++lookahead) {
    for (const bool no_waiting : {false, true}) {
      PoolOptions o;
      o.lookahead = lookahead;
      o.no_waiting = no_waiting;
      Result<PoolPlan> plan = plan_pool(params, o, 0);
      ASSERT_TRUE(plan.is_ok());
      EXPECT_LE(plan->reserved_bytes, plan->requested_bytes + 524288000ull + 54525952ull)
          << "lookahead " << lookahead << (no_waiting ? " no waiting" : "");
    }
  }
}

TEST(PoolPlan, EveryWindowFitsTheStrataBuffersWhenTensorsMayBorrowLargerOnes) {
  const std::vector<TensorSpec> inventory = inventory_of("llama-3.1-8b");
  const std::vector<StagedTensor> tensors =
      staged_tensors(inventory, kParameterStream | kind_bit(TensorKind::kGradient));
  PoolOptions o;
  o.lookahead = 3;
  Result<PoolPlan> plan = plan_pool(tensors, o, 0);
  ASSERT_TRUE(plan.is_ok());
  for (const Window& w : staging_windows(tensors, 3)) {
    // Largest tensor first, each into the smallest free buffer that holds it: optimal when
    // buffers nest by size, so a failure here means the plan is short of buffers.
    std::vector<uint64_t> sizes;
    for (uint32_t i : w.tensors) sizes.push_back(tensors[i].bytes);
    std::sort(sizes.rbegin(), sizes.rend());
    std::multiset<uint64_t> buffers;
    for (const SizeClass& c : plan->classes) {
      for (uint32_t n = 0; n < c.count; ++n) buffers.insert(c.slot_bytes);
    }
    for (uint64_t bytes : sizes) {
      const auto it = buffers.lower_bound(bytes);
      ASSERT_NE(it, buffers.end()) << "no buffer for a tensor of " << bytes << " bytes";
      buffers.erase(it);
    }
  }
}

TEST(PoolPlan, ABudgetShortensTheLookaheadAndTooSmallABudgetIsAnError) {
  const std::vector<TensorSpec> inventory = inventory_of("llama-2-7b");
  const std::vector<StagedTensor> params = staged_tensors(inventory, kParameterStream);
  PoolOptions o;
  o.lookahead = 4;
  Result<PoolPlan> unlimited = plan_pool(params, o, 0);
  ASSERT_TRUE(unlimited.is_ok());
  o.lookahead = 2;
  Result<PoolPlan> two = plan_pool(params, o, 0);
  ASSERT_TRUE(two.is_ok());

  o.lookahead = 4;
  Result<PoolPlan> budgeted = plan_pool(params, o, two->reserved_bytes);
  ASSERT_TRUE(budgeted.is_ok());
  EXPECT_EQ(budgeted->lookahead, 2u);
  EXPECT_LE(budgeted->reserved_bytes, two->reserved_bytes);

  Result<PoolPlan> none = plan_pool(params, o, 1 << 20);
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), STRATA_E_PINNED_BUDGET);
  EXPECT_NE(none.status().message().find("1048576 B"), std::string::npos);
}

TEST(PoolPlan, ZeroInfinitySlotsAreUniformAndSizedForTheLargestTensor) {
  const std::vector<TensorSpec> inventory = inventory_of("llama-2-70b");
  const std::vector<StagedTensor> params = staged_tensors(inventory, kParameterStream);
  PoolOptions o;
  o.policy = PoolPolicy::kZeroInfinity;
  o.lookahead = 2;
  Result<PoolPlan> plan = plan_pool(params, o, 0);
  ASSERT_TRUE(plan.is_ok());
  ASSERT_EQ(plan->classes.size(), 1u);
  // buffer_size = max(1e8 elements, the embedding's 262M elements) in bf16.
  EXPECT_EQ(plan->classes[0].slot_bytes, 32000ull * 8192 * 2);
  // Two layers in flight: 18 tensors, more than DeepSpeed's default of 5 slots.
  EXPECT_EQ(plan->classes[0].count, 18u);
  EXPECT_EQ(plan->reserved_bytes, 18ull * 32000 * 8192 * 2);
  EXPECT_GT(plan->reserved_bytes, 2 * plan->requested_bytes);

  // A tiny model: the default 5 slots, each of 1e8 elements however small the tensors are.
  const std::vector<uint64_t> sizes = {4096, 8192, 4096};
  const std::vector<StagedTensor> small = staged_tensors_from_sizes(sizes, TensorKind::kParameter);
  Result<PoolPlan> tiny = plan_pool(small, o, 0);
  ASSERT_TRUE(tiny.is_ok());
  EXPECT_EQ(tiny->classes[0].count, 5u);
  EXPECT_EQ(tiny->classes[0].slot_bytes, 100'000'000ull * 2);

  o.zero_pow2_block = true;
  Result<PoolPlan> rounded = plan_pool(small, o, 0);
  ASSERT_TRUE(rounded.is_ok());
  EXPECT_EQ(rounded->reserved_bytes, next_power_of_two(5 * 100'000'000ull * 2));
}

// --- pools with real (unlocked) pinned memory ---------------------------------------------------

TEST(BufferPool, ZeroInfinityHandsOutItsUniformSlotsAndNoMore) {
  auto arena = dry_arena(2ull << 30);
  const std::vector<uint64_t> sizes = {4096, 1 << 20, 4096};
  const std::vector<StagedTensor> tensors =
      staged_tensors_from_sizes(sizes, TensorKind::kParameter);
  PoolOptions o;
  o.policy = PoolPolicy::kZeroInfinity;
  o.zero_buffer_size_elements = 1 << 20;  // 2 MiB slots
  Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, tensors, o);
  ASSERT_TRUE(pool.is_ok()) << pool.status().message();
  BufferPool& p = **pool;
  EXPECT_EQ(p.stats().buffers, 5u);
  EXPECT_EQ(p.stats().reserved_bytes, 5u * (2u << 20));
  EXPECT_EQ(arena->stats().reserved_bytes, 5u * (2u << 20));

  std::vector<PoolBuffer> held;
  std::set<std::byte*> addresses;
  for (int i = 0; i < 5; ++i) {
    Result<PoolBuffer> b = p.try_acquire(i % 2 ? 4096 : (1 << 20), TensorKind::kParameter);
    ASSERT_TRUE(b.is_ok() && b->valid());
    EXPECT_EQ(b->capacity(), 2u << 20);  // every tensor takes a whole slot
    addresses.insert(b->data());
    held.push_back(std::move(b).value());
  }
  EXPECT_EQ(addresses.size(), 5u);
  // DeepSpeed would fail here ("not enough swap buffers"); the pool says busy.
  Result<PoolBuffer> sixth = p.try_acquire(4096, TensorKind::kParameter);
  ASSERT_TRUE(sixth.is_ok());
  EXPECT_FALSE(sixth->valid());
  EXPECT_EQ(p.stats().busy, 1u);
  // Larger than a slot: never fits.
  EXPECT_EQ(p.try_acquire((2 << 20) + 1, TensorKind::kParameter).status().code(), STRATA_E_INVALID);
  held.pop_back();
  EXPECT_TRUE(p.try_acquire(4096, TensorKind::kParameter)->valid());
}

TEST(BufferPool, Pow2RoundsUpCachesAndReusesBestFit) {
  auto arena = dry_arena(1ull << 30);
  const std::vector<uint64_t> sizes = {(5 << 20) + 1, 3 << 20};
  const std::vector<StagedTensor> tensors =
      staged_tensors_from_sizes(sizes, TensorKind::kParameter);
  PoolOptions o;
  o.policy = PoolPolicy::kPow2;
  Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, tensors, o);
  ASSERT_TRUE(pool.is_ok());
  BufferPool& p = **pool;
  EXPECT_EQ(p.stats().reserved_bytes, 0u);  // grows on demand
  {
    Result<PoolBuffer> a = p.try_acquire((5 << 20) + 1, TensorKind::kParameter);
    ASSERT_TRUE(a.is_ok() && a->valid());
    EXPECT_EQ(a->capacity(), 8u << 20);  // the caching allocator's doubling
    Result<PoolBuffer> b = p.try_acquire(3 << 20, TensorKind::kParameter);
    EXPECT_EQ(b->capacity(), 4u << 20);
    EXPECT_EQ(arena->stats().reserved_bytes, 12u << 20);
  }
  // Cached: the same requests again map nothing new; a small one reuses a cached block.
  Result<PoolBuffer> c = p.try_acquire(3 << 20, TensorKind::kParameter);
  Result<PoolBuffer> d = p.try_acquire(3 << 20, TensorKind::kParameter);
  EXPECT_EQ(c->capacity(), 4u << 20);
  EXPECT_EQ(d->capacity(), 8u << 20);  // best fit among cached blocks, as lower_bound does
  EXPECT_EQ(arena->stats().reserved_bytes, 12u << 20);
  EXPECT_EQ(p.stats().borrowed, 1u);
}

TEST(BufferPool, StrataBuffersAreExactSlabsOfTheArena) {
  Accounting accounting;
  auto arena = dry_arena(64ull << 30, &accounting);
  const std::vector<TensorSpec> inventory = inventory_of("llama-2-7b");
  const std::vector<StagedTensor> params = staged_tensors(inventory, kParameterStream);
  PoolOptions o;
  o.lookahead = 2;
  Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, params, o);
  ASSERT_TRUE(pool.is_ok()) << pool.status().message();
  BufferPool& p = **pool;
  uint64_t expected = 0;
  uint32_t buffers = 0;
  for (const SizeClass& c : p.plan().classes) {
    expected += c.count * align_up(c.slot_bytes, 4096);
    buffers += c.count;
  }
  EXPECT_EQ(p.stats().reserved_bytes, expected);
  EXPECT_EQ(p.plan().reserved_bytes, expected);
  EXPECT_EQ(arena->stats().reserved_bytes, expected);
  EXPECT_EQ(arena->stats().allocations, buffers);  // one arena allocation per buffer
  EXPECT_EQ(accounting.tier(Tier::kPinned).reserved_bytes, expected);
  EXPECT_EQ(accounting.tier(Tier::kPinned).in_use_bytes, 0u);

  // A tensor of each class gets a buffer of exactly its class; use is counted by kind.
  const uint64_t q_bytes = 4096ull * 4096 * 2;
  Result<PoolBuffer> q = p.try_acquire(q_bytes, TensorKind::kParameter);
  ASSERT_TRUE(q.is_ok() && q->valid());
  EXPECT_EQ(q->capacity(), q_bytes);
  EXPECT_EQ(accounting.kind(Tier::kPinned, TensorKind::kParameter).in_use_bytes, q_bytes);
  // Not in the inventory: the exact-size path.
  EXPECT_EQ(p.try_acquire(64ull << 30, TensorKind::kOther).status().code(), STRATA_E_INVALID);
  Result<PinnedBuffer> extra = p.allocate_exact(12345, TensorKind::kOther);
  ASSERT_TRUE(extra.is_ok());
  EXPECT_EQ(extra->reserved_bytes(), 16384u);
  q->reset();
  EXPECT_EQ(accounting.tier(Tier::kPinned).in_use_bytes, 12345u);
}

TEST(BufferPool, AStepOfLlamaWindowsRunsThroughTheStrataPoolWithoutStalling) {
  // Narrowed so the buffers are small enough to touch; the same mix of shapes as the full model.
  InventoryOptions io;
  io.scale = 1.0 / 16;
  io.layers = 6;
  const std::vector<TensorSpec> inventory = inventory_of("llama-2-70b", io);
  const std::vector<StagedTensor> tensors =
      staged_tensors(inventory, kParameterStream | kind_bit(TensorKind::kGradient));
  for (uint32_t lookahead : {1u, 2u, 3u}) {
    auto arena = dry_arena(8ull << 30);
    PoolOptions o;
    o.lookahead = lookahead;
    Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, tensors, o);
    ASSERT_TRUE(pool.is_ok());
    const uint64_t reserved = arena->stats().reserved_bytes;
    const std::vector<Window> windows = staging_windows(tensors, lookahead);
    Result<ReplayResult> r = replay_step(**pool, tensors, windows, {.verify_data = true});
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->unstaged_at_use, 0u) << "lookahead " << lookahead;
    EXPECT_EQ((*pool)->stats().buffers_in_use, 0u);
    EXPECT_EQ(arena->stats().reserved_bytes, reserved);  // no growth

    // Sized so that nothing ever waits: the whole window is always in flight.
    o.no_waiting = true;
    Result<std::unique_ptr<BufferPool>> strict = BufferPool::create(*arena, tensors, o);
    ASSERT_TRUE(strict.is_ok());
    Result<ReplayResult> s = replay_step(**strict, tensors, windows, {.verify_data = true});
    ASSERT_TRUE(s.is_ok());
    EXPECT_EQ(s->deferred, 0u) << "lookahead " << lookahead;
    EXPECT_EQ(s->peak_in_flight_bytes, (*strict)->plan().requested_bytes);
    EXPECT_GE((*strict)->plan().reserved_bytes, (*pool)->plan().reserved_bytes);
  }
}

TEST(BufferPool, RandomAcquireReleaseNeitherLeaksNorGrowsNorOverlaps) {
  const std::vector<TensorSpec> inventory = inventory_of("tinyllama-1.1b");
  const std::vector<StagedTensor> tensors = staged_tensors(inventory, kParameterStream);
  auto arena = dry_arena(4ull << 30);
  PoolOptions o;
  o.lookahead = 2;
  Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, tensors, o);
  ASSERT_TRUE(pool.is_ok());
  BufferPool& p = **pool;
  const PoolStats start = p.stats();
  const uint64_t arena_reserved = arena->stats().reserved_bytes;

  std::mt19937_64 rng(7);
  std::map<std::byte*, std::pair<PoolBuffer, uint64_t>> held;  // data -> (buffer, stamp)
  uint64_t stamp = 0;
  for (int step = 0; step < 20000; ++step) {
    if (held.empty() || rng() % 100 < 50) {
      const StagedTensor& t = tensors[rng() % tensors.size()];
      Result<PoolBuffer> b = p.try_acquire(t.bytes, t.kind);
      ASSERT_TRUE(b.is_ok());
      if (!b->valid()) continue;
      ASSERT_GE(b->capacity(), t.bytes);
      // Disjoint from every buffer on loan.
      auto next = held.lower_bound(b->data());
      if (next != held.end()) ASSERT_LE(b->data() + b->capacity(), next->first);
      if (next != held.begin()) {
        const auto& prev = *std::prev(next);
        ASSERT_LE(prev.first + prev.second.first.capacity(), b->data());
      }
      ++stamp;
      std::memcpy(b->data(), &stamp, sizeof stamp);
      std::memcpy(b->data() + t.bytes - sizeof stamp, &stamp, sizeof stamp);
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
  const PoolStats end = p.stats();
  EXPECT_EQ(end.buffers_in_use, 0u);
  EXPECT_EQ(end.in_use_bytes, 0u);
  EXPECT_EQ(end.buffers, start.buffers);
  EXPECT_EQ(end.reserved_bytes, start.reserved_bytes);
  EXPECT_EQ(arena->stats().reserved_bytes, arena_reserved);
  EXPECT_GT(end.acquires, 1000u);
}

TEST(BufferPool, AcquireWaitsForAReleaseOrTimesOut) {
  auto arena = dry_arena(1ull << 30);
  const std::vector<uint64_t> sizes = {1 << 20};
  const std::vector<StagedTensor> tensors =
      staged_tensors_from_sizes(sizes, TensorKind::kParameter);
  PoolOptions o;
  o.lookahead = 1;
  Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, tensors, o);
  ASSERT_TRUE(pool.is_ok());
  BufferPool& p = **pool;
  ASSERT_EQ(p.stats().buffers, 1u);
  Result<PoolBuffer> only = p.try_acquire(1 << 20, TensorKind::kParameter);
  ASSERT_TRUE(only->valid());

  Result<PoolBuffer> timed_out =
      p.acquire(1 << 20, TensorKind::kParameter, std::chrono::milliseconds(20));
  EXPECT_EQ(timed_out.status().code(), STRATA_E_TIMEOUT);

  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    only->reset();
  });
  Result<PoolBuffer> waited = p.acquire(1 << 20, TensorKind::kParameter, std::chrono::seconds(10));
  releaser.join();
  ASSERT_TRUE(waited.is_ok());
  EXPECT_TRUE(waited->valid());
}

TEST(BufferPool, ConcurrentAcquireAndReleaseKeepTheCountsExact) {
  auto arena = dry_arena(1ull << 30);
  std::vector<uint64_t> sizes(12, 64 << 10);
  const std::vector<StagedTensor> tensors =
      staged_tensors_from_sizes(sizes, TensorKind::kParameter);
  PoolOptions o;
  o.lookahead = 6;
  Result<std::unique_ptr<BufferPool>> pool = BufferPool::create(*arena, tensors, o);
  ASSERT_TRUE(pool.is_ok());
  BufferPool& p = **pool;
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&p] {
      for (int i = 0; i < 5000; ++i) {
        Result<PoolBuffer> b = p.acquire(64 << 10, TensorKind::kGradient, std::chrono::seconds(10));
        ASSERT_TRUE(b.is_ok() && b->valid());
        b->data()[0] = std::byte{1};
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(p.stats().acquires, 20000u);
  EXPECT_EQ(p.stats().buffers_in_use, 0u);
  EXPECT_LE(p.stats().peak_in_use_bytes, uint64_t{p.stats().buffers} * (64 << 10));
}

}  // namespace
}  // namespace strata::memory
