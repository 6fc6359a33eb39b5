// `strata bench optimizer` through the real program: the pipelined step reads each tensor at most
// once, and the report puts every stage beside the step at the bytes the step moved.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "model/test_dir.h"

namespace strata {
namespace {

using testing::run_cli;

// 32M parameters in 32 tensors of one sub-group each, through a 192 MiB pinned budget (16 of
// them read ahead): before a read ahead counted as a use, the LRU order gave each read ahead the
// room of an earlier one and the step read 27.9 bytes per parameter, where it needs at most 16
// (12 of fp32 master, m and v; 2 of bf16 gradient; 2 of bf16 weight, unless still in memory).
TEST(OptimizerBench, TheStepReadsEachTensorOnceAndEachStageIsPutAtTheStepsBytes) {
  const auto dir = testing::scratch_dir("optimizer-bench");
  const testing::CliRun r =
      run_cli({"bench", "optimizer", "--params", "32M", "--param-elements", "1M", "--pinned-budget",
               "192MiB", "--repeats", "1", "--nvme", dir.string(), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const auto n = j["params"].get<double>();
  ASSERT_EQ(n, 32e6);
  EXPECT_LE(j["pipelined_nvme_bytes_read"].get<double>(), 16 * n);
  EXPECT_GE(j["pipelined_nvme_bytes_read"].get<double>(), 12 * n);     // the states never fit
  EXPECT_EQ(j["pipelined_nvme_bytes_written"].get<double>(), 14 * n);  // states and weights
  EXPECT_EQ(j["read_pass_nvme_bytes"].get<double>(), 12 * n);
  EXPECT_EQ(j["write_pass_nvme_bytes"].get<double>(), 12 * n);
  EXPECT_EQ(j["read_write_overlapped_nvme_bytes"].get<double>(), 24 * n);
  // Each stage alone, scaled to the step's bytes in its direction at its own pass's rate.
  const double step_read = j["pipelined_nvme_bytes_read"].get<double>() / (12 * n);
  EXPECT_NEAR(j["read_s_at_step_bytes"].get<double>(), j["read_s"].get<double>() * step_read, 1e-9);
  EXPECT_NEAR(j["write_s_at_step_bytes"].get<double>(), j["write_s"].get<double>() * 14 / 12, 1e-9);
  const double slowest =
      std::max({j["read_s_at_step_bytes"].get<double>(), j["write_s_at_step_bytes"].get<double>(),
                j["update_s"].get<double>()});
  EXPECT_DOUBLE_EQ(j["slowest_stage_s_at_step_bytes"].get<double>(), slowest);
  EXPECT_DOUBLE_EQ(j["pipelined_vs_slowest_at_step_bytes"].get<double>(),
                   j["pipelined_step_s"].get<double>() / slowest);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
