// Range copies between tensors in use (Scheduler::start_copy_range / wait_copy_range): a device
// tensor read and written in pinned pieces, as the optimizer works through a gradient and a
// parameter, with no pinned buffer of the tensor's size.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "sched/sched_test_util.h"

namespace strata::sched {
namespace {

using testing::check_pattern;
using testing::expect_version;
using testing::fill_pattern;
using testing::flat_spec;
using testing::Harness;
using testing::kWait;
using testing::small_config;
using testing::Watchdog;
using testing::write_version;

constexpr uint64_t kT = 64 << 10;
constexpr uint64_t kPiece = 16 << 10;

// A pinned scratch buffer of the caller's (strata_malloc-like: home pinned, taken at once).
TensorHandle scratch(Scheduler& s, uint64_t bytes) {
  RegisterOptions options;
  options.home = Tier::kPinned;
  options.allocation = true;
  const TensorHandle h = s.register_tensor(flat_spec("piece", bytes), options).value();
  EXPECT_TRUE(s.reserve(h, Tier::kPinned, kWait).is_ok());
  return h;
}

TEST(SchedulerRangeCopy, ADeviceTensorIsReadAndRewrittenInPinnedPieces) {
  Watchdog watchdog(30);
  Harness harness(small_config(2 * kT, 2 * kT));
  Scheduler& s = harness.s();
  const TensorHandle g = s.register_tensor(flat_spec("g", kT, TensorKind::kGradient)).value();
  const TensorHandle w = s.register_tensor(flat_spec("w", kT)).value();
  write_version(s, g, Tier::kDevice, 4, kT);
  write_version(s, w, Tier::kDevice, 1, kT);
  const TensorHandle piece = scratch(s, kPiece);
  // The reference: g's bytes as written, to compare each piece with.
  std::vector<uint8_t> expected(kT);
  fill_pattern(expected.data(), kT, g.index, 4);

  ASSERT_TRUE(s.acquire(g, Tier::kDevice, AccessMode::kRead, kWait).is_ok());
  ASSERT_TRUE(s.acquire(w, Tier::kDevice, AccessMode::kRead, kWait).is_ok());
  Result<Acquired> p = s.acquire(piece, Tier::kPinned, AccessMode::kRead, kWait);
  ASSERT_TRUE(p.is_ok());
  for (uint64_t offset = 0; offset < kT; offset += kPiece) {
    Result<uint64_t> in =
        s.start_copy_range(g, Tier::kDevice, offset, piece, Tier::kPinned, 0, kPiece, kWait);
    ASSERT_TRUE(in.is_ok()) << in.status().message();
    ASSERT_TRUE(s.wait_copy_range(*in, kWait).is_ok());
    EXPECT_EQ(std::memcmp(p->data, expected.data() + offset, kPiece), 0) << offset;
    // The piece goes on, changed, into w at the same offset.
    for (uint64_t i = 0; i < kPiece; ++i) static_cast<uint8_t*>(p->data)[i] ^= 0xFF;
    Result<uint64_t> out =
        s.start_copy_range(piece, Tier::kPinned, 0, w, Tier::kDevice, offset, kPiece, kWait);
    ASSERT_TRUE(out.is_ok()) << out.status().message();
    ASSERT_TRUE(s.wait_copy_range(*out, kWait).is_ok());
  }
  ASSERT_TRUE(s.release(piece, false).is_ok());
  ASSERT_TRUE(s.release(g, false).is_ok());
  ASSERT_TRUE(s.release(w, /*dirty=*/true).is_ok());
  EXPECT_EQ(s.describe(g)->residency, Residency::kDirty);  // no residency moved
  // w now holds g's bytes inverted, and reaches NVMe and pinned memory like any write.
  const Status flushed = s.flush(kWait);
  ASSERT_TRUE(flushed.is_ok()) << flushed.message();
  Result<Acquired> back = s.acquire(w, Tier::kPinned, AccessMode::kRead, kWait);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  for (uint64_t i = 0; i < kT; ++i) expected[i] ^= 0xFF;
  EXPECT_EQ(std::memcmp(back->data, expected.data(), kT), 0);
  ASSERT_TRUE(s.release(w, false).is_ok());
  const SchedulerStats stats = s.stats();
  EXPECT_GE(stats.link_bytes[static_cast<int>(Link::kDeviceToHost)], kT);
  EXPECT_GE(stats.link_bytes[static_cast<int>(Link::kHostToDevice)], kT);
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
}

TEST(SchedulerRangeCopy, MisuseIsRefusedWithTheReason) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, 2 * kT));
  Scheduler& s = harness.s();
  const TensorHandle g = s.register_tensor(flat_spec("g", kT)).value();
  write_version(s, g, Tier::kDevice, 1, kT);
  const TensorHandle piece = scratch(s, kPiece);
  // Not held.
  Result<uint64_t> refused =
      s.start_copy_range(g, Tier::kDevice, 0, piece, Tier::kPinned, 0, kPiece, kWait);
  EXPECT_EQ(refused.status().code(), STRATA_E_STATE);
  EXPECT_NE(refused.status().message().find("held on device"), std::string::npos);
  ASSERT_TRUE(s.acquire(g, Tier::kDevice, AccessMode::kRead, kWait).is_ok());
  ASSERT_TRUE(s.acquire(piece, Tier::kPinned, AccessMode::kRead, kWait).is_ok());
  // Outside a tensor, or not between the device and pinned memory.
  EXPECT_EQ(s.start_copy_range(g, Tier::kDevice, kT - 4, piece, Tier::kPinned, 0, 8, kWait)
                .status()
                .code(),
            STRATA_E_INVALID);
  EXPECT_EQ(s.start_copy_range(g, Tier::kDevice, 0, piece, Tier::kPinned, 8, kPiece, kWait)
                .status()
                .code(),
            STRATA_E_INVALID);
  EXPECT_EQ(
      s.start_copy_range(g, Tier::kDevice, 0, piece, Tier::kDevice, 0, 8, kWait).status().code(),
      STRATA_E_INVALID);
  // A tensor with a copy in flight cannot be released until it ends.
  harness.backend.pause(true);
  Result<uint64_t> held =
      s.start_copy_range(g, Tier::kDevice, 0, piece, Tier::kPinned, 0, kPiece, kWait);
  ASSERT_TRUE(held.is_ok());
  EXPECT_EQ(s.release(piece, false).code(), STRATA_E_STATE);
  EXPECT_EQ(s.release(g, false).code(), STRATA_E_STATE);
  harness.backend.pause(false);
  EXPECT_TRUE(s.wait_copy_range(*held, kWait).is_ok());
  EXPECT_EQ(s.wait_copy_range(*held, kWait).code(), STRATA_E_STATE);  // redeemed once
  EXPECT_TRUE(s.release(piece, false).is_ok());
  EXPECT_TRUE(s.release(g, false).is_ok());
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
}

