// LinkMeter's busy clocks: a link's runs while at least one of its transfers is in flight, the
// drive's while at least one NVMe transfer of either direction is. Every event reads the time
// once, under one lock, so the identities below hold to the microsecond; the sleeps only make
// the periods long enough to tell apart.
#include "datapath/link_meter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace strata::datapath {
namespace {

using sched::Link;
constexpr auto kRead = static_cast<int>(Link::kNvmeRead);
constexpr auto kWrite = static_cast<int>(Link::kNvmeWrite);
constexpr auto kToDevice = static_cast<int>(Link::kHostToDevice);

void hold_for(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

TEST(LinkMeter, ADriveThatReadsAndWritesInTurnIsBusyForTheirSum) {
  LinkMeter meter(nullptr);
  meter.started(Link::kNvmeRead);
  hold_for(5);
  meter.finished(Link::kNvmeRead, 4096, 0, nullptr);
  hold_for(5);  // idle: counted by neither
  meter.started(Link::kNvmeWrite);
  hold_for(5);
  meter.finished(Link::kNvmeWrite, 4096, 0, nullptr);
  const LinkMeter::BusyTimes busy = meter.busy_times();
  EXPECT_GE(busy.link_us[kRead], 5000u);
  EXPECT_GE(busy.link_us[kWrite], 5000u);
  EXPECT_EQ(busy.drive_us, busy.link_us[kRead] + busy.link_us[kWrite]);
}

TEST(LinkMeter, ReadsAndWritesAtOnceCountTheirOverlapOnceOnTheDrive) {
  LinkMeter meter(nullptr);
  meter.started(Link::kNvmeRead);
  hold_for(10);
  meter.started(Link::kNvmeWrite);
  hold_for(20);  // both in flight
  meter.finished(Link::kNvmeRead, 4096, 0, nullptr);
  hold_for(10);
  meter.finished(Link::kNvmeWrite, 4096, 0, nullptr);
  const LinkMeter::BusyTimes busy = meter.busy_times();
  const uint64_t read = busy.link_us[kRead], write = busy.link_us[kWrite];
  EXPECT_GE(read, 30000u);
  EXPECT_GE(write, 30000u);
  EXPECT_GE(busy.drive_us, std::max(read, write));
  // The drive ran from the read's start to the write's end: the sum less the overlap.
  EXPECT_LE(busy.drive_us + 20000, read + write);
}

TEST(LinkMeter, TwoTransfersOnOneLinkAtOnceCountTheLinkBusyOnce) {
  LinkMeter meter(nullptr);
  meter.started(Link::kNvmeRead);
  meter.started(Link::kNvmeRead);
  hold_for(10);
  meter.finished(Link::kNvmeRead, 4096, 0, nullptr);
  hold_for(10);
  meter.finished(Link::kNvmeRead, 4096, 0, nullptr);
  const LinkMeter::BusyTimes busy = meter.busy_times();
  EXPECT_GE(busy.link_us[kRead], 20000u);
  EXPECT_EQ(busy.drive_us, busy.link_us[kRead]);
  EXPECT_EQ(meter.counters(Link::kNvmeRead).transfers, 2u);
  EXPECT_EQ(meter.counters(Link::kNvmeRead).bytes, 8192u);
}

TEST(LinkMeter, CopiesToAndFromTheDeviceLeaveTheDriveIdle) {
  LinkMeter meter(nullptr);
  meter.started(Link::kHostToDevice);
  hold_for(5);
  meter.finished(Link::kHostToDevice, 4096, 0, nullptr);
  const LinkMeter::BusyTimes busy = meter.busy_times();
  EXPECT_GE(busy.link_us[kToDevice], 5000u);
  EXPECT_EQ(busy.drive_us, 0u);
}

TEST(LinkMeter, ASnapshotCountsTheTransferStillInFlight) {
  LinkMeter meter(nullptr);
  meter.started(Link::kNvmeWrite);
  hold_for(5);
  const LinkMeter::BusyTimes during = meter.busy_times();
  EXPECT_GE(during.link_us[kWrite], 5000u);
  EXPECT_EQ(during.drive_us, during.link_us[kWrite]);  // one moment for both
  hold_for(5);
  meter.finished(Link::kNvmeWrite, 0, 0, nullptr);  // failed: no bytes, but busy all the same
  const LinkMeter::BusyTimes after = meter.busy_times();
  EXPECT_GE(after.link_us[kWrite], during.link_us[kWrite] + 5000);
  EXPECT_EQ(after.drive_us, after.link_us[kWrite]);
  EXPECT_EQ(meter.counters(Link::kNvmeWrite).bytes, 0u);
}

}  // namespace
}  // namespace strata::datapath
