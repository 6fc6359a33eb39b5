// Output paths are checked before any work: a --trace or --plot that cannot be written fails at
// once with exit status 2 and a message naming the option, no worker is started and nothing is
// created (before, a finished benchmark lost its result and exited 1 at the end).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "model/test_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_cli;

TEST(OutputPaths, UnwritableTraceOrPlotFailsBeforeTheRun) {
  const fs::path dir = testing::scratch_dir("output-paths");
  const fs::path nvme = dir / "nvme";
  fs::create_directories(nvme);
  const fs::path file = dir / "a-file";
  std::ofstream(file) << "x";
  struct Case {
    const char* option;
    std::string path;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"--trace", (dir / "missing" / "trace.json").string(), "No such file or directory"},
      {"--trace", dir.string(), "is a directory"},
      {"--trace", (file / "trace.json").string(), "Not a directory"},
      {"--plot", (dir / "missing" / "memory.png").string(), "No such file or directory"},
      {"--plot", dir.string() + "/", "names a directory"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.option) + " " + c.path);
    const CliRun r = run_cli({"bench", "finetune", "--model", "llama-2-7b", "--scale", "0.05",
                              "--layers", "2", "--steps", "2", "--seq", "64", "--batch", "1",
                              "--nvme", nvme.string(), c.option, c.path});
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(c.option), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("worker starting"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_TRUE(fs::is_empty(nvme));
  }
  // The check leaves nothing behind and changes no existing file.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"a-file", "nvme"}));
  std::ifstream in(file);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "x");
}

}  // namespace
}  // namespace strata
