// A flag the parser refuses (unknown, not a number, out of its range) is bad input: exit status
// 2 and a message naming the flag, as the commands' own checks give (before, CLI11's own codes,
// 104 to 109, reached the shell). Help still exits 0.
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
  };
  for (const Case& c : cases) {
    const CliRun r = run_cli(c.args);
    EXPECT_EQ(r.code, 2) << c.named << ": " << r.err;
    EXPECT_NE(r.err.find(c.named), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(FlagErrors, HelpStillExitsZero) {
  const CliRun r = run_cli({"plan", "--help"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--warmup-steps"), std::string::npos);
}

}  // namespace
}  // namespace strata
