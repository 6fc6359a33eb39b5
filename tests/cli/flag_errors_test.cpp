// A flag the parser refuses (unknown, not a number, out of its range) is bad input: exit status
// 2 and a message naming the flag, as the commands' own checks give (before, CLI11's own codes,
// 104 to 109, reached the shell). Help still exits 0, and a command's own status is its own.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_run.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::run_cli;

TEST(FlagErrors, AFlagTheParserRefusesExitsTwoNamingIt) {
  struct Case {
    std::vector<std::string> args;
    const char* named;
  };
  const std::vector<Case> cases = {
      {{"plan", "--model", "llama-2-7b", "--bogus"}, "--bogus"},
      {{"plan", "--model", "llama-2-7b", "--seq", "many"}, "--seq"},
      {{"plan", "--model", "llama-2-7b", "--stream-buffers", "99"}, "--stream-buffers"},
      {{"plan", "--model", "llama-2-7b", "--warmup-steps", "0"}, "--warmup-steps"},
      {{"bench", "io", "--qd", "lots"}, "--qd"},
      // An empty value is refused, not read as the flag's absence (--host-ram "" planned as if
      // no RAM had been given, until 2026-12-05).
      {{"plan", "--model", "llama-2-7b", "--host-ram", ""}, "--host-ram: must not be empty"},
      {{"plan", "--model", "llama-2-7b", "--gpu", ""}, "--gpu: must not be empty"},
      {{"plan", "--model", "llama-2-7b", "--device-budget", ""}, "--device-budget"},
  };
  for (const Case& c : cases) {
    const CliRun r = run_cli(c.args);
    EXPECT_EQ(r.code, 2) << c.named << ": " << r.err;
    EXPECT_NE(r.err.find(c.named), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// A command's own exit status is not a parser refusal: it reaches the shell as the command sets
// it (plan: 3 when the job fits no GPU planned; bench pinned-map: 1 for a size it cannot read).
TEST(FlagErrors, ACommandsOwnExitStatusIsKept) {
  CliRun r = run_cli({"plan", "--model", "llama-2-70b", "--gpu", "rtx-4090", "--offload", "none"});
  EXPECT_EQ(r.code, 3) << r.err;
  r = run_cli({"bench", "pinned-map", "--size", "lots"});
  EXPECT_EQ(r.code, 1) << r.err;
}

TEST(FlagErrors, HelpStillExitsZero) {
  const CliRun r = run_cli({"plan", "--help"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--warmup-steps"), std::string::npos);
}

}  // namespace
}  // namespace strata
