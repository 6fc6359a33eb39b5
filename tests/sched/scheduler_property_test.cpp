// Property tests: random schedules, random sizes, budgets barely above one phase's working set
// (so nearly every access evicts something), a backend that really stores bytes and completes
// out of step with the caller. Whatever the interleaving, every byte read back is the byte last
// written, budgets are never exceeded, and nothing leaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>

#include "sched/sched_test_util.h"

namespace strata::sched {
namespace {

using testing::check_pattern;
using testing::fill_pattern;
using testing::flat_spec;
using testing::Harness;
using testing::kWait;
using testing::Watchdog;

struct PlannedAccess {
  int tensor;
  Tier tier;
  AccessMode mode;
  bool modify;
};

struct Scenario {
  std::vector<uint64_t> sizes;
  std::vector<std::vector<PlannedAccess>> phases;
  uint64_t pinned_budget = 0;
  uint64_t device_budget = 0;
};

Scenario random_scenario(uint32_t seed) {
  std::mt19937 random(seed);
  Scenario s;
  const int tensors = 6 + static_cast<int>(random() % 14);
  for (int i = 0; i < tensors; ++i) {
    // Odd sizes on purpose: exact accounting must round, transfers must move every byte.
    s.sizes.push_back(1 + random() % (6 * kPageSize));
  }
  const int phases = 3 + static_cast<int>(random() % 6);
  uint64_t largest = 0;
  for (uint64_t size : s.sizes) largest = std::max(largest, align_up(size, kPageSize));
  for (int p = 0; p < phases; ++p) {
    std::vector<PlannedAccess> phase;
    std::vector<int> order(tensors);
    for (int i = 0; i < tensors; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), random);
    const int n = 1 + static_cast<int>(random() % 3);
    uint64_t pinned = 0, device = 0;
    for (int k = 0; k < n; ++k) {
      PlannedAccess a;
      a.tensor = order[k];
      a.tier = random() % 2 ? Tier::kDevice : Tier::kPinned;
      a.mode = random() % 5 == 0 ? AccessMode::kOverwrite : AccessMode::kRead;
      a.modify = random() % 2 == 0;
      const uint64_t charged = align_up(s.sizes[a.tensor], kPageSize);
      (a.tier == Tier::kPinned ? pinned : device) += charged;
      phase.push_back(a);
    }
    // Room for what the phase holds, plus a staging buffer and a device->pinned cleaning buffer.
    s.pinned_budget = std::max(s.pinned_budget, pinned + 2 * largest);
    s.device_budget = std::max(s.device_budget, align_up(device + largest, 256));
    s.phases.push_back(std::move(phase));
  }
  return s;
}

// Adds the scenario's evictions to *evictions (the budgets are meant to force them).
void run_scenario(uint32_t seed, bool declare, double headroom, uint64_t* evictions) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Scenario sc = random_scenario(seed);
  SchedulerConfig config = testing::small_config(sc.pinned_budget, sc.device_budget, headroom);
  config.max_inflight = {2, 2, 2, 2};
  config.window.max_phases = 4;
  Harness harness(config, /*max_delay_us=*/30);
  Scheduler& s = harness.s();
  std::mt19937 random(seed * 7 + 1);

  std::vector<TensorHandle> handles;
  for (size_t i = 0; i < sc.sizes.size(); ++i) {
    Result<TensorHandle> h = s.register_tensor(flat_spec("t" + std::to_string(i), sc.sizes[i]));
    ASSERT_TRUE(h.is_ok());
    handles.push_back(*h);
  }
  // version 0: never written (contents undefined), else the last version written.
  std::vector<uint64_t> version(sc.sizes.size(), 0);
  std::vector<bool> wrote(sc.sizes.size(), false);
  uint64_t next_version = 1;