TEST(SchedulerRangeCopy, AFailedCopyReportsItsErrorAndMovesNoResidency) {
  Watchdog watchdog(30);
  Harness harness(small_config(kT, 2 * kT));
  Scheduler& s = harness.s();
  const TensorHandle g = s.register_tensor(flat_spec("g", kT)).value();
  write_version(s, g, Tier::kDevice, 2, kT);
  const TensorHandle piece = scratch(s, kPiece);
  ASSERT_TRUE(s.acquire(g, Tier::kDevice, AccessMode::kRead, kWait).is_ok());
  ASSERT_TRUE(s.acquire(piece, Tier::kPinned, AccessMode::kRead, kWait).is_ok());
  harness.backend.fail_next(Link::kDeviceToHost, STRATA_E_DEVICE);
  Result<uint64_t> copy =
      s.start_copy_range(g, Tier::kDevice, 0, piece, Tier::kPinned, 0, kPiece, kWait);
  ASSERT_TRUE(copy.is_ok());
  EXPECT_EQ(s.wait_copy_range(*copy, kWait).code(), STRATA_E_DEVICE);
  ASSERT_TRUE(s.release(piece, false).is_ok());
  ASSERT_TRUE(s.release(g, false).is_ok());
  EXPECT_EQ(s.describe(g)->valid, kDeviceBit);
  EXPECT_EQ(s.stats().transfer_failures, 1u);
  expect_version(s, g, Tier::kDevice, 2, kT);
  EXPECT_TRUE(s.check_invariants().is_ok()) << s.check_invariants().message();
}

}  // namespace
}  // namespace strata::sched
