// Limits through the C API (issue 8): running out of the pinned budget, of NVMe space, of file
// descriptors or of locked memory is an error code whose message has the numbers and what to
// change - never a crash. The OS limits are lowered in a child process (a death test), so the
// test binary itself keeps its limits.
#include <gtest/gtest.h>
#include <strata/strata.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "capabilities.h"
#include "sanitizers.h"

namespace {

namespace fs = std::filesystem;

using strata::testing::kSanitized;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class Limits : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("STRATA_TEST_DIR");
    dir_ =
        (fs::path(base != nullptr ? base : "/tmp") /
         ("limits-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
          "-" + std::to_string(getpid())))
            .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    strata_config_init(&config_);
    config_.nvme_path = dir_.c_str();
    config_.nvme_capacity_bytes = 8ull << 20;
    config_.pinned_budget_bytes = 1ull << 20;
    config_.device_budget_bytes = 1ull << 20;
    config_.device_backend = STRATA_DEVICE_EMULATED;
  }
  void TearDown() override {
    if (rt_ != nullptr) {
      EXPECT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
    }
    fs::remove_all(dir_);
  }

  strata_tensor add(uint64_t bytes, strata_tier home, int* rc) {
    strata_tensor_desc d{};
    d.struct_size = sizeof d;
    d.name = "big";
    d.bytes = bytes;
    d.dtype = STRATA_DTYPE_F32;
    d.kind = STRATA_KIND_PARAMETER;
    d.home_tier = home;
    strata_tensor t = STRATA_TENSOR_NONE;
    *rc = strata_tensor_register(rt_, &d, &t);
    return t;
  }

  std::string dir_;
  strata_config config_{};
  strata_runtime* rt_ = nullptr;
};

TEST_F(Limits, ATensorLargerThanThePinnedBudgetIsABudgetErrorWithTheNumbers) {
  ASSERT_EQ(strata_runtime_create(&config_, &rt_), STRATA_OK) << strata_last_error(nullptr);
  int rc = STRATA_OK;
  const strata_tensor t = add(3ull << 20, STRATA_TIER_NVME, &rc);
  ASSERT_EQ(rc, STRATA_OK) << strata_last_error(rt_);
  std::vector<uint8_t> bytes(3ull << 20, 1);
  EXPECT_EQ(strata_tensor_write(rt_, t, bytes.data(), 0, bytes.size()), STRATA_E_PINNED_BUDGET);
  const std::string m = strata_last_error(rt_);
  EXPECT_TRUE(contains(m, "3.00 MiB") && contains(m, "1.00 MiB")) << m;
  EXPECT_TRUE(contains(m, "pinned_budget_bytes")) << "no advice: " << m;
  // Pinned at home beyond the budget: refused at registration, with the same numbers.
  add(2ull << 20, STRATA_TIER_PINNED, &rc);
  EXPECT_EQ(rc, STRATA_E_PINNED_BUDGET);
  EXPECT_TRUE(contains(strata_last_error(rt_), "pinned_budget_bytes")) << strata_last_error(rt_);
}

