// Injected backend failures reach the callers of acquire / release / sync / end_step as a
// Status, and the last good copy of the data survives every one of them.
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
using testing::small_config;
using testing::Watchdog;
using testing::write_version;

constexpr uint64_t kT = 32 << 10;

TEST(SchedulerFaults, ReadErrorReachesTheAcquirerAndTheNextAcquireRetries) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  push_to_nvme(s, a, b, Tier::kPinned, 3, kT);
  harness.backend.fail_next(Link::kNvmeRead, STRATA_E_IO);
  const Result<Acquired> failed = s.acquire(a, Tier::kPinned, AccessMode::kRead, kWait);
  EXPECT_EQ(failed.status().code(), STRATA_E_IO);
  EXPECT_NE(failed.status().message().find("reading tensor 'a'"), std::string::npos)
      << failed.status().message();
  EXPECT_EQ(s.describe(a)->residency, Residency::kOnNvme);  // the NVMe copy is still the truth
  expect_version(s, a, Tier::kPinned, 3, kT);
  EXPECT_EQ(s.stats().transfer_failures, 1u);
}

TEST(SchedulerFaults, CorruptReadIsReportedAsCorrupt) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  push_to_nvme(s, a, b, Tier::kPinned, 9, kT);
  harness.backend.fail_next(Link::kNvmeRead, STRATA_E_CORRUPT);
  EXPECT_EQ(s.acquire(a, Tier::kDevice, AccessMode::kRead, kWait).status().code(),
            STRATA_E_CORRUPT);
  expect_version(s, a, Tier::kDevice, 9, kT);
}

TEST(SchedulerFaults, FailedWriteBackKeepsTheDirtyDataAndReportsIt) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  const TensorHandle c = s.register_tensor(flat_spec("c", kT)).value();
  write_version(s, a, Tier::kPinned, 1, kT);
  write_version(s, b, Tier::kPinned, 1, kT);
  harness.backend.fail_next(Link::kNvmeWrite, STRATA_E_IO);
  // c needs a buffer: a (least recently used) is written back, which fails (and tears the
  // extent); b is written instead and c gets its buffer.
  write_version(s, c, Tier::kPinned, 1, kT);
  EXPECT_EQ(harness.backend.failures(), 1u);
  EXPECT_EQ(s.describe(a)->residency, Residency::kDirty);
  EXPECT_TRUE(s.describe(a)->has_error);
  // The data is still the newest version, and reading it is fine: the failure is not the
  // reader's. The durability barrier reports it, once (with the tensor named), then works again.
  expect_version(s, a, Tier::kPinned, 1, kT);
  const Status reported = s.sync(kWait);
  EXPECT_EQ(reported.code(), STRATA_E_IO);
  EXPECT_NE(reported.message().find("writing back tensor 'a'"), std::string::npos);
  EXPECT_TRUE(s.flush(kWait).is_ok());
  // Evict a for real now, and read it back from NVMe: the torn extent was rewritten.
  write_version(s, b, Tier::kPinned, 2, kT);
  write_version(s, c, Tier::kPinned, 2, kT);
  EXPECT_EQ(s.describe(a)->residency, Residency::kOnNvme);
  expect_version(s, a, Tier::kPinned, 1, kT);
}

TEST(SchedulerFaults, WriteBehindFailureLeavesTheDataReadableAndIsReportedBySync) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT, /*headroom=*/0.5));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  harness.backend.fail_next(Link::kNvmeWrite, STRATA_E_IO);
  write_version(s, a, Tier::kPinned, 1, kT);  // write-behind starts at once, and fails
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (!s.describe(a)->has_error && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(s.describe(a)->has_error);
  expect_version(s, a, Tier::kPinned, 1, kT);
  EXPECT_TRUE(s.describe(a)->has_error) << "a read took the report that sync must give";
  EXPECT_EQ(s.sync(kWait).code(), STRATA_E_IO);
  EXPECT_FALSE(s.describe(a)->has_error);
  EXPECT_TRUE(s.flush(kWait).is_ok());
}

