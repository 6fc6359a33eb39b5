#include "common/units.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(ParseBytes, AcceptsSuffixesAsPowersOf1024) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("4K"), 4096u);
  EXPECT_EQ(parse_bytes("1M"), 1u << 20);
  EXPECT_EQ(parse_bytes("1MiB"), 1u << 20);
  EXPECT_EQ(parse_bytes("2g"), 2ull << 30);
  EXPECT_EQ(parse_bytes("1.5G"), 3ull << 29);
  EXPECT_EQ(parse_bytes("1T"), 1ull << 40);
  // Any case (docs/planner.md says so; "64GIB" was refused until 2026-12-05).
  for (const char* spelled : {"64G", "64g", "64GB", "64Gb", "64gb", "64GiB", "64GIB", "64gib"}) {
    EXPECT_EQ(parse_bytes(spelled), 64ull << 30) << spelled;
  }
  EXPECT_EQ(parse_bytes("10B"), 10u);
  EXPECT_EQ(parse_bytes("10b"), 10u);
}

TEST(ParseBytes, RejectsGarbageAndOverflow) {
  EXPECT_FALSE(parse_bytes(""));
  EXPECT_FALSE(parse_bytes("M"));
  EXPECT_FALSE(parse_bytes("-1"));
  EXPECT_FALSE(parse_bytes("1X"));
  EXPECT_FALSE(parse_bytes("1.2.3"));
  EXPECT_FALSE(parse_bytes("1GiBs"));
  EXPECT_FALSE(parse_bytes("1Bi"));
  EXPECT_FALSE(parse_bytes("99999999999T"));
}

// Found by tests/fuzz/config_fuzz (a parsed count printed in decimal must parse back to itself):
// counts above 2^63 came back as 2^63.
TEST(ParseBytes, CountsAboveTwoToTheSixtyThreeParseExactly) {
  EXPECT_EQ(parse_bytes("10000000000000000000"), 10000000000000000000ull);
  EXPECT_EQ(parse_bytes("18446744073709551615"), 18446744073709551615ull);
  EXPECT_EQ(parse_bytes("15E"), std::nullopt);
  EXPECT_FALSE(parse_bytes("18446744073709551616"));
  EXPECT_FALSE(parse_bytes("16777216T"));  // 2^64
}

TEST(FormatBytes, PicksTheLargestWholeUnit) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3ull << 30), "3.00 GiB");
}

}  // namespace
}  // namespace strata
