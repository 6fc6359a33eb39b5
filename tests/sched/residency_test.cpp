#include "sched/residency.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace strata::sched {
namespace {

using R = Residency;

// The legal transitions, restated independently of residency.cpp's table.
const std::set<std::pair<R, R>>& expected_legal() {
  static const std::set<std::pair<R, R>> legal = {
      {R::kUnwritten, R::kDirty},
      {R::kOnNvme, R::kReading},
      {R::kOnNvme, R::kDirty},
      {R::kOnNvme, R::kUnwritten},
      {R::kReading, R::kPinned},
      {R::kReading, R::kOnNvme},
      {R::kPinned, R::kCopyingToDevice},
      {R::kPinned, R::kOnNvme},
      {R::kPinned, R::kDirty},
      {R::kPinned, R::kUnwritten},
      {R::kCopyingToDevice, R::kOnDevice},
      {R::kCopyingToDevice, R::kPinned},
      {R::kCopyingToDevice, R::kDirty},
      {R::kOnDevice, R::kOnDevice},
      {R::kOnDevice, R::kPinned},
      {R::kOnDevice, R::kOnNvme},
      {R::kOnDevice, R::kCopyingToHost},
      {R::kOnDevice, R::kDirty},
      {R::kOnDevice, R::kUnwritten},
      {R::kDirty, R::kDirty},
      {R::kDirty, R::kWritingBack},
      {R::kDirty, R::kCopyingToDevice},
      {R::kDirty, R::kCopyingToHost},
      {R::kDirty, R::kUnwritten},
      {R::kWritingBack, R::kPinned},
      {R::kWritingBack, R::kOnDevice},
      {R::kWritingBack, R::kDirty},
      {R::kCopyingToHost, R::kDirty},
      {R::kCopyingToHost, R::kOnDevice},
      {R::kOnNvme, R::kStreamingIn},
      {R::kStreamingIn, R::kOnDevice},
      {R::kStreamingIn, R::kOnNvme},
      {R::kDirty, R::kStreamingOut},
      {R::kStreamingOut, R::kOnDevice},
      {R::kStreamingOut, R::kDirty},
  };
  return legal;
}

TEST(ResidencyTable, EveryPairIsLegalExactlyWhenTheDiagramSaysSo) {
  int legal_count = 0;
  for (int f = 0; f < kResidencyCount; ++f) {
    for (int t = 0; t < kResidencyCount; ++t) {
      const R from = static_cast<R>(f), to = static_cast<R>(t);
      const bool expected = expected_legal().count({from, to}) == 1;
      EXPECT_EQ(is_legal_transition(from, to), expected)
          << to_string(from) << " -> " << to_string(to);
      legal_count += expected;
    }
  }
  EXPECT_EQ(legal_count, static_cast<int>(expected_legal().size()));
}

TEST(ResidencyTable, OutOfRangeStatesAreNeverLegal) {
  EXPECT_FALSE(is_legal_transition(static_cast<R>(200), R::kDirty));
  EXPECT_FALSE(is_legal_transition(R::kDirty, static_cast<R>(kResidencyCount)));
}

TEST(ResidencyTable, StableStatesFollowFromTheValidCopies) {
  EXPECT_EQ(stable_state_for(0), R::kUnwritten);
  EXPECT_EQ(stable_state_for(kNvmeBit), R::kOnNvme);
  EXPECT_EQ(stable_state_for(kNvmeBit | kPinnedBit), R::kPinned);
  EXPECT_EQ(stable_state_for(kNvmeBit | kDeviceBit), R::kOnDevice);
  EXPECT_EQ(stable_state_for(kNvmeBit | kPinnedBit | kDeviceBit), R::kOnDevice);
  EXPECT_EQ(stable_state_for(kPinnedBit), R::kDirty);
  EXPECT_EQ(stable_state_for(kDeviceBit), R::kDirty);
  EXPECT_EQ(stable_state_for(kPinnedBit | kDeviceBit), R::kDirty);
  // Every set of the three tiers that hold copies (the pageable host tier never does).
  for (int subset = 0; subset < 8; ++subset) {
    const TierMask valid =
        static_cast<TierMask>(((subset & 1) ? kNvmeBit : 0) | ((subset & 2) ? kPinnedBit : 0) |
                              ((subset & 4) ? kDeviceBit : 0));
    EXPECT_TRUE(is_consistent(stable_state_for(valid), valid)) << int(valid);
    EXPECT_FALSE(is_transient(stable_state_for(valid)));
  }
  EXPECT_FALSE(is_consistent(R::kPinned, kNvmeBit | kPinnedBit | tier_bit(Tier::kHost)));
}

TEST(ResidencyTable, ConsistencyRejectsImpossibleCopySets) {
  EXPECT_FALSE(is_consistent(R::kOnNvme, kNvmeBit | kPinnedBit));
  EXPECT_FALSE(is_consistent(R::kDirty, kNvmeBit | kPinnedBit));
  EXPECT_FALSE(is_consistent(R::kDirty, 0));
  EXPECT_FALSE(is_consistent(R::kWritingBack, kDeviceBit));  // nothing to write from
  EXPECT_FALSE(is_consistent(R::kCopyingToDevice, kPinnedBit | kDeviceBit));
  EXPECT_FALSE(is_consistent(R::kCopyingToHost, kPinnedBit | kDeviceBit));
  EXPECT_FALSE(is_consistent(R::kStreamingIn, kNvmeBit | kPinnedBit));     // pinned: copy instead
  EXPECT_FALSE(is_consistent(R::kStreamingOut, kPinnedBit | kDeviceBit));  // write from pinned
  EXPECT_FALSE(is_consistent(R::kUnwritten, kNvmeBit));
  EXPECT_FALSE(is_consistent(R::kPinned, 0x10));
}

TEST(ResidencyEvents, ReadCopyAndDropWalkTheCleanPath) {
  ResidencyState s = ResidencyState::on_nvme();
  ASSERT_TRUE(s.begin_read("w").is_ok());
  EXPECT_EQ(s.state(), R::kReading);
  EXPECT_EQ(s.transfer_target(), Tier::kPinned);
  ASSERT_TRUE(s.finish(true, "w").is_ok());
  EXPECT_EQ(s.state(), R::kPinned);
  ASSERT_TRUE(s.begin_copy_to_device("w").is_ok());
  ASSERT_TRUE(s.finish(true, "w").is_ok());
  EXPECT_EQ(s.state(), R::kOnDevice);
  EXPECT_EQ(s.valid(), kNvmeBit | kPinnedBit | kDeviceBit);
  ASSERT_TRUE(s.drop(Tier::kPinned, "w").is_ok());
  EXPECT_EQ(s.state(), R::kOnDevice);
  ASSERT_TRUE(s.drop(Tier::kDevice, "w").is_ok());
  EXPECT_EQ(s.state(), R::kOnNvme);
  EXPECT_FALSE(s.dirty());
}

TEST(ResidencyEvents, StreamingInGoesFromNvmeToTheDeviceWithoutAPinnedCopy) {
  ResidencyState s = ResidencyState::on_nvme();
  ASSERT_TRUE(s.begin_stream_to_device("w").is_ok());
  EXPECT_EQ(s.state(), R::kStreamingIn);
  EXPECT_EQ(s.transfer_target(), Tier::kDevice);
  EXPECT_EQ(s.drop(Tier::kNvme, "w").code(), STRATA_E_STATE);
  ASSERT_TRUE(s.finish(true, "w").is_ok());
  EXPECT_EQ(s.state(), R::kOnDevice);
  EXPECT_EQ(s.valid(), kNvmeBit | kDeviceBit);
  // Only from the NVMe copy alone: with a pinned copy, copy_to_device is the way.
  ResidencyState pinned = ResidencyState::on_nvme();
  ASSERT_TRUE(pinned.begin_read("w").is_ok());
  ASSERT_TRUE(pinned.finish(true, "w").is_ok());
  EXPECT_EQ(pinned.begin_stream_to_device("w").code(), STRATA_E_STATE);
}

TEST(ResidencyEvents, AFailedStreamInLeavesTheNvmeCopy) {
  ResidencyState s = ResidencyState::on_nvme();
  ASSERT_TRUE(s.begin_stream_to_device("w").is_ok());
  ASSERT_TRUE(s.finish(false, "w").is_ok());
  EXPECT_EQ(s.state(), R::kOnNvme);
  EXPECT_EQ(s.valid(), kNvmeBit);
}

TEST(ResidencyEvents, StreamingOutCleansDeviceDataAndAFailureKeepsItDirty) {
  ResidencyState s;
  ASSERT_TRUE(s.overwrite(Tier::kDevice, "g").is_ok());
  ASSERT_TRUE(s.begin_stream_to_nvme("g").is_ok());
  EXPECT_EQ(s.state(), R::kStreamingOut);
  EXPECT_EQ(s.transfer_target(), Tier::kNvme);
  // The source stays the last valid copy until the write succeeded.
  EXPECT_EQ(s.drop(Tier::kDevice, "g").code(), STRATA_E_STATE);
  ASSERT_TRUE(s.finish(false, "g").is_ok());
  EXPECT_EQ(s.state(), R::kDirty);
  EXPECT_EQ(s.valid(), kDeviceBit);
  ASSERT_TRUE(s.begin_stream_to_nvme("g").is_ok());
  ASSERT_TRUE(s.finish(true, "g").is_ok());
  EXPECT_EQ(s.state(), R::kOnDevice);
  EXPECT_EQ(s.valid(), kNvmeBit | kDeviceBit);
  EXPECT_FALSE(s.dirty());
  // Only from the device copy alone: a dirty pinned copy is written back from pinned memory.
  ResidencyState both;
  ASSERT_TRUE(both.overwrite(Tier::kPinned, "g").is_ok());
  EXPECT_EQ(both.begin_stream_to_nvme("g").code(), STRATA_E_STATE);
}

TEST(ResidencyEvents, FailedReadLeavesTheNvmeCopy) {
  ResidencyState s = ResidencyState::on_nvme();
  ASSERT_TRUE(s.begin_read("w").is_ok());
  ASSERT_TRUE(s.finish(false, "w").is_ok());
  EXPECT_EQ(s.state(), R::kOnNvme);
  EXPECT_EQ(s.valid(), kNvmeBit);
}

TEST(ResidencyEvents, TheLastValidCopyOfDirtyDataCannotBeDropped) {
  ResidencyState s;
  ASSERT_TRUE(s.overwrite(Tier::kPinned, "g").is_ok());
  EXPECT_TRUE(s.dirty());
  const Status dropped = s.drop(Tier::kPinned, "g");
  EXPECT_EQ(dropped.code(), STRATA_E_STATE);
  EXPECT_NE(dropped.message().find("last valid"), std::string::npos) << dropped.message();
  EXPECT_EQ(s.state(), R::kDirty);
  EXPECT_EQ(s.valid(), kPinnedBit);
}

TEST(ResidencyEvents, FailedWriteBackStaysDirtyAndSucceededOneIsClean) {
  ResidencyState s;
  ASSERT_TRUE(s.overwrite(Tier::kPinned, "m").is_ok());
  ASSERT_TRUE(s.begin_write_back("m").is_ok());
  EXPECT_EQ(s.state(), R::kWritingBack);
  EXPECT_TRUE(s.valid_on(Tier::kPinned));  // still readable while being written
  ASSERT_TRUE(s.finish(false, "m").is_ok());
  EXPECT_EQ(s.state(), R::kDirty);
  EXPECT_EQ(s.valid(), kPinnedBit);
  ASSERT_TRUE(s.begin_write_back("m").is_ok());
  ASSERT_TRUE(s.finish(true, "m").is_ok());
  EXPECT_EQ(s.state(), R::kPinned);
  EXPECT_FALSE(s.dirty());
}

TEST(ResidencyEvents, DeviceDirtyDataReachesNvmeThroughPinned) {
  ResidencyState s;
  ASSERT_TRUE(s.overwrite(Tier::kDevice, "g").is_ok());
  EXPECT_EQ(s.begin_write_back("g").code(), STRATA_E_STATE);  // no pinned source yet
  ASSERT_TRUE(s.begin_copy_to_host("g").is_ok());
  ASSERT_TRUE(s.finish(true, "g").is_ok());
  EXPECT_EQ(s.state(), R::kDirty);
  EXPECT_EQ(s.valid(), kPinnedBit | kDeviceBit);
  ASSERT_TRUE(s.drop(Tier::kDevice, "g").is_ok());  // pinned still holds it
  ASSERT_TRUE(s.begin_write_back("g").is_ok());
  ASSERT_TRUE(s.finish(true, "g").is_ok());
  EXPECT_EQ(s.state(), R::kPinned);
}

TEST(ResidencyEvents, ModificationInvalidatesOtherCopies) {
  ResidencyState s = ResidencyState::on_nvme();
  ASSERT_TRUE(s.begin_read("w").is_ok());
  ASSERT_TRUE(s.finish(true, "w").is_ok());
  ASSERT_TRUE(s.modified(Tier::kPinned, "w").is_ok());
  EXPECT_EQ(s.state(), R::kDirty);
  EXPECT_EQ(s.valid(), kPinnedBit);
  EXPECT_EQ(s.modified(Tier::kDevice, "w").code(), STRATA_E_STATE);  // no device copy
}

TEST(ResidencyEvents, EventsDuringATransferAreRefusedWithBothStatesNamed) {
  ResidencyState s = ResidencyState::on_nvme();
  ASSERT_TRUE(s.begin_read("layers.3.wq").is_ok());
  const Status overwrite = s.overwrite(Tier::kPinned, "layers.3.wq");
  EXPECT_EQ(overwrite.code(), STRATA_E_STATE);
  EXPECT_NE(overwrite.message().find("layers.3.wq"), std::string::npos);
  EXPECT_NE(overwrite.message().find("Reading"), std::string::npos);
  EXPECT_NE(overwrite.message().find("Dirty"), std::string::npos);
  EXPECT_EQ(s.begin_read("x").code(), STRATA_E_STATE);
  EXPECT_EQ(s.discard("x").code(), STRATA_E_STATE);
  EXPECT_EQ(s.drop(Tier::kPinned, "x").code(), STRATA_E_STATE);
  EXPECT_EQ(s.state(), R::kReading);  // unchanged by refused events
  EXPECT_EQ(ResidencyState().finish(true, "x").code(), STRATA_E_STATE);
}

TEST(ResidencyEvents, DiscardForgetsContentsFromAnyStableState) {
  ResidencyState s;
  ASSERT_TRUE(s.overwrite(Tier::kDevice, "g").is_ok());
  ASSERT_TRUE(s.discard("g").is_ok());
  EXPECT_EQ(s.state(), R::kUnwritten);
  EXPECT_EQ(s.valid(), 0);
  EXPECT_EQ(s.overwrite(Tier::kNvme, "g").code(), STRATA_E_STATE);
}

}  // namespace
}  // namespace strata::sched
