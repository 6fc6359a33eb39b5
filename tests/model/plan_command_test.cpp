// Runs `strata plan` through its CLI11 definition, as the strata program does.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"

namespace strata {
namespace {

struct CommandRun {
  int code = 0;
  std::string out;
  std::string err;
};

CommandRun run(std::vector<std::string> args) {
  CLI::App app{"strata"};
  app.require_subcommand(1);
  cli::add_plan_command(app);
  args.insert(args.begin(), "strata");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  CommandRun r;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    r.code = e.get_exit_code();
  }
  r.out = ::testing::internal::GetCapturedStdout();
  r.err = ::testing::internal::GetCapturedStderr();
  return r;
}

TEST(PlanCommand, PrintsJsonForLlama70bOnTheThreeReferenceGpus) {
  for (const char* method : {"full", "lora", "qlora"}) {
    CommandRun r = run({"plan", "--model", "llama-2-70b", "--method", method, "--gpu", "h100-sxm",
                        "--gpu", "a100-80gb", "--gpu", "rtx-4090", "--nvme", "4:gen4", "--json"});
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["method"], method);
    EXPECT_EQ(j["gpus"].size(), 3u);
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
    // Full fine-tuning streams everything; 4-bit QLoRA fits the H100 with nothing to offload.
    if (std::string(method) == "full") {
      EXPECT_GT(j["zero_infinity"]["host_bytes"].get<uint64_t>(), j["host_bytes"].get<uint64_t>());
    }
  }
}

TEST(PlanCommand, PrintsReadableTables) {
  CommandRun r = run({"plan", "--model", "llama-2-70b", "--method", "qlora", "--gpu", "rtx-4090",
                      "--host-ram", "128G"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("strata plan: llama-2-70b, qlora"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ZeRO-Infinity"), std::string::npos);
  EXPECT_NE(r.out.find("rtx-4090"), std::string::npos);
  EXPECT_NE(r.out.find("Cheapest that fits"), std::string::npos);
}

TEST(PlanCommand, BadInputExitsNonZeroWithTheReason) {
  CommandRun r = run({"plan", "--model", "llama-9-1t"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("llama-2-70b"), std::string::npos) << r.err;  // lists the presets
  r = run({"plan", "--model", "llama-2-7b", "--nvme", "3:gen9"});
  EXPECT_EQ(r.code, 2);
  r = run({"plan", "--model", "llama-2-7b", "--host-ram", "lots"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--host-ram"), std::string::npos);
  r = run({"plan"});  // --model is required
  EXPECT_NE(r.code, 0);
}

}  // namespace
}  // namespace strata
