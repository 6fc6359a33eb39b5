// The scheduler's behaviour over a backend that really stores bytes.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include "sched/sched_test_util.h"

namespace strata::sched {
namespace {

using testing::check_pattern;
using testing::expect_version;
using testing::flat_spec;
using testing::Harness;
using testing::kWait;
using testing::small_config;
using testing::Watchdog;
using testing::write_version;

constexpr uint64_t kT = 64 << 10;  // tensor size used below (a 16-page buffer)

TEST(Scheduler, DataSurvivesEvictionToNvmeAndBack) {
  Watchdog watchdog(60);
  Harness harness(small_config(2 * kT, 2 * kT));
  Scheduler& s = harness.s();
  std::vector<TensorHandle> t;
  for (int i = 0; i < 6; ++i) {
    Result<TensorHandle> h = s.register_tensor(flat_spec("t" + std::to_string(i), kT));
    ASSERT_TRUE(h.is_ok());
    t.push_back(*h);
  }
  for (int i = 0; i < 6; ++i) write_version(s, t[i], Tier::kPinned, 1, kT);
  // Six tensors through a pool of two: most were written back and evicted.
  EXPECT_GE(harness.backend.transfers(Link::kNvmeWrite), 4u);
  for (int i = 0; i < 6; ++i) expect_version(s, t[i], Tier::kPinned, 1, kT);
  for (int i = 0; i < 6; ++i) expect_version(s, t[i], Tier::kDevice, 1, kT);
  const SchedulerStats stats = s.stats();
  EXPECT_LE(stats.pools[0].peak_in_use_bytes, 2 * kT);
  EXPECT_LE(stats.pools[1].peak_in_use_bytes, 2 * kT);
}

TEST(Scheduler, StaleAndZeroHandlesAreBadHandles) {
  Watchdog watchdog(30);
  Harness harness(small_config(4 * kT, 4 * kT));
  Scheduler& s = harness.s();
  Result<TensorHandle> h = s.register_tensor(flat_spec("a", kT));
  ASSERT_TRUE(h.is_ok());
  ASSERT_TRUE(s.unregister_tensor(*h).is_ok());
  EXPECT_EQ(s.acquire(*h, Tier::kPinned, AccessMode::kRead, kWait).status().code(),
            STRATA_E_BAD_HANDLE);
  EXPECT_EQ(s.release(*h, false).code(), STRATA_E_BAD_HANDLE);
  EXPECT_EQ(s.prefetch(TensorHandle{}, Tier::kPinned).code(), STRATA_E_BAD_HANDLE);
  EXPECT_EQ(s.describe(TensorHandle::from_u64(0)).status().code(), STRATA_E_BAD_HANDLE);
  Result<TensorHandle> again = s.register_tensor(flat_spec("b", kT));
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(s.discard(*h).code(), STRATA_E_BAD_HANDLE);  // old handle, reused slot
}

TEST(Scheduler, MisuseIsAStateErrorNotACrash) {
  Watchdog watchdog(30);
  Harness harness(small_config(4 * kT, 4 * kT));
  Scheduler& s = harness.s();
  const TensorHandle h = s.register_tensor(flat_spec("a", kT)).value();
  EXPECT_EQ(s.release(h, false).code(), STRATA_E_STATE);  // not acquired
  EXPECT_EQ(s.acquire(h, Tier::kPinned, AccessMode::kRead, kWait).status().code(),
            STRATA_E_STATE);  // nothing to read yet
  write_version(s, h, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.acquire(h, Tier::kPinned, AccessMode::kRead, kWait).is_ok());
  EXPECT_EQ(s.acquire(h, Tier::kDevice, AccessMode::kRead, kWait).status().code(), STRATA_E_STATE);
  EXPECT_EQ(s.acquire(h, Tier::kPinned, AccessMode::kOverwrite, kWait).status().code(),
            STRATA_E_STATE);
  EXPECT_EQ(s.unregister_tensor(h).code(), STRATA_E_STATE);
  EXPECT_EQ(s.discard(h).code(), STRATA_E_STATE);
  ASSERT_TRUE(s.acquire(h, Tier::kPinned, AccessMode::kRead, kWait).is_ok());  // nests
  ASSERT_TRUE(s.release(h, false).is_ok());
  ASSERT_TRUE(s.release(h, false).is_ok());
  EXPECT_EQ(s.acquire(h, Tier::kNvme, AccessMode::kRead, kWait).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(s.end_phase({PhaseKind::kForward, 0}).code(), STRATA_E_STATE);
  EXPECT_EQ(s.end_step().code(), STRATA_E_STATE);
}

TEST(Scheduler, ATensorLargerThanItsBudgetFailsAtOnce) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, 4 * kT));
  Scheduler& s = harness.s();
  const TensorHandle big = s.register_tensor(flat_spec("big", 2 * kT)).value();
  const Result<Acquired> a = s.acquire(big, Tier::kPinned, AccessMode::kOverwrite, kWait);
  EXPECT_EQ(a.status().code(), STRATA_E_PINNED_BUDGET);
  EXPECT_NE(a.status().message().find("pool 'pinned'"), std::string::npos) << a.status().message();
  RegisterOptions home;
  home.home = Tier::kPinned;
  EXPECT_EQ(s.register_tensor(flat_spec("big-home", 2 * kT), home).status().code(),
            STRATA_E_PINNED_BUDGET);
}