TEST_F(Limits, PinnedTensorsThatNeverLeaveStarveLaterAcquiresWithAnError) {
  ASSERT_EQ(strata_runtime_create(&config_, &rt_), STRATA_OK) << strata_last_error(nullptr);
  strata_tensor resident = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_malloc(rt_, 900 << 10, STRATA_TIER_PINNED, 0, &resident), STRATA_OK)
      << strata_last_error(rt_);
  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, resident, STRATA_TIER_PINNED, 0, &a), STRATA_OK);
  ASSERT_EQ(strata_release(rt_, resident, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  int rc = STRATA_OK;
  const strata_tensor t = add(512 << 10, STRATA_TIER_NVME, &rc);
  ASSERT_EQ(rc, STRATA_OK);
  std::vector<uint8_t> bytes(512 << 10, 2);
  EXPECT_EQ(strata_tensor_write(rt_, t, bytes.data(), 0, bytes.size()), STRATA_E_PINNED_BUDGET);
  const std::string m = strata_last_error(rt_);
  EXPECT_TRUE(contains(m, "512.00 KiB") && contains(m, "1.00 MiB")) << m;
  EXPECT_TRUE(contains(m, "pinned_budget_bytes")) << "no advice: " << m;
  EXPECT_EQ(strata_free(rt_, resident), STRATA_OK);
  EXPECT_EQ(strata_tensor_write(rt_, t, bytes.data(), 0, bytes.size()), STRATA_OK)
      << strata_last_error(rt_);
}

TEST_F(Limits, AFullNvmeTierIsNoSpaceWithTheNumbersAndWhatToChange) {
  ASSERT_EQ(strata_runtime_create(&config_, &rt_), STRATA_OK) << strata_last_error(nullptr);
  // Extents are taken when data first goes to NVMe: write tensors until the 8 MiB swap file is
  // full; the error comes from a write that evicts, or from strata_sync.
  std::vector<uint8_t> bytes(512 << 10, 4);
  int rc = STRATA_OK;
  int written = 0;
  for (; written < 40 && rc == STRATA_OK; ++written) {
    const strata_tensor t = add(bytes.size(), STRATA_TIER_NVME, &rc);
    if (rc == STRATA_OK) rc = strata_tensor_write(rt_, t, bytes.data(), 0, bytes.size());
    if (rc == STRATA_OK) rc = strata_sync(rt_);
  }
  EXPECT_EQ(rc, STRATA_E_NOSPACE) << strata_last_error(rt_);
  EXPECT_GE(written, 14) << "8 MiB hold about 16 tensors of 512 KiB";
  const std::string m = strata_last_error(rt_);
  EXPECT_TRUE(contains(m, "512.00 KiB") && contains(m, "8.00 MiB")) << m;
  EXPECT_TRUE(contains(m, "nvme_capacity_bytes")) << "no advice: " << m;
}

TEST_F(Limits, ASwapFileLargerThanTheDiskIsRefusedAtCreation) {
  config_.nvme_capacity_bytes = uint64_t{1} << 60;
  EXPECT_EQ(strata_runtime_create(&config_, &rt_), STRATA_E_NOSPACE);
  const std::string m = strata_last_error(nullptr);
  EXPECT_TRUE(contains(m, "free")) << m;
  EXPECT_TRUE(contains(m, "nvme_capacity_bytes")) << "no advice: " << m;
  EXPECT_TRUE(fs::is_empty(dir_)) << "a refused swap file was left behind";
}

// Exit codes of run_with_open_file_limit.
constexpr int kLimitErrorWithAdvice = 0;
constexpr int kCreatedUnderTheLimit = 21;

// In a forked child: a runtime created and destroyed with every descriptor available, then the
// limit, then a runtime again; the exit code says what happened and stderr has the message.
// The first runtime is there for UndefinedBehaviorSanitizer: the first time its vptr check meets
// a dynamic type it probes the object's memory through a pipe, which a process out of
// descriptors cannot make, and it then reports a valid object as having an invalid vptr. After
// one full creation every type on that path is in its cache.
int run_with_open_file_limit(const strata_config& config, int free_fds) {
  strata_runtime* rt = nullptr;
  if (strata_runtime_create(&config, &rt) != STRATA_OK) return 23;
  if (strata_runtime_destroy(rt) != STRATA_OK) return 24;
  // The limit bounds descriptor numbers, not how many are open: new descriptors take the lowest
  // free numbers, so a limit this far above the lowest free one leaves exactly free_fds of them.
  const int lowest_free = dup(STDIN_FILENO);
  if (lowest_free < 0) return 25;
  close(lowest_free);
  const auto limit = static_cast<rlim_t>(lowest_free + free_fds);
  const rlimit low{limit, limit};
  if (setrlimit(RLIMIT_NOFILE, &low) != 0) return 20;
  rt = nullptr;
  const int rc = strata_runtime_create(&config, &rt);
  if (rc == STRATA_OK) {
    strata_runtime_destroy(rt);
    return kCreatedUnderTheLimit;
  }
  const std::string m = strata_last_error(nullptr);
  std::fprintf(stderr, "limit %llu: %s\n", static_cast<unsigned long long>(limit), m.c_str());
  const bool advice =
      contains(m, "RLIMIT_NOFILE is " + std::to_string(limit)) && contains(m, "ulimit -n");
  return rc == STRATA_E_LIMIT && advice ? kLimitErrorWithAdvice : 22;
}

// Wherever creation runs out of descriptors - the swap file, the io_uring ring, its eventfd, the
// memory sampler - the answer is STRATA_E_LIMIT with the numbers. The limit starts at one free
// descriptor and rises until a runtime fits, so every opening on the way is the one that fails
// once.
TEST_F(Limits, TooFewFileDescriptorsIsALimitErrorNamingRlimitNofile) {
  int refused = 0;
  bool created = false;
  for (int free_fds = 1; free_fds <= 64 && !created; ++free_fds) {
    std::fflush(nullptr);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) _exit(run_with_open_file_limit(config_, free_fds));
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status))
        << "the child died with " << free_fds << " descriptors free: status " << status;
    const int code = WEXITSTATUS(status);
    if (code == kCreatedUnderTheLimit) {
      created = true;
    } else {
      EXPECT_EQ(code, kLimitErrorWithAdvice) << "with " << free_fds << " descriptors free";
      ++refused;
    }
  }
  EXPECT_TRUE(created) << "no runtime was created even with 64 descriptors free";
  EXPECT_GE(refused, 3) << "the swap file, the ring and its eventfd each need a descriptor";
}

