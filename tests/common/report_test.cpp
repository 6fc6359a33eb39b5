// The plain-text output helpers: a change's sign is printed once.
#include "common/report.h"

#include <gtest/gtest.h>

#include <cmath>

namespace strata {
namespace {

TEST(SignedPercent, SignIsWrittenOnceAndZeroHasNone) {
  EXPECT_EQ(signed_percent(-0.557), "-55.7%");
  EXPECT_EQ(signed_percent(0.032), "+3.2%");
  EXPECT_EQ(signed_percent(-(-0.053)), "+5.3%");  // a negative reduction is an increase
  EXPECT_EQ(signed_percent(0.0), "0.0%");
  EXPECT_EQ(signed_percent(-0.00001), "0.0%");  // never "-0.0%"
  EXPECT_EQ(signed_percent(1.5, 0), "+150%");
}

}  // namespace
}  // namespace strata