TEST(Scheduler, AcquireWaitingOnAnotherAcquireTimesOut) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  write_version(s, a, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.acquire(a, Tier::kPinned, AccessMode::kRead, kWait).is_ok());
  const auto start = std::chrono::steady_clock::now();
  const Result<Acquired> blocked =
      s.acquire(b, Tier::kPinned, AccessMode::kOverwrite, std::chrono::milliseconds(200));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(blocked.status().code(), STRATA_E_TIMEOUT);
  EXPECT_NE(blocked.status().message().find("'b'"), std::string::npos);
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  EXPECT_EQ(s.stats().acquire_timeouts, 1u);
  // Once a is released, b fits (a is written back first: it is the only copy).
  ASSERT_TRUE(s.release(a, false).is_ok());
  write_version(s, b, Tier::kPinned, 1, kT);
  expect_version(s, a, Tier::kPinned, 1, kT);
}

TEST(Scheduler, AReleaseWakesAWaitingAcquire) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  write_version(s, a, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.acquire(a, Tier::kPinned, AccessMode::kRead, kWait).is_ok());
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(s.release(a, false).is_ok());
  });
  const Result<Acquired> got = s.acquire(b, Tier::kPinned, AccessMode::kOverwrite, kWait);
  releaser.join();
  ASSERT_TRUE(got.is_ok()) << got.status().message();
  ASSERT_TRUE(s.release(b, true).is_ok());
  EXPECT_GE(s.stats().acquire_waits, 1u);
}

TEST(Scheduler, DirtyDataIsWrittenBackBeforeItsBufferIsReused) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  write_version(s, a, Tier::kPinned, 7, kT);
  EXPECT_EQ(harness.backend.transfers(Link::kNvmeWrite), 0u);
  write_version(s, b, Tier::kPinned, 3, kT);  // needs a's buffer
  EXPECT_EQ(harness.backend.transfers(Link::kNvmeWrite), 1u);
  EXPECT_EQ(s.describe(a)->residency, Residency::kOnNvme);
  expect_version(s, a, Tier::kPinned, 7, kT);
}

TEST(Scheduler, DiscardedDataIsNeverWrittenBack) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle grad = s.register_tensor(flat_spec("g", kT, TensorKind::kGradient)).value();
  const TensorHandle other = s.register_tensor(flat_spec("o", kT)).value();
  write_version(s, grad, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.discard(grad).is_ok());
  EXPECT_EQ(s.describe(grad)->residency, Residency::kUnwritten);
  write_version(s, other, Tier::kPinned, 1, kT);
  EXPECT_EQ(harness.backend.transfers(Link::kNvmeWrite), 0u);
}

TEST(Scheduler, DeviceDirtyDataReachesNvmeThroughPinned) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle g = s.register_tensor(flat_spec("g", kT, TensorKind::kGradient)).value();
  const TensorHandle w = s.register_tensor(flat_spec("w", kT)).value();
  write_version(s, g, Tier::kDevice, 5, kT);
  write_version(s, w, Tier::kDevice, 1, kT);  // device full: g goes device -> pinned
  ASSERT_TRUE(s.flush(kWait).is_ok());
  EXPECT_GE(harness.backend.transfers(Link::kDeviceToHost), 1u);
  EXPECT_GE(harness.backend.transfers(Link::kNvmeWrite), 1u);
  expect_version(s, g, Tier::kDevice, 5, kT);
  expect_version(s, w, Tier::kPinned, 1, kT);
  const SchedulerStats stats = s.stats();
  EXPECT_EQ(stats.dirty_bytes, 0u);
}

TEST(Scheduler, HomeTensorsAreNeverEvicted) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, 2 * kT));
  Scheduler& s = harness.s();
  RegisterOptions pinned_home;
  pinned_home.home = Tier::kPinned;
  const TensorHandle resident = s.register_tensor(flat_spec("resident", kT), pinned_home).value();
  write_version(s, resident, Tier::kPinned, 2, kT);
  for (int i = 0; i < 4; ++i) {
    const TensorHandle t = s.register_tensor(flat_spec("x" + std::to_string(i), kT)).value();
    write_version(s, t, Tier::kPinned, 1, kT);
  }
  EXPECT_EQ(s.describe(resident)->residency, Residency::kDirty);  // still in pinned, unflushed
  expect_version(s, resident, Tier::kPinned, 2, kT);
  // Two home tensors cannot share a pool of two with anyone else: the third waits for nothing.
  const TensorHandle second = s.register_tensor(flat_spec("second", kT), pinned_home).value();
  write_version(s, second, Tier::kPinned, 1, kT);
  const TensorHandle third = s.register_tensor(flat_spec("third", kT)).value();
  EXPECT_EQ(s.acquire(third, Tier::kPinned, AccessMode::kOverwrite, kWait).status().code(),
            STRATA_E_PINNED_BUDGET);
}

// Phases: P0 {a b}, P1 {c}, P2 {a}, P3 {b}; a pool of two. Entering P1, c needs room: a is read
// again in one phase, b in two, so b must go (Belady), not a (LRU would evict a).
TEST(Scheduler, EvictsTheTensorUsedFarthestInTheFuture) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, 2 * kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  const TensorHandle c = s.register_tensor(flat_spec("c", kT)).value();
  for (TensorHandle h : {c, b, a}) write_version(s, h, Tier::kPinned, 1, kT);  // a, b resident last
  ASSERT_TRUE(s.flush(kWait).is_ok());
  AccessSchedule::Builder builder;
  builder.begin_phase({PhaseKind::kForward, 0});
  ASSERT_TRUE(builder.add({a, Tier::kPinned, AccessMode::kRead}).is_ok());
  ASSERT_TRUE(builder.add({b, Tier::kPinned, AccessMode::kRead}).is_ok());
  builder.begin_phase({PhaseKind::kForward, 1});
  ASSERT_TRUE(builder.add({c, Tier::kPinned, AccessMode::kRead}).is_ok());
  builder.begin_phase({PhaseKind::kBackward, 1});
  ASSERT_TRUE(builder.add({a, Tier::kPinned, AccessMode::kRead}).is_ok());
  builder.begin_phase({PhaseKind::kBackward, 0});
  ASSERT_TRUE(builder.add({b, Tier::kPinned, AccessMode::kRead}).is_ok());
  ASSERT_TRUE(s.declare_schedule(std::move(builder).build().value()).is_ok());

  ASSERT_TRUE(s.begin_step().is_ok());
  ASSERT_TRUE(s.begin_phase({PhaseKind::kForward, 0}).is_ok());
  expect_version(s, a, Tier::kPinned, 1, kT);
  expect_version(s, b, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.end_phase({PhaseKind::kForward, 0}).is_ok());
  ASSERT_TRUE(s.begin_phase({PhaseKind::kForward, 1}).is_ok());
  Result<Acquired> got = s.acquire(c, Tier::kPinned, AccessMode::kRead, kWait);
  ASSERT_TRUE(got.is_ok());
  EXPECT_TRUE(s.describe(a)->valid & kPinnedBit);
  EXPECT_EQ(s.describe(b)->residency, Residency::kOnNvme);
  ASSERT_TRUE(s.release(c, false).is_ok());
  ASSERT_TRUE(s.end_phase({PhaseKind::kForward, 1}).is_ok());
}