TEST(SchedulerFaults, WriteBackFailureDuringAStepReachesEndStep) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  ASSERT_TRUE(s.begin_step().is_ok());
  ASSERT_TRUE(s.begin_phase({PhaseKind::kOptimizer, 0}).is_ok());
  write_version(s, a, Tier::kPinned, 1, kT);
  ASSERT_TRUE(s.end_phase({PhaseKind::kOptimizer, 0}).is_ok());
  harness.backend.fail_next(Link::kNvmeWrite, STRATA_E_IO);
  ASSERT_TRUE(s.begin_phase({PhaseKind::kOptimizer, 1}).is_ok());
  // b needs a's buffer; a's write-back fails, and a can never be freed until that is reported:
  // the acquire gives up with the cause instead of waiting for its deadline.
  const Result<Acquired> blocked = s.acquire(b, Tier::kPinned, AccessMode::kOverwrite, kWait);
  EXPECT_EQ(blocked.status().code(), STRATA_E_IO) << blocked.status().message();
  ASSERT_TRUE(s.end_phase({PhaseKind::kOptimizer, 1}).is_ok());
  const Status ended = s.end_step();
  EXPECT_EQ(ended.code(), STRATA_E_IO);
  EXPECT_NE(ended.message().find("tensor 'a'"), std::string::npos) << ended.message();
  // Reported: the write-back is retried and b fits.
  write_version(s, b, Tier::kPinned, 1, kT);
  expect_version(s, a, Tier::kPinned, 1, kT);
}

TEST(SchedulerFaults, FailedCopyToDeviceLeavesThePinnedCopy) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, 2 * kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  write_version(s, a, Tier::kPinned, 5, kT);
  harness.backend.fail_next(Link::kHostToDevice, STRATA_E_DEVICE);
  EXPECT_EQ(s.acquire(a, Tier::kDevice, AccessMode::kRead, kWait).status().code(), STRATA_E_DEVICE);
  EXPECT_EQ(s.describe(a)->residency, Residency::kDirty);
  EXPECT_EQ(s.describe(a)->valid, kPinnedBit);
  expect_version(s, a, Tier::kPinned, 5, kT);
  expect_version(s, a, Tier::kDevice, 5, kT);
}

TEST(SchedulerFaults, FailedCopyToHostKeepsTheDeviceCopy) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle g = s.register_tensor(flat_spec("g", kT, TensorKind::kGradient)).value();
  write_version(s, g, Tier::kDevice, 8, kT);
  harness.backend.fail_next(Link::kDeviceToHost, STRATA_E_DEVICE);
  EXPECT_EQ(s.acquire(g, Tier::kPinned, AccessMode::kRead, kWait).status().code(), STRATA_E_DEVICE);
  EXPECT_EQ(s.describe(g)->valid, kDeviceBit);
  expect_version(s, g, Tier::kPinned, 8, kT);
}

// Cleaning device data needs a pinned buffer; when the pool has room but the memory cannot be
// had, that is an error to report, not a wait that could only time out.
TEST(SchedulerFaults, APinnedAllocationFailureWhileCleaningIsReportedNotWaitedOn) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle g = s.register_tensor(flat_spec("g", kT, TensorKind::kGradient)).value();
  write_version(s, g, Tier::kDevice, 5, kT);
  harness.backend.fail_next_allocations(Tier::kPinned, 1);
  const Status flushed = s.flush(kWait);
  EXPECT_EQ(flushed.code(), STRATA_E_NOMEM) << flushed.message();
  EXPECT_NE(flushed.message().find("writing back"), std::string::npos) << flushed.message();
  EXPECT_EQ(s.describe(g)->valid, kDeviceBit);  // the data stayed on the device
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
  EXPECT_TRUE(s.flush(kWait).is_ok());  // reported once; the next flush writes it back
  expect_version(s, g, Tier::kPinned, 5, kT);
}

