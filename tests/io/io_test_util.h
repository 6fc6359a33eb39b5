// Scratch files, aligned buffers and engine construction shared by the io tests.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <ostream>
#include <random>
#include <string>

#include "common/unique_fd.h"
#include "io/engine_factory.h"
#include "io/io_engine.h"
#include "io/uring_probe.h"

namespace strata::io::testing {

inline std::string scratch_dir() {
  const char* dir = std::getenv("STRATA_TEST_DIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

// A file in the scratch directory, opened with O_DIRECT where the file system allows it, and
// removed when the test ends.
class ScratchFile {
 public:
  explicit ScratchFile(uint64_t size = 0) {
    std::string path = scratch_dir() + "/strata-io-test-XXXXXX";
    const int fd = ::mkstemp(path.data());
    if (fd < 0) {
      ADD_FAILURE() << "mkstemp in " << scratch_dir() << ": " << std::strerror(errno);
      return;
    }
    ::close(fd);
    path_ = path;
    int direct_fd = ::open(path_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    direct_ = direct_fd >= 0;
    if (!direct_) direct_fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);  // e.g. tmpfs
    fd_.reset(direct_fd);
    EXPECT_TRUE(fd_.valid()) << path_ << ": " << std::strerror(errno);
    if (size > 0) EXPECT_EQ(::ftruncate(fd_.get(), static_cast<off_t>(size)), 0);
  }
  ~ScratchFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  int fd() const { return fd_.get(); }
  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  UniqueFd fd_;
  bool direct_ = false;
};

// Page-aligned heap memory for direct I/O.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes)
      : bytes_(bytes), data_(static_cast<uint8_t*>(std::aligned_alloc(4096, round_up(bytes)))) {
    std::memset(data_.get(), 0, round_up(bytes));
  }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return bytes_; }

  void fill_random(uint64_t seed) {
    std::mt19937_64 random(seed);
    size_t i = 0;
    for (; i + 8 <= bytes_; i += 8) {
      const uint64_t word = random();
      std::memcpy(data_.get() + i, &word, 8);
    }
    for (; i < bytes_; ++i) data_.get()[i] = static_cast<uint8_t>(random());
  }

 private:
  static size_t round_up(size_t n) { return (n + 4095) / 4096 * 4096 + (n == 0 ? 4096 : 0); }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t bytes_;
  std::unique_ptr<uint8_t, Free> data_;
};

// Counts completions of asynchronously submitted requests; also checks each completes once.
class CompletionCounter {
 public:
  static void on_complete(IoRequest* request, void* context) {
    auto* self = static_cast<CompletionCounter*>(context);
    self->record(request);
  }
  void record(IoRequest* request) {
    std::lock_guard lock(mutex_);
    ++completed_;
    if (request->error != 0) ++failed_;
    cv_.notify_all();
  }
  void prepare(IoRequest& request) {
    request.on_complete = &CompletionCounter::on_complete;
    request.context = this;
  }
  void wait_for(uint64_t n) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return completed_ >= n; });
  }
  uint64_t completed() {
    std::lock_guard lock(mutex_);
    return completed_;
  }
  uint64_t failed() {
    std::lock_guard lock(mutex_);
    return failed_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t completed_ = 0;
  uint64_t failed_ = 0;
};

inline IoEngineOptions small_options(uint32_t block_size = 64 * 1024, uint32_t queue_depth = 8,
                                     uint32_t threads = 2) {
  IoEngineOptions options;
  options.block_size = block_size;
  options.queue_depth = queue_depth;
  options.threads = threads;
  return options;
}

inline const UringSupport& uring_support() {
  static const UringSupport support = probe_uring();
  return support;
}

// Tests parameterised over the engines. io_uring tests skip only where the probe says the
// kernel or sandbox lacks it.
class EngineTest : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  void SetUp() override {
    if (GetParam() == IoEngineKind::kUring && !uring_support().available) {
      GTEST_SKIP() << "io_uring unavailable: " << uring_support().reason;
    }
  }
  std::unique_ptr<IoEngine> make(const IoEngineOptions& options = small_options()) {
    auto engine = make_io_engine(GetParam(), options);
    EXPECT_TRUE(engine.is_ok()) << engine.status().message();
    return engine ? std::move(engine).value() : nullptr;
  }
};

}  // namespace strata::io::testing

namespace strata::io {
// Readable names in test output instead of raw bytes.
inline void PrintTo(IoEngineKind kind, std::ostream* os) {
  *os << io_engine_kind_name(kind);
}
}  // namespace strata::io

namespace strata::io::testing {

inline std::string engine_param_name(const ::testing::TestParamInfo<IoEngineKind>& info) {
  return io_engine_kind_name(info.param);
}

#define STRATA_INSTANTIATE_FOR_ENGINES(fixture)                                                  \
  INSTANTIATE_TEST_SUITE_P(                                                                      \
      Engines, fixture,                                                                          \
      ::testing::Values(::strata::io::IoEngineKind::kPsync, ::strata::io::IoEngineKind::kUring), \
      ::strata::io::testing::engine_param_name)

}  // namespace strata::io::testing
