// A scratch directory for tests that write files: $STRATA_TEST_DIR (set by ctest) or the system
// temporary directory, plus a per-process subfolder so parallel test binaries do not collide.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace strata::testing {

// The folders scratch_dir made in this process, removed when it exits if the tests left them
// empty (a folder with files in it stays, for a failure to be looked at): run by hand, the tests
// would otherwise leave a `name.PID` folder in the temporary directory per run.
class ScratchDirs {
 public:
  ScratchDirs() = default;
  ScratchDirs(const ScratchDirs&) = delete;
  ScratchDirs& operator=(const ScratchDirs&) = delete;
  ~ScratchDirs() {
    // A forked child that exits runs this too: only the process that made them removes them.
    if (::getpid() != owner_) return;
    for (const std::filesystem::path& dir : dirs_) {
      std::error_code ignored;  // not empty, or gone already: nothing to do
      std::filesystem::remove(dir, ignored);
    }
  }
  void add(const std::filesystem::path& dir) { dirs_.push_back(dir); }

 private:
  pid_t owner_ = ::getpid();
  std::vector<std::filesystem::path> dirs_;
};

inline std::filesystem::path scratch_dir(const std::string& name) {
  static ScratchDirs made;
  const char* env = std::getenv("STRATA_TEST_DIR");
  std::filesystem::path base = env ? env : std::filesystem::temp_directory_path();
  std::filesystem::path dir = base / (name + "." + std::to_string(::getpid()));
  if (std::filesystem::create_directories(dir)) made.add(dir);
  return dir;
}

}  // namespace strata::testing