// Four tensors fill a device slab exactly; the second and fourth go, leaving two free ranges of
// one tensor each, apart. The pool's count then says a tensor of two fits (half the budget is
// free) while the slab has no range that holds it.
std::vector<TensorHandle> fragment_the_slab(Harness& harness, const RegisterOptions& options) {
  Scheduler& s = harness.s();
  std::vector<TensorHandle> all;
  for (int i = 0; i < 4; ++i) {
    all.push_back(s.register_tensor(flat_spec("t" + std::to_string(i), kT), options).value());
    write_version(s, all.back(), Tier::kDevice, 10 + i, kT);
  }
  EXPECT_TRUE(s.unregister_tensor(all[1]).is_ok());
  EXPECT_TRUE(s.unregister_tensor(all[3]).is_ok());
  EXPECT_EQ(harness.backend.largest_free_device_range(), kT);
  return {all[0], all[2]};
}

// Reliability finding 8: the arena, not the budget, refused, and the acquire failed with
// STRATA_E_DEVICE_BUDGET though more of the pool could have left. Now a victim leaves and the
// allocation is tried again; every byte of the victims survives.
TEST(SchedulerFaults, AFragmentedDeviceArenaMakesMoreRoomInsteadOfFailing) {
  Watchdog watchdog(30);
  Harness harness(small_config(8 * kT, 4 * kT));
  harness.backend.use_device_slab(4 * kT);
  Scheduler& s = harness.s();
  const std::vector<TensorHandle> kept = fragment_the_slab(harness, {});
  const TensorHandle wide = s.register_tensor(flat_spec("wide", 2 * kT)).value();
  Result<Acquired> a = s.acquire(wide, Tier::kDevice, AccessMode::kOverwrite, kWait);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  fill_pattern(a->data, 2 * kT, wide.index, 1);
  ASSERT_TRUE(s.release(wide, true).is_ok());
  EXPECT_GE(s.stats().arena_retries, 1u);
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
  expect_version(s, kept[0], Tier::kPinned, 10, kT);
  expect_version(s, kept[1], Tier::kPinned, 12, kT);
  Result<Acquired> back = s.acquire(wide, Tier::kPinned, AccessMode::kRead, kWait);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(check_pattern(back->data, 2 * kT, wide.index, 1), -1);
  ASSERT_TRUE(s.release(wide, false).is_ok());
}

// When nothing more can leave (the rest live on the device for good), the arena's own refusal is
// the answer, at once: never a wait that could only time out.
TEST(SchedulerFaults, AFragmentedArenaWithNothingLeftToMoveReportsTheArenasRefusal) {
  Watchdog watchdog(30);
  Harness harness(small_config(8 * kT, 4 * kT));
  harness.backend.use_device_slab(4 * kT);
  Scheduler& s = harness.s();
  RegisterOptions at_home;
  at_home.home = Tier::kDevice;
  fragment_the_slab(harness, at_home);
  const TensorHandle wide = s.register_tensor(flat_spec("wide", 2 * kT)).value();
  const auto start = std::chrono::steady_clock::now();
  const Result<Acquired> a = s.acquire(wide, Tier::kDevice, AccessMode::kOverwrite, kWait);
  EXPECT_LT(std::chrono::steady_clock::now() - start, kWait / 2);
  ASSERT_EQ(a.status().code(), STRATA_E_DEVICE_BUDGET) << a.status().message();
  EXPECT_NE(a.status().message().find("no free range"), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("can leave pool"), std::string::npos) << a.status().message();
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
}

