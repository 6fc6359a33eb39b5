// Helpers shared by the storage tests: a private scratch directory, aligned buffers, an engine
// that holds requests in flight, and tampering with a swap file behind the store's back.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <latch>
#include <memory>
#include <mutex>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "io/engine_factory.h"
#include "storage/swap_store.h"

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

// The engine the extent store tests run on: several engine blocks per request for the larger
// sizes, two threads.
inline Result<std::unique_ptr<io::IoEngine>> make_engine(io::IoEngineKind kind) {
  io::IoEngineOptions options;
  options.queue_depth = 16;
  options.block_size = 256 << 10;
  options.threads = 2;
  return io::make_io_engine(kind, options);
}

// Rewrites bytes of the swap file through an ordinary descriptor, as a failing drive or another
// program would, without Strata knowing.
inline void tamper(const std::string& path, uint64_t offset, uint8_t xor_mask) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  uint8_t byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  byte ^= xor_mask;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

// An engine that passes everything to a real one; the doubles below change submit() only.
class ForwardingEngine : public io::IoEngine {
 public:
  explicit ForwardingEngine(io::IoEngine& inner) : inner_(inner) {}
  const io::IoEngineOptions& options() const override { return inner_.options(); }
  Result<uint32_t> register_file(int fd) override { return inner_.register_file(fd); }
  Result<int32_t> register_buffer(void* base, uint64_t bytes) override {
    return inner_.register_buffer(base, bytes);
  }
  Status unregister_buffer(int32_t index) override { return inner_.unregister_buffer(index); }
  Status submit(io::IoRequest* request) override { return inner_.submit(request); }

 protected:
  io::IoEngine& inner_;
};

// Holds requests back from the real engine while closed (as it starts), so that "in flight"
// lasts as long as a test needs; open() lets the held ones and every later one through until
// close(). A write reaches the engine from the store's content thread some time after
// write_async returned (content_thread.h), so a test opens the gate and waits rather than
// counting on the request being held already.
class GatedEngine final : public ForwardingEngine {
 public:
  using ForwardingEngine::ForwardingEngine;
  const char* name() const override { return "gated"; }
  Status submit(io::IoRequest* request) override {
    {
      std::lock_guard lock(mutex_);
      if (!open_) {
        held_.push_back(request);
        return Status::ok();
      }
    }
    return inner_.submit(request);
  }
  void open() {
    std::vector<io::IoRequest*> held;
    {
      std::lock_guard lock(mutex_);
      open_ = true;
      held.swap(held_);
    }
    for (io::IoRequest* request : held) ASSERT_TRUE(inner_.submit(request).is_ok());
  }
  void close() {
    std::lock_guard lock(mutex_);
    open_ = false;
  }

 private:
  std::mutex mutex_;
  bool open_ = false;
  std::vector<io::IoRequest*> held_;
};

// Refuses every submission with STRATA_E_IO, as an engine that has stopped would: the fault a
// submission can meet after the store has admitted a request.
class RefusingEngine final : public ForwardingEngine {
 public:
  using ForwardingEngine::ForwardingEngine;
  const char* name() const override { return "refusing"; }
  Status submit(io::IoRequest*) override {
    return Status::error(STRATA_E_IO, "the engine refuses requests");
  }
};

// One asynchronous request's ExtentIo and a latch its completion counts down.
struct Completion {
  ExtentIo io;
  std::latch done{1};
  Completion() {
    io.on_complete = [](ExtentIo*, void* context) {
      static_cast<std::latch*>(context)->count_down();
    };
    io.context = &done;
  }
};

}  // namespace strata::storage::testing