  if (declare) {
    AccessSchedule::Builder builder;
    for (size_t p = 0; p < sc.phases.size(); ++p) {
      builder.begin_phase({PhaseKind::kForward, static_cast<int32_t>(p)});
      for (const PlannedAccess& a : sc.phases[p]) {
        ASSERT_TRUE(builder.add({handles[a.tensor], a.tier, a.mode}).is_ok());
      }
    }
    ASSERT_TRUE(s.declare_schedule(std::move(builder).build().value()).is_ok());
  }

  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(s.begin_step().is_ok());
    for (size_t p = 0; p < sc.phases.size(); ++p) {
      const PhaseKey key{PhaseKind::kForward, static_cast<int32_t>(p)};
      ASSERT_TRUE(s.begin_phase(key).is_ok());
      for (const PlannedAccess& a : sc.phases[p]) {
        const TensorHandle h = handles[a.tensor];
        const uint64_t bytes = sc.sizes[a.tensor];
        // A tensor without contents can only be written (a read is STRATA_E_STATE).
        const AccessMode mode = version[a.tensor] == 0 ? AccessMode::kOverwrite : a.mode;
        if (version[a.tensor] == 0 && a.mode == AccessMode::kRead) {
          ASSERT_EQ(s.acquire(h, a.tier, AccessMode::kRead, kWait).status().code(), STRATA_E_STATE);
        }
        Result<Acquired> got = s.acquire(h, a.tier, mode, kWait);
        ASSERT_TRUE(got.is_ok()) << got.status().message();
        ASSERT_EQ(got->bytes, bytes);
        if (mode == AccessMode::kRead) {
          ASSERT_EQ(check_pattern(got->data, bytes, h.index, version[a.tensor]), -1)
              << "tensor " << a.tensor << " version " << version[a.tensor] << " on "
              << to_string(a.tier) << ", step " << step << " phase " << p;
        }
        const bool write = mode == AccessMode::kOverwrite || a.modify;
        if (write) {
          version[a.tensor] = next_version++;
          fill_pattern(got->data, bytes, h.index, version[a.tensor]);
        }
        wrote[a.tensor] = write;
      }
      // Held until the phase ends, like a framework keeping a layer's weights.
      for (const PlannedAccess& a : sc.phases[p]) {
        ASSERT_TRUE(s.release(handles[a.tensor], wrote[a.tensor]).is_ok());
      }
      ASSERT_TRUE(s.end_phase(key).is_ok());
      const SchedulerStats stats = s.stats();
      for (const PoolUsage& pool : stats.pools) ASSERT_LE(pool.in_use_bytes, pool.budget_bytes);
      // Now and then the framework discards a tensor (a consumed gradient).
      if (random() % 11 == 0) {
        const int victim = static_cast<int>(random() % sc.sizes.size());
        ASSERT_TRUE(s.discard(handles[victim]).is_ok());
        version[victim] = 0;
      }
    }
    ASSERT_TRUE(s.end_step().is_ok());
  }
  ASSERT_TRUE(s.flush(kWait).is_ok());
  for (size_t i = 0; i < sc.sizes.size(); ++i) {
    if (version[i] == 0) continue;
    for (Tier tier : {Tier::kPinned, Tier::kDevice}) {
      Result<Acquired> got = s.acquire(handles[i], tier, AccessMode::kRead, kWait);
      ASSERT_TRUE(got.is_ok()) << got.status().message();
      EXPECT_EQ(check_pattern(got->data, sc.sizes[i], handles[i].index, version[i]), -1)
          << "tensor " << i << " at the end, on " << to_string(tier);
      ASSERT_TRUE(s.release(handles[i], false).is_ok());
    }
  }
  const SchedulerStats stats = s.stats();
  EXPECT_EQ(stats.dirty_bytes, 0u);
  EXPECT_EQ(stats.transfer_failures, 0u);
  *evictions += stats.evictions;
  // No churn: evictions chasing each other would show as many transfers per acquire.
  uint64_t transfers = 0;
  for (uint64_t n : stats.link_transfers) transfers += n;
  EXPECT_LE(transfers, 8 * stats.acquires) << "transfers per acquire";
  harness.scheduler.reset();
  EXPECT_EQ(harness.backend.live_buffers(), 0u);
  EXPECT_EQ(harness.backend.live_extents(), 0u);
}

TEST(SchedulerProperty, RandomRecordedSchedulesUnderTinyBudgetsKeepEveryByte) {
  Watchdog watchdog(240, "recorded-schedule property test");
  uint64_t evictions = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    run_scenario(seed, /*declare=*/false, /*headroom=*/0.0, &evictions);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(evictions, 100u);
}