// Reliability finding 31: the same refusal when what holds the slab's ranges apart is in use (a
// framework holding a layer's weights while it acquires the next one). Before, the acquire
// waited for a release that only its own caller could make, and the LoRA bench hung until the
// 300 s timeout. Released, the ranges merge and the same acquire succeeds.
TEST(SchedulerFaults, AFragmentedArenaHeldApartByTensorsInUseRefusesAtOnce) {
  Watchdog watchdog(30);
  Harness harness(small_config(8 * kT, 4 * kT));
  harness.backend.use_device_slab(4 * kT);
  Scheduler& s = harness.s();
  const std::vector<TensorHandle> held = fragment_the_slab(harness, {});
  for (const TensorHandle h : held) {
    ASSERT_TRUE(s.acquire(h, Tier::kDevice, AccessMode::kRead, kWait).is_ok());
  }
  const TensorHandle wide = s.register_tensor(flat_spec("wide", 2 * kT)).value();
  const auto start = std::chrono::steady_clock::now();
  const Result<Acquired> refused = s.acquire(wide, Tier::kDevice, AccessMode::kOverwrite, kWait);
  EXPECT_LT(std::chrono::steady_clock::now() - start, kWait / 2);
  ASSERT_EQ(refused.status().code(), STRATA_E_DEVICE_BUDGET) << refused.status().message();
  EXPECT_NE(refused.status().message().find("no free range"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("is in use or at home"), std::string::npos)
      << refused.status().message();
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();

  for (const TensorHandle h : held) ASSERT_TRUE(s.release(h, false).is_ok());
  Result<Acquired> a = s.acquire(wide, Tier::kDevice, AccessMode::kOverwrite, kWait);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  ASSERT_TRUE(s.release(wide, false).is_ok());
  expect_version(s, held[0], Tier::kPinned, 10, kT);
  expect_version(s, held[1], Tier::kPinned, 12, kT);
}

TEST(SchedulerFaults, AFullNvmeTierIsReportedAtRegistrationAndNothingIsRegistered) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, kT));
  Scheduler& s = harness.s();
  harness.backend.fail_next_extent_allocations(1);
  const Result<TensorHandle> refused = s.register_tensor(flat_spec("a", kT));
  EXPECT_EQ(refused.status().code(), STRATA_E_NOSPACE);
  EXPECT_NE(refused.status().message().find("registering tensor 'a'"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(s.stats().live_tensors, 0u);
  EXPECT_TRUE(s.register_tensor(flat_spec("a", kT)).is_ok());
}

TEST(SchedulerFaults, AWriteBackThatMeetsAFullDiskKeepsTheDataInMemory) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  write_version(s, a, Tier::kPinned, 2, kT);
  harness.backend.fail_next(Link::kNvmeWrite, STRATA_E_NOSPACE);
  const Status flushed = s.flush(kWait);
  EXPECT_EQ(flushed.code(), STRATA_E_NOSPACE) << flushed.message();
  EXPECT_EQ(s.describe(a)->residency, Residency::kDirty);
  expect_version(s, a, Tier::kPinned, 2, kT);
  EXPECT_TRUE(s.flush(kWait).is_ok());
  EXPECT_EQ(s.describe(a)->residency, Residency::kPinned);
}

TEST(SchedulerFaults, AFailedPrefetchIsReportedToTheNextAcquireOnly) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, kT));
  Scheduler& s = harness.s();
  const TensorHandle a = s.register_tensor(flat_spec("a", kT)).value();
  const TensorHandle b = s.register_tensor(flat_spec("b", kT)).value();
  push_to_nvme(s, a, b, Tier::kPinned, 6, kT);
  ASSERT_TRUE(s.flush(kWait).is_ok());
  harness.backend.fail_next(Link::kNvmeRead, STRATA_E_IO);
  ASSERT_TRUE(s.prefetch(a, Tier::kPinned).is_ok());
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (!s.describe(a)->has_error && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(s.describe(a)->has_error);
  EXPECT_TRUE(s.sync(kWait).is_ok());  // a failed read loses nothing: not a durability error
  EXPECT_EQ(s.acquire(a, Tier::kPinned, AccessMode::kRead, kWait).status().code(), STRATA_E_IO);
  expect_version(s, a, Tier::kPinned, 6, kT);
}

}  // namespace
}  // namespace strata::sched