int run_with_memlock_limit(const strata_config& config) {
  strata::testing::drop_ipc_lock();
  const rlimit low{64 << 10, 64 << 10};
  if (setrlimit(RLIMIT_MEMLOCK, &low) != 0) return 30;
  strata_runtime* rt = nullptr;
  int rc = strata_runtime_create(&config, &rt);
  std::string m = strata_last_error(nullptr);
  if (rc == STRATA_OK) {
    strata_tensor_desc d{};
    d.struct_size = sizeof d;
    d.name = "locked";
    d.bytes = 512 << 10;
    d.kind = STRATA_KIND_PARAMETER;
    d.home_tier = STRATA_TIER_NVME;
    strata_tensor t = STRATA_TENSOR_NONE;
    std::vector<uint8_t> bytes(d.bytes, 3);
    rc = strata_tensor_register(rt, &d, &t);
    if (rc == STRATA_OK) rc = strata_tensor_write(rt, t, bytes.data(), 0, d.bytes);
    m = strata_last_error(rt);
    strata_runtime_destroy(rt);
  }
  std::fprintf(stderr, "%d %s\n", rc, m.c_str());
  if (rc == STRATA_OK) return 31;  // nothing was locked: the limit did not apply
  const bool advice = contains(m, "RLIMIT_MEMLOCK") && contains(m, "64.00 KiB") &&
                      (contains(m, "ulimit -l") || contains(m, "raise RLIMIT_MEMLOCK"));
  return rc == STRATA_E_LIMIT && advice ? 0 : 32;
}

TEST_F(Limits, TooLittleLockableMemoryIsALimitErrorNamingRlimitMemlock) {
  if (kSanitized) GTEST_SKIP() << "the sanitizers make mlock a no-op";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The threadsafe style re-runs this test in a child, whose SetUp made a directory of its own
  // pid and which never reaches TearDown: it removes that directory itself before it exits.
  EXPECT_EXIT(
      {
        const int rc = run_with_memlock_limit(config_);
        std::error_code ignored;
        fs::remove_all(dir_, ignored);
        _exit(rc);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
