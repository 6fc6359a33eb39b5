// `strata bench pinned-map` through the real program: one row per size, both sides measured, and
// bad sizes refused with a message.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace strata {
namespace {

using testing::run_cli;

TEST(PinnedMapBench, ReportsSmallAndHugePagesForEverySize) {
  const testing::CliRun r = run_cli({"bench", "pinned-map", "--size", "1MiB", "--size", "4MiB",
                                     "--reps", "1", "--buffers", "2", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["sizes"].size(), 2u);
  EXPECT_EQ(j["sizes"][0]["bytes"], 1u << 20);
  EXPECT_EQ(j["sizes"][1]["bytes"], 4u << 20);
  for (const auto& row : j["sizes"]) {
    EXPECT_GT(row["small_pages_ms"].get<double>(), 0);
    EXPECT_GT(row["huge_pages_ms"].get<double>(), 0);
  }
  EXPECT_EQ(j["buffers_per_batch"], 2);
}

TEST(PinnedMapBench, ASizeThatIsNotOneIsRefused) {
  const testing::CliRun r = run_cli({"bench", "pinned-map", "--size", "lots"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not a size: lots"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata
