// A scratch directory for tests that write files: $STRATA_TEST_DIR (set by ctest) or the system
// temporary directory, plus a per-process subfolder so parallel test binaries do not collide.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace strata::testing {

inline std::filesystem::path scratch_dir(const std::string& name) {
  const char* env = std::getenv("STRATA_TEST_DIR");
  std::filesystem::path base = env ? env : std::filesystem::temp_directory_path();
  std::filesystem::path dir = base / (name + "." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace strata::testing
