// `strata bench io --mixed`: beside each direction's rate while the other runs, the half-duplex
// drive `strata plan --nvme` models that moves what this drive moved with both directions at once
// (sched/device_model.h, half_duplex_rates), in the JSON and the table alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "model/test_dir.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::run_cli;

TEST(BenchIo, MixedReportsTheHalfDuplexDriveThatMovesItsBytes) {
  const std::string dir = testing::scratch_dir("bench-io-mixed").string();
  const CliRun r = run_cli({"bench", "io", "--path", dir, "--size", "32M", "--block", "1M", "--qd",
                            "4", "--rounds", "1", "--mixed", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const double read = j["read_gbps"], write = j["write_gbps"];
  const double mixed_read = j["mixed_read_gbps"], mixed_write = j["mixed_write_gbps"];
  const double factor = j["half_duplex_factor"];
  const double half_read = j["half_duplex_read_gbps"], half_write = j["half_duplex_write_gbps"];
  EXPECT_DOUBLE_EQ(factor, std::min(1.0, mixed_read / read + mixed_write / write));
  EXPECT_DOUBLE_EQ(half_read, read * factor);
  EXPECT_DOUBLE_EQ(half_write, write * factor);
  if (factor < 1) {  // taking turns at those rates moves the mixed second's bytes in one second
    EXPECT_NEAR(mixed_read / half_read + mixed_write / half_write, 1.0, 1e-9);
  }
}

// Without --mixed the JSON has no half-duplex drive; with it the table has its row too.
TEST(BenchIo, OnlyMixedReportsAHalfDuplexDrive) {
  const std::string dir = testing::scratch_dir("bench-io-solo").string();
  const CliRun json = run_cli({"bench", "io", "--path", dir, "--size", "16M", "--block", "1M",
                               "--qd", "4", "--rounds", "1", "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_FALSE(nlohmann::json::parse(json.out).contains("half_duplex_read_gbps"));

  const CliRun table = run_cli({"bench", "io", "--path", dir, "--size", "16M", "--block", "1M",
                                "--qd", "4", "--rounds", "1", "--mixed"});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("as a half-duplex drive (strata plan --nvme)"), std::string::npos)
      << table.out;
}

}  // namespace
}  // namespace strata