// A tensor the schedule does not name (strata.torch registers its offloaded activations afresh
// each step) ranks as never needed again, but a hint says it is needed soon: until it is
// acquired, a demand takes the room of another unnamed tensor first. y sits in the lower slot,
// which wins a tie between two "never" ranks, so without the hint counting y would go.
TEST(Scheduler, AHintedTensorTheScheduleDoesNotNameKeepsItsRoomUntilItIsAcquired) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, 2 * kT));
  Scheduler& s = harness.s();
  const TensorHandle y = s.register_tensor(flat_spec("y", kT)).value();
  const TensorHandle w = s.register_tensor(flat_spec("w", kT)).value();
  const TensorHandle z = s.register_tensor(flat_spec("z", kT)).value();
  const TensorHandle named = s.register_tensor(flat_spec("named", kT)).value();
  AccessSchedule::Builder builder;
  builder.begin_phase({PhaseKind::kForward, 0});
  ASSERT_TRUE(builder.add({named, Tier::kDevice, AccessMode::kRead}).is_ok());
  ASSERT_TRUE(s.declare_schedule(std::move(builder).build().value()).is_ok());
  write_version(s, y, Tier::kPinned, 1, kT);
  write_version(s, w, Tier::kPinned, 2, kT);
  ASSERT_TRUE(s.flush(kWait).is_ok());  // both clean in a full pool
  ASSERT_TRUE(s.prefetch(y, Tier::kPinned).is_ok());

  Result<Acquired> room = s.acquire(z, Tier::kPinned, AccessMode::kOverwrite, kWait);
  ASSERT_TRUE(room.is_ok()) << room.status().message();
  EXPECT_TRUE(s.describe(y)->valid & kPinnedBit);
  EXPECT_FALSE(s.describe(w)->valid & kPinnedBit);
  ASSERT_TRUE(s.release(z, false).is_ok());
  // Acquired, y is an unnamed tensor like any other again: the next demand may take its room.
  expect_version(s, y, Tier::kPinned, 1, kT);
  expect_version(s, w, Tier::kPinned, 2, kT);
  EXPECT_FALSE(s.describe(y)->valid & kPinnedBit);
}

// The first step is recorded; in the second, entering phase 0 prefetches phase 0's and phase 1's
// tensors onto the device, pushing out a tensor the schedule never reads.
TEST(Scheduler, RecordedStepDrivesPrefetchInTheNextStep) {
  Watchdog watchdog(30);
  Harness harness(small_config(4 * kT, 2 * kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  const TensorHandle filler = s.register_tensor(flat_spec("filler", 2 * kT)).value();
  write_version(s, a, Tier::kPinned, 1, kT);
  write_version(s, b, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.begin_step().is_ok());
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_TRUE(s.begin_phase({PhaseKind::kForward, layer}).is_ok());
    expect_version(s, layer == 0 ? a : b, Tier::kDevice, 1, kT);
    ASSERT_TRUE(s.end_phase({PhaseKind::kForward, layer}).is_ok());
  }
  ASSERT_TRUE(s.end_step().is_ok());
  EXPECT_EQ(s.stats().schedule_phases, 2u);
  EXPECT_FALSE(s.stats().recording);
  // With prefetch paused (it would otherwise bring a and b straight back: the next phase is
  // known), the filler takes the whole device; a and b keep their pinned copies.
  s.set_prefetch_enabled(false);
  ASSERT_TRUE(s.flush(kWait).is_ok());
  write_version(s, filler, Tier::kDevice, 1, 2 * kT);
  EXPECT_FALSE(s.describe(b)->valid & kDeviceBit);
  const uint64_t prefetched = s.stats().prefetch_transfers;

  s.set_prefetch_enabled(true);
  ASSERT_TRUE(s.begin_step().is_ok());
  ASSERT_TRUE(s.begin_phase({PhaseKind::kForward, 0}).is_ok());
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  // Both are prefetched, in either order: wait for both (checking one and then the other at
  // once failed under TSan's slowness while the second copy was still in flight).
  const auto on_device = [&](TensorHandle h) { return (s.describe(h)->valid & kDeviceBit) != 0; };
  while (!(on_device(a) && on_device(b)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(s.describe(b)->valid & kDeviceBit);
  EXPECT_TRUE(s.describe(a)->valid & kDeviceBit);
  EXPECT_GE(s.stats().prefetch_transfers, prefetched + 2);  // a and b copied to the device
  ASSERT_TRUE(s.end_phase({PhaseKind::kForward, 0}).is_ok());
  ASSERT_TRUE(s.end_step().is_ok());
  expect_version(s, filler, Tier::kPinned, 1, 2 * kT);  // went device -> pinned, intact
}

TEST(Scheduler, PrefetchHintBringsATensorToTheDevice) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, 2 * kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  write_version(s, a, Tier::kPinned, 4, kT);
  ASSERT_TRUE(s.flush(kWait).is_ok());
  ASSERT_TRUE(s.prefetch(a, Tier::kDevice).is_ok());
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (!(s.describe(a)->valid & kDeviceBit) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(s.describe(a)->valid & kDeviceBit);
  expect_version(s, a, Tier::kDevice, 4, kT);
}

TEST(Scheduler, PollingAcquireReportsPendingThenReady) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, 2 * kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  write_version(s, a, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.flush(kWait).is_ok());
  harness.backend.pause(true);
  Result<AcquireAttempt> first = s.try_acquire(a, Tier::kDevice, AccessMode::kRead);
  ASSERT_TRUE(first.is_ok());
  EXPECT_EQ(first->state, AcquireState::kPending);
  harness.backend.pause(false);
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  Result<AcquireAttempt> later = s.try_acquire(a, Tier::kDevice, AccessMode::kRead);
  while (later.is_ok() && later->state == AcquireState::kPending &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    later = s.try_acquire(a, Tier::kDevice, AccessMode::kRead);
  }
  ASSERT_TRUE(later.is_ok());
  ASSERT_EQ(later->state, AcquireState::kReady);
  EXPECT_EQ(check_pattern(later->acquired.data, kT, a.index, 1), -1);
  ASSERT_TRUE(s.release(a, false).is_ok());
}

TEST(Scheduler, NothingLeaksWhenTheSchedulerGoes) {
  testing::FakeBackend* backend = nullptr;
  {
    Watchdog watchdog(30);
    Harness harness(small_config(2 * kT, 2 * kT));
    backend = &harness.backend;
    Scheduler& s = harness.s();
    for (int i = 0; i < 5; ++i) {
      const TensorHandle t = s.register_tensor(flat_spec("t" + std::to_string(i), kT)).value();
      write_version(s, t, i % 2 ? Tier::kDevice : Tier::kPinned, 1, kT);
    }
    harness.scheduler.reset();
    EXPECT_EQ(backend->live_buffers(), 0u);
    EXPECT_EQ(backend->live_extents(), 0u);
  }
}

// Write-behind keeps dirty data the current phase lists (likely to be modified again), so a
// caller that has finished with a tensor says so: the optimizer's updated sub-groups are then
// written back while it reads the next ones, instead of each read waiting for a write.
TEST(Scheduler, WriteBehindCleansATensorTheCurrentPhaseStillListsOnlyWhenTold) {
  Watchdog watchdog(30);
  constexpr uint64_t kT = 64 << 10;
  Harness harness(testing::small_config(4 * kT, 4 * kT, /*headroom=*/0.10));
  Scheduler& s = harness.s();
  std::vector<TensorHandle> states;
  AccessSchedule::Builder builder;
  builder.begin_phase({PhaseKind::kOptimizer, 0});
  for (const char* name : {"a", "b", "c", "d"}) {
    states.push_back(s.register_tensor(testing::flat_spec(name, kT)).value());
    ASSERT_TRUE(builder.add({states.back(), Tier::kPinned, AccessMode::kRead}).is_ok());
  }
  ASSERT_TRUE(s.declare_schedule(std::move(builder).build().value()).is_ok());
  ASSERT_TRUE(s.begin_step().is_ok());
  ASSERT_TRUE(s.begin_phase({PhaseKind::kOptimizer, 0}).is_ok());
  // The pool full of dirty tensors the phase lists: write-behind leaves them all.
  for (TensorHandle h : states) testing::write_version(s, h, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.sync(testing::kWait).is_ok());
  for (TensorHandle h : states) EXPECT_FALSE(s.describe(h)->valid & kNvmeBit);

  Result<Acquired> held = s.acquire(states[1], Tier::kPinned, AccessMode::kRead, testing::kWait);
  ASSERT_TRUE(held.is_ok());
  EXPECT_EQ(s.write_behind(states[1]).code(), STRATA_E_STATE);  // acquired
  ASSERT_TRUE(s.release(states[1], false).is_ok());

  ASSERT_TRUE(s.write_behind(states[0]).is_ok());
  ASSERT_TRUE(s.sync(testing::kWait).is_ok());
  EXPECT_TRUE(s.describe(states[0])->valid & kNvmeBit);  // written back, still resident
  EXPECT_TRUE(s.describe(states[0])->valid & kPinnedBit);
  EXPECT_FALSE(s.describe(states[2])->valid & kNvmeBit);
  testing::expect_version(s, states[0], Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.end_phase({PhaseKind::kOptimizer, 0}).is_ok());
  ASSERT_TRUE(s.end_step().is_ok());
}

// write_behind(kNow) (the optimizer's write-through) writes a dirty tensor back whatever the
// pool's headroom, here none at all, in the order of the calls as the NVMe write link frees; an
// entry whose tensor was acquired again before its turn is skipped, and a tensor told plain
// write_behind stays dirty until its room is needed.
TEST(Scheduler, WriteBehindNowWritesBackInCallOrderWithoutAnyoneNeedingTheRoom) {
  Watchdog watchdog(30);
  constexpr uint64_t kT = 64 << 10;
  SchedulerConfig config = testing::small_config(8 * kT, 8 * kT, /*headroom=*/0.0);
  config.max_inflight[static_cast<int>(Link::kNvmeWrite)] = 1;
  Harness harness(config);
  Scheduler& s = harness.s();
  std::vector<TensorHandle> t;
  for (const char* name : {"a", "b", "c", "d"}) {
    t.push_back(s.register_tensor(testing::flat_spec(name, kT)).value());
    testing::write_version(s, t.back(), Tier::kPinned, 1, kT);
  }
  harness.backend.pause(true);
  using WriteBack = Scheduler::WriteBack;
  for (int i : {0, 1, 2}) ASSERT_TRUE(s.write_behind(t[i], WriteBack::kNow).is_ok());
  ASSERT_TRUE(s.write_behind(t[3], WriteBack::kWhenRoomIsNeeded).is_ok());
  EXPECT_EQ(s.inflight_transfers(), 1u);  // a; b and c wait for the link
  // c is the caller's again before its turn: its write-back is no longer asked for.
  Result<Acquired> c = s.acquire(t[2], Tier::kPinned, AccessMode::kRead, testing::kWait);
  ASSERT_TRUE(c.is_ok());
  ASSERT_TRUE(s.release(t[2], /*dirty=*/false).is_ok());
  harness.backend.pause(false);
  ASSERT_TRUE(s.sync(testing::kWait).is_ok());
  EXPECT_EQ(harness.backend.transfers(Link::kNvmeWrite), 2u);
  for (int i : {0, 1}) {
    EXPECT_TRUE(s.describe(t[i])->valid & kNvmeBit) << i;
    EXPECT_TRUE(s.describe(t[i])->valid & kPinnedBit) << i;  // written back, still resident
  }
  for (int i : {2, 3}) EXPECT_FALSE(s.describe(t[i])->valid & kNvmeBit) << i;
  for (TensorHandle h : t) testing::expect_version(s, h, Tier::kPinned, 1, kT);
}

// The optimizer's pipeline within its one long phase: it has updated the sub-groups that fill
// the pool, says it is done with them for now (write_behind) and hints the next ones. A tensor
// done with for now is next read in a later phase, so prefetch may take its room, and what the
// waiting hints need makes write-behind clean all of them at once: the reads follow the writes
// together, with no acquire waiting for them. (Before, the phase listed them all as needed now:
// write-behind cleaned one for its headroom, and only an acquire could take its room.)
TEST(Scheduler, HintsAheadOfTheOptimizerTakeTheRoomOfWhatItIsDoneWithAllAtOnce) {
  Watchdog watchdog(30);
  constexpr uint64_t kT = 64 << 10;
  constexpr int kSlots = 4;
  Harness harness(testing::small_config(kSlots * kT, kSlots * kT, /*headroom=*/0.10));
  Scheduler& s = harness.s();
  std::vector<TensorHandle> done, next;
  AccessSchedule::Builder builder;
  builder.begin_phase({PhaseKind::kOptimizer, 0});
  for (int i = 0; i < 2 * kSlots; ++i) {
    std::vector<TensorHandle>& group = i < kSlots ? done : next;
    group.push_back(s.register_tensor(testing::flat_spec("s" + std::to_string(i), kT)).value());
    ASSERT_TRUE(builder.add({group.back(), Tier::kPinned, AccessMode::kRead}).is_ok());
  }
  // The next sub-groups on NVMe alone; the updated ones fill the pool, dirty.
  for (TensorHandle h : next) testing::write_version(s, h, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.flush(testing::kWait).is_ok());
  ASSERT_TRUE(s.declare_schedule(std::move(builder).build().value()).is_ok());
  ASSERT_TRUE(s.begin_step().is_ok());
  ASSERT_TRUE(s.begin_phase({PhaseKind::kOptimizer, 0}).is_ok());
  for (TensorHandle h : done) testing::write_version(s, h, Tier::kPinned, 2, kT);
  ASSERT_TRUE(s.sync(testing::kWait).is_ok());
  for (TensorHandle h : next) EXPECT_FALSE(s.describe(h)->valid & kPinnedBit);
  EXPECT_EQ(s.inflight_transfers(), 0u);

  harness.backend.pause(true);
  for (TensorHandle h : done) ASSERT_TRUE(s.write_behind(h).is_ok());
  for (TensorHandle h : next) ASSERT_TRUE(s.prefetch(h, Tier::kPinned).is_ok());
  EXPECT_EQ(s.inflight_transfers(), static_cast<uint32_t>(kSlots));  // every write-back
  harness.backend.pause(false);

  const auto deadline = std::chrono::steady_clock::now() + testing::kWait;
  auto all_resident = [&] {
    for (TensorHandle h : next) {
      if (!(s.describe(h)->valid & kPinnedBit)) return false;
    }
    return true;
  };
  while (!all_resident() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(all_resident());
  EXPECT_EQ(s.stats().acquires, static_cast<uint64_t>(2 * kSlots));  // the writes' alone
  for (TensorHandle h : done) EXPECT_TRUE(s.describe(h)->valid & kNvmeBit);
  for (TensorHandle h : next) testing::expect_version(s, h, Tier::kPinned, 1, kT);
  for (TensorHandle h : done) testing::expect_version(s, h, Tier::kPinned, 2, kT);
  ASSERT_TRUE(s.end_phase({PhaseKind::kOptimizer, 0}).is_ok());
  ASSERT_TRUE(s.end_step().is_ok());
}

// Without a schedule (the first step, or a pass outside any step) the order is least recently
// used, with two corrections the optimizer's read-ahead needs. What it has read ahead was last
// used a whole pass ago, the oldest of all; what it has updated and released was used just now.
// So plain LRU gave the next read ahead the room of an earlier one, read again later (the
// `strata bench optimizer` pass over 50 one-sub-group tensors read 1.38 GB for 0.8). Now a hint
// counts as a use, and what write_behind says is done with goes before everything else.
TEST(Scheduler, WithoutAScheduleTheNextReadAheadTakesTheRoomOfWhatIsDoneWith) {
  Watchdog watchdog(30);
  Harness harness(small_config(4 * kT, 4 * kT));
  Scheduler& s = harness.s();
  auto make = [&](const char* name) { return s.register_tensor(flat_spec(name, kT)).value(); };
  const TensorHandle next = make("next"), ahead1 = make("ahead1"), ahead2 = make("ahead2");
  const TensorHandle done1 = make("done1"), done2 = make("done2");
  for (TensorHandle h : {next, ahead1, ahead2}) write_version(s, h, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.flush(kWait).is_ok());
  // The updated sub-groups fill the pool (pushing out `next`, the oldest), dirty, done with.
  for (TensorHandle h : {done1, done2}) write_version(s, h, Tier::kPinned, 2, kT);
  ASSERT_FALSE(s.describe(next)->valid & kPinnedBit);
  for (TensorHandle h : {done1, done2}) ASSERT_TRUE(s.write_behind(h).is_ok());
  // Read ahead: two are in already, the third needs room.
  for (TensorHandle h : {ahead1, ahead2, next}) ASSERT_TRUE(s.prefetch(h, Tier::kPinned).is_ok());
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (!(s.describe(next)->valid & kPinnedBit) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(s.describe(next)->valid & kPinnedBit);
  for (TensorHandle h : {ahead1, ahead2}) {
    EXPECT_TRUE(s.describe(h)->valid & kPinnedBit) << s.describe(h)->name << " was pushed out";
  }
  EXPECT_EQ(harness.backend.transfers(Link::kNvmeRead), 1u);  // `next` alone
  for (TensorHandle h : {next, ahead1, ahead2}) expect_version(s, h, Tier::kPinned, 1, kT);
  for (TensorHandle h : {done1, done2}) expect_version(s, h, Tier::kPinned, 2, kT);
}

}  // namespace
}  // namespace strata::sched
