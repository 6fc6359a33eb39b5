#include "sched/access_lanes.h"

#include <gtest/gtest.h>

#include <random>

namespace strata::sched {
namespace {

// One phase of `n` reads of distinct tensors: positions 0..n-1, each able to have a lane.
AccessSchedule reads(uint32_t n) {
  AccessSchedule::Builder b;
  b.begin_phase({PhaseKind::kForward, 0});
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_TRUE(b.add({{i, 1}, Tier::kPinned, AccessMode::kRead}).is_ok());
  }
  Result<AccessSchedule> s = std::move(b).build();
  EXPECT_TRUE(s.is_ok());
  return std::move(s).value();
}

// What next() must answer, by looking at every position.
uint32_t scan(const AccessLanes& lanes, uint32_t from, uint32_t end, uint64_t set) {
  for (uint32_t p = from; p < end; ++p) {
    const uint32_t lane = lanes.lane(p);
    if (lane != AccessLanes::kNoLane && (set >> lane & 1) != 0) return p;
  }
  return end;
}

TEST(AccessLanes, NextSkipsLongEmptyStretchesAcrossSummaryBlocks) {
  // 3 summary blocks (64 words of 64 positions each) and a part.
  const uint32_t n = 3 * 4096 + 100;
  const AccessSchedule schedule = reads(n);
  AccessLanes lanes;
  lanes.reset(schedule, 4);
  EXPECT_EQ(lanes.next(0, n, 0xF), n);
  lanes.set(5, 2);
  lanes.set(4096 * 2 + 7, 1);
  lanes.set(n - 1, 3);
  EXPECT_EQ(lanes.next(0, n, 0xF), 5u);
  EXPECT_EQ(lanes.next(6, n, 0xF), 4096u * 2 + 7);
  EXPECT_EQ(lanes.next(6, n, 1u << 3), n - 1);
  EXPECT_EQ(lanes.next(6, n - 1, 1u << 3), n - 1);  // not in [from, end)
  EXPECT_EQ(lanes.next(6, n, 1u << 0), n);
  // Cleared again: the summary forgets the word.
  lanes.set(4096 * 2 + 7, AccessLanes::kNoLane);
  EXPECT_EQ(lanes.next(6, n, 0xF), n - 1);
  EXPECT_TRUE(lanes.bitsets_match_lanes());
}

TEST(AccessLanes, NextAgreesWithAScanOfEveryPositionUnderRandomChanges) {
  const uint32_t n = 20000;
  const AccessSchedule schedule = reads(n);
  AccessLanes lanes;
  lanes.reset(schedule, 6);
  std::mt19937 rng(7);
  for (int round = 0; round < 4000; ++round) {
    // Mostly clearing, so that long empty stretches appear as in a window whose links are full.
    const uint32_t position = rng() % n;
    const uint32_t lane = rng() % 4 == 0 ? rng() % 6 : AccessLanes::kNoLane;
    lanes.set(position, lane);
    const uint32_t from = rng() % n;
    const uint32_t end = from + rng() % (n - from + 1);
    const uint64_t set = rng() % 64;
    ASSERT_EQ(lanes.next(from, end, set), scan(lanes, from, end, set))
        << "round " << round << " from " << from << " end " << end << " lanes " << set;
  }
  EXPECT_TRUE(lanes.bitsets_match_lanes());
}

}  // namespace
}  // namespace strata::sched
