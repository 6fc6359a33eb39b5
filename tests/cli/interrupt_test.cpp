// Ctrl-C (SIGINT to the whole process group, as a terminal sends it) and SIGTERM (to the
// program alone, as `kill PID` sends it) in the middle of the commands that create big files:
// the program dies of the signal and nothing it created is left in the directory.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "model/test_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::CliOptions;
using testing::CliRun;
using testing::run_cli;

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
  return names;
}

// Runs `args` in its own process group; once something appears in `watched` (the run is under
// way and has created its files) and `delay` has passed, sends `signal_number` to the group or
// to the program alone.
CliRun interrupt(const std::vector<std::string>& args, const fs::path& watched, int signal_number,
                 bool whole_group, std::chrono::milliseconds delay) {
  std::atomic<pid_t> pid{0};
  std::atomic<bool> done{false}, sent{false};
  std::thread signaller([&] {
    while (!done.load() && (pid.load() == 0 || entries(watched).empty())) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(delay);
    if (!done.load()) {
      ::kill(whole_group ? -pid.load() : pid.load(), signal_number);
      sent = true;
    }
  });
  CliOptions options;
  options.new_process_group = true;
  options.on_start = [&](pid_t child) { pid = child; };
  CliRun r = run_cli(args, options);
  done = true;
  signaller.join();
  EXPECT_TRUE(sent.load()) << "the run ended before it could be interrupted: " << r.err;
  return r;
}

struct Case {
  const char* name;
  int signal_number;
  bool whole_group;
};
const Case kCases[] = {{"SIGINT to the group", SIGINT, true},
                       {"SIGTERM to the program", SIGTERM, false}};

TEST(Interrupt, BenchIoLeavesNoFile) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const fs::path dir =
        testing::scratch_dir(std::string("interrupt-io-") + std::to_string(c.signal_number));
    const CliRun r = interrupt({"bench", "io", "--path", dir.string(), "--size", "256M", "--block",
                                "1M", "--qd", "4", "--rounds", "50"},
                               dir, c.signal_number, c.whole_group, std::chrono::milliseconds(300));
    EXPECT_EQ(r.code, 128 + c.signal_number) << r.err;
    EXPECT_TRUE(entries(dir).empty()) << entries(dir)[0];
  }
}

TEST(Interrupt, BenchFinetuneLeavesNoSwapFile) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const fs::path dir =
        testing::scratch_dir(std::string("interrupt-finetune-") + std::to_string(c.signal_number));
    const CliRun r =
        interrupt({"bench", "finetune", "--model", "llama-2-7b", "--scale", "0.05", "--layers", "2",
                   "--steps", "200", "--seq", "64", "--batch", "1", "--nvme", dir.string()},
                  dir, c.signal_number, c.whole_group, std::chrono::milliseconds(500));
    EXPECT_EQ(r.code, 128 + c.signal_number) << r.err;
    EXPECT_TRUE(entries(dir).empty()) << entries(dir)[0];
  }
}

TEST(Interrupt, BenchFinetuneDeepSpeedWorkerLeavesNoSwapFolder) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const fs::path dir =
        testing::scratch_dir(std::string("interrupt-deepspeed-") + std::to_string(c.signal_number));
    const CliRun r = interrupt(
        {"bench",    "finetune",  "--model",    "llama-2-7b", "--scale",    "0.05",
         "--layers", "2",         "--steps",    "200",        "--seq",      "64",
         "--batch",  "1",         "--strategy", "deepspeed",  "--baseline", "deepspeed-tuned",
         "--nvme",   dir.string()},
        dir, c.signal_number, c.whole_group, std::chrono::milliseconds(500));
    EXPECT_EQ(r.code, 128 + c.signal_number) << r.err;
    EXPECT_TRUE(entries(dir).empty()) << entries(dir)[0];
  }
}

}  // namespace
}  // namespace strata
