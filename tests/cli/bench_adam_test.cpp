// `strata bench adam --numa-node`: the optimizer's threads bound one per core of a node, for
// measuring thread placement (issue 20) against the unbound default; a node the machine lacks is
// bad input (exit 2, the node named), not a run on some other placement.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::run_cli;

TEST(BenchAdam, BindingToANumaNodeRunsAndReportsTheNode) {
  const CliRun bound = run_cli({"bench", "adam", "--params", "1M", "--threads", "2", "--numa-node",
                                "0", "--steps", "2", "--no-torch", "--json"});
  ASSERT_EQ(bound.code, 0) << bound.err;
  const auto j = nlohmann::json::parse(bound.out);
  EXPECT_EQ(j["numa_node"], 0);
  EXPECT_EQ(j["threads"], 2);
  EXPECT_GT(j["strata_mparams_per_s"].get<double>(), 0);

  const CliRun unbound = run_cli({"bench", "adam", "--params", "1M", "--threads", "2", "--steps",
                                  "2", "--no-torch", "--json"});
  ASSERT_EQ(unbound.code, 0) << unbound.err;
  EXPECT_TRUE(nlohmann::json::parse(unbound.out)["numa_node"].is_null());

  const CliRun table = run_cli({"bench", "adam", "--params", "1M", "--threads", "1", "--numa-node",
                                "0", "--steps", "2", "--no-torch"});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("bound one per core of NUMA node 0"), std::string::npos) << table.out;
}

TEST(BenchAdam, ANumaNodeTheMachineLacksIsBadInput) {
  const CliRun r = run_cli({"bench", "adam", "--params", "1M", "--numa-node", "1023", "--steps",
                            "2", "--no-torch", "--json"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("NUMA node 1023 does not exist"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace
}  // namespace strata
