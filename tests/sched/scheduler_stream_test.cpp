// Streamed device transfers (MemoryPlan::stream_staging_bytes): NVMe <-> device without a pinned
// copy of the tensor, over a backend that really stores bytes.
#include <gtest/gtest.h>

#include "sched/sched_test_util.h"

namespace strata::sched {
namespace {

using testing::check_pattern;
using testing::expect_version;
using testing::fill_pattern;
using testing::flat_spec;
using testing::Harness;
using testing::kWait;
using testing::push_to_nvme;
using testing::streaming_config;
using testing::Watchdog;
using testing::write_version;

constexpr uint64_t kT = 64 << 10;
constexpr uint64_t kStaging = 32 << 10;

TEST(SchedulerStreaming, DeviceDataGoesToNvmeAndBackWithoutAPinnedCopy) {
  Watchdog watchdog(30);
  // A pinned pool smaller than either tensor: only streaming can move them.
  Harness harness(streaming_config(kT / 2, kT, kStaging));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  push_to_nvme(s, a, b, Tier::kDevice, 7,
               kT);  // b's overwrite makes a stream out, then a's copy is dropped
  expect_version(s, a, Tier::kDevice, 7, kT);  // streamed in, b streamed out to make room
  expect_version(s, b, Tier::kDevice, 1, kT);
  EXPECT_GE(harness.backend.streams(), 3u);
  EXPECT_EQ(harness.backend.transfers(Link::kNvmeRead),
            harness.backend.streams() - harness.backend.transfers(Link::kNvmeWrite));
  const SchedulerStats stats = s.stats();
  EXPECT_EQ(stats.pools[0].peak_in_use_bytes, 0u) << "a pinned buffer was used";
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
}

TEST(SchedulerStreaming, TheStagingBuffersAreCountedAsPinnedMemoryInUseOfKindOther) {
  Watchdog watchdog(30);
  Harness harness(streaming_config(2 * kT, 2 * kT, kStaging));
  Scheduler& s = harness.s();
  const TierUsage pinned = s.tier_usage(Tier::kPinned);
  EXPECT_EQ(pinned.in_use_bytes, kStaging);
  EXPECT_EQ(pinned.reserved_bytes, kStaging);
  EXPECT_EQ(pinned.kind_in_use_bytes[static_cast<size_t>(TensorKind::kOther)], kStaging);
  EXPECT_EQ(s.stats().pools[0].budget_bytes, 2 * kT);  // the pool has the rest of the budget
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  write_version(s, a, Tier::kPinned, 1, kT);
  EXPECT_EQ(s.tier_usage(Tier::kPinned).in_use_bytes, kStaging + kT);
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
}

TEST(SchedulerStreaming, APlanWhoseStagingTakesTheWholePinnedBudgetIsRefused) {
  SchedulerConfig config;
  config.memory = strata_memory_plan(kStaging, kT, kStaging);
  const Status valid = validate(config.memory);
  EXPECT_EQ(valid.code(), STRATA_E_INVALID);
  EXPECT_NE(valid.message().find("staging"), std::string::npos) << valid.message();
}

TEST(SchedulerStreaming, AFailedStreamInReachesTheAcquirerAndTheNvmeCopyStays) {
  Watchdog watchdog(30);
  Harness harness(streaming_config(kT, kT, kStaging));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  push_to_nvme(s, a, b, Tier::kDevice, 3, kT);
  harness.backend.fail_next(Link::kNvmeRead, STRATA_E_CORRUPT);
  const Result<Acquired> failed = s.acquire(a, Tier::kDevice, AccessMode::kRead, kWait);
  EXPECT_EQ(failed.status().code(), STRATA_E_CORRUPT);
  EXPECT_NE(failed.status().message().find("streaming to device tensor 'a'"), std::string::npos)
      << failed.status().message();
  EXPECT_EQ(s.describe(a)->residency, Residency::kOnNvme);
  expect_version(s, a, Tier::kDevice, 3, kT);  // the retry streams it in whole
}

TEST(SchedulerStreaming, AFailedStreamOutKeepsTheDeviceDataAndSyncReportsIt) {
  Watchdog watchdog(30);
  Harness harness(streaming_config(kT, 2 * kT, kStaging));
  Scheduler& s = harness.s();
  const TensorHandle g = s.register_tensor(flat_spec("g", kT, TensorKind::kGradient)).value();
  write_version(s, g, Tier::kDevice, 5, kT);
  harness.backend.fail_next(Link::kNvmeWrite, STRATA_E_IO);
  const Status flushed = s.flush(kWait);
  EXPECT_EQ(flushed.code(), STRATA_E_IO) << flushed.message();
  EXPECT_NE(flushed.message().find("streaming to nvme tensor 'g'"), std::string::npos)
      << flushed.message();
  EXPECT_EQ(s.describe(g)->valid, kDeviceBit);  // still dirty on the device alone
  ASSERT_TRUE(s.flush(kWait).is_ok());          // reported once; the next flush streams it out
  EXPECT_EQ(s.describe(g)->residency, Residency::kOnDevice);
  expect_version(s, g, Tier::kPinned, 5, kT);  // read back from NVMe
}

TEST(SchedulerStreaming, ADeviceTensorLargerThanThePinnedPoolIsServed) {
  Watchdog watchdog(30);
  // Without streaming such a tensor is refused on the device: it could never be written back.
  Harness harness(streaming_config(kT / 4, 4 * kT, kStaging));
  Scheduler& s = harness.s();
  const TensorHandle big = s.register_tensor(flat_spec("big", 2 * kT)).value();
  const TensorHandle other = s.register_tensor(flat_spec("other", 3 * kT)).value();
  write_version(s, big, Tier::kDevice, 9, 2 * kT);
  write_version(s, other, Tier::kDevice, 1, 3 * kT);  // big streams out to make room
  expect_version(s, big, Tier::kDevice, 9, 2 * kT);   // and back in
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
}

TEST(SchedulerStreaming, ARecordedStepPrefetchesByStreamingIntoTheDevice) {
  Watchdog watchdog(60);
  Harness harness(streaming_config(kT, 3 * kT, kStaging));
  Scheduler& s = harness.s();
  std::vector<TensorHandle> w;
  for (int i = 0; i < 6; ++i) {
    w.push_back(s.register_tensor(flat_spec("w" + std::to_string(i), kT, TensorKind::kParameter, i))
                    .value());
    write_version(s, w.back(), Tier::kDevice, 1, kT);
  }
  ASSERT_TRUE(s.flush(kWait).is_ok());
  // Two steps: the first is recorded, the second follows the schedule and prefetches.
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(s.begin_step().is_ok());
    for (int i = 0; i < 6; ++i) {
      ASSERT_TRUE(s.begin_phase({PhaseKind::kForward, i}).is_ok());
      expect_version(s, w[i], Tier::kDevice, 1, kT);
      ASSERT_TRUE(s.end_phase({PhaseKind::kForward, i}).is_ok());
    }
    ASSERT_TRUE(s.end_step().is_ok());
  }
  const SchedulerStats stats = s.stats();
  EXPECT_GT(stats.prefetch_transfers, 0u);
  EXPECT_EQ(stats.pools[0].peak_in_use_bytes, 0u);
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
}

}  // namespace
}  // namespace strata::sched
