// Helpers shared by the storage tests: a private scratch directory and aligned buffers.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "io/engine_factory.h"

// Names engine parameters in test output ("psync") rather than as raw bytes.
namespace strata::io {
inline void PrintTo(IoEngineKind kind, std::ostream* os) {
  *os << io_engine_kind_name(kind);
}
}  // namespace strata::io

namespace strata::storage::testing {

// A fresh directory under $STRATA_TEST_DIR (set by ctest) or /tmp, removed with its content.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("STRATA_TEST_DIR");
    std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/storage-test-XXXXXX";
    std::filesystem::create_directories(std::filesystem::path(pattern).parent_path());
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) == nullptr) std::abort();
    path_ = buffer.data();
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  // Names in the directory, for checking that nothing was left behind.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

 private:
  std::string path_;
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// A zero-filled buffer of `bytes` aligned to `alignment`, as direct I/O needs.
class AlignedBuffer {
 public:
  AlignedBuffer(uint64_t bytes, uint64_t alignment = 4096)
      : bytes_(bytes),
        data_(static_cast<uint8_t*>(
            std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment))) {
    if (data_ == nullptr) std::abort();
    std::memset(data_.get(), 0, bytes_);
  }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return bytes_; }

  void fill_random(uint64_t seed, uint64_t count) {
    std::mt19937_64 rng(seed);
    for (uint64_t i = 0; i < count; i += 8) {
      const uint64_t word = rng();
      std::memcpy(data() + i, &word, count - i < 8 ? count - i : 8);
    }
  }

 private:
  uint64_t bytes_;
  std::unique_ptr<uint8_t, FreeDeleter> data_;
};

}  // namespace strata::storage::testing
