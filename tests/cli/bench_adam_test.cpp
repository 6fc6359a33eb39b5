// `strata bench adam --numa-node`: the optimizer's threads bound one per core of a node, for
// measuring thread placement (issue 20) against the unbound default; a node the machine lacks is
// bad input (exit 2, the node named), not a run on some other placement.
#include <gtest/gtest.h>

#include <algorithm>
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

// The bound is the faster of the two traffic passes, and says which: the update's own loop alone
// ran slower than the update on a Zen 5 guest, so it could not be the bound by itself. A SIMD
// level without a prefetched pass (AVX2's update prefetches already) has the loop as its bound.
TEST(BenchAdam, TheBoundIsTheFasterTrafficPassAndNamesIt) {
  for (const char* simd : {"auto", "avx2", "scalar"}) {
    SCOPED_TRACE(simd);
    const CliRun r = run_cli({"bench", "adam", "--params", "1M", "--threads", "1", "--simd", simd,
                              "--steps", "4", "--no-torch", "--json"});
    if (r.code != 0 && r.err.find("is not supported by this CPU") != std::string::npos) continue;
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const double loop = j["bound_loop_mparams_per_s"].get<double>();
    const double bound = j["bound_mparams_per_s"].get<double>();
    const bool has_prefetched = j["simd"] == "avx512";
    ASSERT_EQ(j["bound_prefetched_mparams_per_s"].is_null(), !has_prefetched) << r.out;
    const double prefetched =
        has_prefetched ? j["bound_prefetched_mparams_per_s"].get<double>() : 0;
    EXPECT_GT(loop, 0);
    EXPECT_EQ(bound, std::max(loop, prefetched));
    EXPECT_EQ(j["bound_pass"], prefetched > loop ? "prefetched" : "the update's loop");
    EXPECT_DOUBLE_EQ(j["of_bound"].get<double>(), j["strata_mparams_per_s"].get<double>() / bound);
  }
  const CliRun table =
      run_cli({"bench", "adam", "--params", "1M", "--threads", "1", "--steps", "2", "--no-torch"});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("traffic, the update's loop"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(" = bound"), std::string::npos) << table.out;
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
