// The progress display of `strata bench ...`: bar and plain lines say how much of what, how fast.
#include "progress.h"

#include <gtest/gtest.h>

#include <cmath>

namespace strata::bench {
namespace {

TEST(ProgressDisplay, BarHasRateElapsedAndEta) {
  EXPECT_EQ(ProgressDisplay::bar_line("bench io: strata write", 0.5, 1.21e9,
                                      ProgressDisplay::Unit::kBytes, "", 4.1, 4.1),
            "[bench io: strata write] [##########..........]  50%  1.21 GB/s  elapsed 4.1 s  ETA "
            "4.1 s");
  EXPECT_EQ(
      ProgressDisplay::bar_line("strata", 0, 0, ProgressDisplay::Unit::kCount, "steps", 0.2, NAN),
      "[strata] [....................]   0%  0.00 steps/s  elapsed 0.2 s  ETA ?");
}

TEST(ProgressDisplay, PlainLineSaysHowMuchOfWhat) {
  EXPECT_EQ(ProgressDisplay::plain_line("strata", 0.5, 2, 4, "steps", 0.25,
                                        ProgressDisplay::Unit::kCount, 8, 8),
            "[strata] 50% (2 of 4 steps), 0.25 steps/s, elapsed 8.0 s, ETA 8.0 s");
  EXPECT_EQ(
      ProgressDisplay::plain_line("io", 1, 2e9, 2e9, "", 1e9, ProgressDisplay::Unit::kBytes, 2, 0),
      "[io] 100% (2.00 GB of 2.00 GB), 1.00 GB/s, elapsed 2.0 s, ETA 0.0 s");
}

TEST(ProgressDisplay, DurationsReadAsAPersonWritesThem) {
  EXPECT_EQ(human_duration(4.14), "4.1 s");
  EXPECT_EQ(human_duration(200), "3 min 20 s");
  EXPECT_EQ(human_duration(3900), "1 h 05 min");
}

}  // namespace
}  // namespace strata::bench