TEST(SchedulerProperty, RandomDeclaredSchedulesWithWriteBehindKeepEveryByte) {
  Watchdog watchdog(240, "declared-schedule property test");
  uint64_t evictions = 0;
  for (uint32_t seed = 101; seed <= 112; ++seed) {
    run_scenario(seed, /*declare=*/true, /*headroom=*/0.3, &evictions);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(evictions, 100u);
}

// Several threads acquire and release at once, each writing only its own tensors and reading
// shared ones, through pools far smaller than the data.
TEST(SchedulerConcurrency, ManyThreadsAcquiringAndReleasingKeepEveryByte) {
  Watchdog watchdog(180, "concurrency test");
  constexpr int kThreads = 4, kOwn = 4, kShared = 3, kIterations = 300;
  constexpr uint64_t kBytes = 3 * kPageSize + 100;
  const uint64_t charged = align_up(kBytes, kPageSize);
  Harness harness(testing::small_config(8 * charged, 5 * charged, 0.2), /*max_delay_us=*/20);
  Scheduler& s = harness.s();
  std::vector<TensorHandle> shared;
  for (int i = 0; i < kShared; ++i) {
    const TensorHandle h =
        s.register_tensor(flat_spec("shared" + std::to_string(i), kBytes)).value();
    Result<Acquired> a = s.acquire(h, Tier::kPinned, AccessMode::kOverwrite, kWait);
    ASSERT_TRUE(a.is_ok());
    fill_pattern(a->data, kBytes, h.index, 1);
    ASSERT_TRUE(s.release(h, true).is_ok());
    shared.push_back(h);
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(1000 + t);
      std::vector<TensorHandle> own;
      std::vector<uint64_t> version(kOwn, 0);
      for (int i = 0; i < kOwn; ++i) {
        Result<TensorHandle> h = s.register_tensor(
            flat_spec("own" + std::to_string(t) + "." + std::to_string(i), kBytes));
        if (!h) {
          ++failures;
          return;
        }
        own.push_back(*h);
      }
      for (int it = 0; it < kIterations && failures == 0; ++it) {
        if (random() % 4 == 0) {
          const TensorHandle h = shared[random() % kShared];
          Result<Acquired> a = s.acquire(h, Tier::kPinned, AccessMode::kRead, kWait);
          if (!a || check_pattern(a->data, kBytes, h.index, 1) != -1) {
            ADD_FAILURE() << "shared read: " << (a ? "wrong bytes" : a.status().message());
            ++failures;
            if (a) (void)s.release(h, false);
            return;
          }
          if (!s.release(h, false).is_ok()) ++failures;
          continue;
        }
        const int i = static_cast<int>(random() % kOwn);
        const TensorHandle h = own[i];
        const Tier tier = random() % 2 ? Tier::kDevice : Tier::kPinned;
        const bool overwrite = version[i] == 0 || random() % 3 == 0;
        Result<Acquired> a =
            s.acquire(h, tier, overwrite ? AccessMode::kOverwrite : AccessMode::kRead, kWait);
        if (!a) {
          ADD_FAILURE() << a.status().message();
          ++failures;
          return;
        }
        if (!overwrite && check_pattern(a->data, kBytes, h.index, version[i]) != -1) {
          ADD_FAILURE() << "thread " << t << " tensor " << i << " lost version " << version[i];
          ++failures;
        }
        const bool write = overwrite || random() % 2 == 0;
        if (write) {
          version[i] = static_cast<uint64_t>(it + 1) * 16 + t;
          fill_pattern(a->data, kBytes, h.index, version[i]);
        }
        if (!s.release(h, write).is_ok()) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(s.flush(kWait).is_ok());
  const SchedulerStats stats = s.stats();
  EXPECT_EQ(stats.dirty_bytes, 0u);
  for (const PoolUsage& pool : stats.pools) EXPECT_LE(pool.peak_in_use_bytes, pool.budget_bytes);
  EXPECT_GT(stats.evictions, 0u);
  EXPECT_EQ(stats.acquire_timeouts, 0u);
}

}  // namespace
}  // namespace strata::sched
