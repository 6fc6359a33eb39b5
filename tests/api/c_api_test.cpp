// The C API as a framework sees it: creation and its errors, a table of invalid calls, the
// framework stand-in over tensors far larger than the budgets, several threads at once.
#include <gtest/gtest.h>
#include <strata/strata.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "api/framework_standin.h"

namespace {

namespace fs = std::filesystem;

std::string scratch_dir(const std::string& name) {
  const char* base = std::getenv("STRATA_TEST_DIR");
  fs::path dir =
      fs::path(base != nullptr ? base : "/tmp") / ("api-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

strata_config small_config(const std::string& dir) {
  strata_config c;
  strata_config_init(&c);
  c.nvme_path = dir.c_str();
  c.nvme_capacity_bytes = 256ull << 20;
  c.pinned_budget_bytes = 2ull << 20;
  c.device_budget_bytes = 1ull << 20;
  c.device_backend = STRATA_DEVICE_EMULATED;
  c.queue_depth = 8;
  return c;
}

class Runtime : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    config_ = small_config(dir_);
  }
  void TearDown() override {
    if (rt_ != nullptr) EXPECT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
    fs::remove_all(dir_);
  }
  void create() {
    ASSERT_EQ(strata_runtime_create(&config_, &rt_), STRATA_OK) << strata_last_error(nullptr);
  }
  // 512 KiB of pinned memory (too little to stream), 256 KiB of device, 1 MiB of NVMe: what leaves
  // the device passes through pinned memory, where little room is left.
  void create_with_tight_pools() {
    config_.pinned_budget_bytes = 512 << 10;
    config_.device_budget_bytes = 256 << 10;
    config_.nvme_capacity_bytes = 1 << 20;
    config_.block_size = 4096;
    create();
  }
  // Acquires t on the device within 30 s (never the 300 s timeout), checks its first `bytes`
  // against `expected`, and releases it.
  void expect_device_acquire_completes(strata_tensor t, const std::vector<uint8_t>& expected,
                                       uint64_t bytes) {
    strata_acquired a{};
    a.struct_size = sizeof a;
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(strata_acquire(rt_, t, STRATA_TIER_DEVICE, 0, &a), STRATA_OK)
        << strata_last_error(rt_);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
    EXPECT_EQ(std::memcmp(a.data, expected.data(), bytes), 0);
    ASSERT_EQ(strata_release(rt_, t, 0, nullptr), STRATA_OK);
  }
  // The bytes written on the device survived the evictions: every one is `value`.
  void expect_filled(strata_tensor t, uint64_t bytes, uint8_t value) {
    std::vector<uint8_t> back(bytes);
    ASSERT_EQ(strata_tensor_read(rt_, t, back.data(), 0, back.size()), STRATA_OK)
        << strata_last_error(rt_);
    EXPECT_EQ(back, std::vector<uint8_t>(bytes, value)) << "the device tensor's bytes survived";
  }
  // Two written tensors, "held" and "wanted", each more than half the 2 MiB pinned pool, the
  // first acquired there: the second cannot be acquired, or copied through the pool, until that
  // acquire is released. expected: what both hold.
  static constexpr uint64_t kHalfPoolBytes = 1536 << 10;
  void hold_the_pinned_pool(strata_tensor* held, strata_tensor* wanted,
                            std::vector<uint8_t>* expected) {
    *held = register_tensor(kHalfPoolBytes, "held");
    *wanted = register_tensor(kHalfPoolBytes, "wanted");
    expected->resize(kHalfPoolBytes);
    strata::testing::fill_expected(expected->data(), expected->size(), 7, 0);
    ASSERT_EQ(strata_tensor_write(rt_, *wanted, expected->data(), 0, kHalfPoolBytes), STRATA_OK);
    ASSERT_EQ(strata_tensor_write(rt_, *held, expected->data(), 0, kHalfPoolBytes), STRATA_OK);
    ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
    strata_acquired a{};
    a.struct_size = sizeof a;
    ASSERT_EQ(strata_acquire(rt_, *held, STRATA_TIER_PINNED, 0, &a), STRATA_OK)
        << strata_last_error(rt_);
  }
  strata_tensor register_tensor(uint64_t bytes, const char* name = "t") {
    strata_tensor_desc d{};
    d.struct_size = sizeof d;
    d.name = name;
    d.bytes = bytes;
    d.dtype = STRATA_DTYPE_BF16;
    d.kind = STRATA_KIND_PARAMETER;
    d.layer = 0;
    d.home_tier = STRATA_TIER_NVME;
    strata_tensor t = STRATA_TENSOR_NONE;
    EXPECT_EQ(strata_tensor_register(rt_, &d, &t), STRATA_OK) << strata_last_error(rt_);
    return t;
  }

  std::string dir_;
  strata_config config_{};
  strata_runtime* rt_ = nullptr;
};

TEST(Version, MatchesTheHeader) {
  EXPECT_EQ(strata_version_number(), STRATA_VERSION_NUMBER);
  EXPECT_STREQ(strata_version(), "0.1.0");
}

TEST(Strerror, NamesEveryCode) {
  for (int code = STRATA_E_INTERNAL; code <= STRATA_OK; ++code) {
    EXPECT_STRNE(strata_strerror(code), "unknown status code") << code;
  }
  EXPECT_STREQ(strata_strerror(-9999), "unknown status code");
}

TEST_F(Runtime, CreatesTheSwapFileWithMode0600AndRemovesItOnDestroy) {
  create();
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  struct stat st {};
  ASSERT_EQ(stat(files[0].c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
  rt_ = nullptr;
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(Runtime, RefusesInvalidConfigsWithAMessage) {
  struct Case {
    const char* what;
    void (*mutate)(strata_config&);
  };
  const Case cases[] = {
      {"struct_size 0", [](strata_config& c) { c.struct_size = 0; }},
      {"no nvme path", [](strata_config& c) { c.nvme_path = nullptr; }},
      {"both path and device", [](strata_config& c) { c.raw_device = "/dev/null"; }},
      {"queue depth 0", [](strata_config& c) { c.queue_depth = 0; }},
      {"odd block size", [](strata_config& c) { c.block_size = 1000; }},
      {"pinned budget below a page", [](strata_config& c) { c.pinned_budget_bytes = 100; }},
      {"automatic pinned budget without streaming",
       [](strata_config& c) {
         c.pinned_budget_bytes = 0;
         c.stream_chunk_bytes = STRATA_STREAMING_OFF;
       }},
      {"half a declared drive", [](strata_config& c) { c.drive_read_bytes_per_s = 1000000000; }},
      {"zero device budget", [](strata_config& c) { c.device_budget_bytes = 0; }},
      {"unknown policy", [](strata_config& c) { c.policy = static_cast<strata_policy>(7); }},
      {"unknown engine", [](strata_config& c) { c.io_engine = static_cast<strata_io_engine>(9); }},
      {"unknown device",
       [](strata_config& c) { c.device_backend = static_cast<strata_device_backend>(5); }},
  };
  for (const Case& c : cases) {
    strata_config config = config_;
    c.mutate(config);
    strata_runtime* rt = reinterpret_cast<strata_runtime*>(0x1);
    EXPECT_EQ(strata_runtime_create(&config, &rt), STRATA_E_INVALID) << c.what;
    EXPECT_EQ(rt, nullptr) << c.what;
    EXPECT_NE(std::string(strata_last_error(nullptr)), "") << c.what;
  }
  EXPECT_EQ(strata_runtime_create(nullptr, &rt_), STRATA_E_INVALID);
  EXPECT_EQ(strata_runtime_create(&config_, nullptr), STRATA_E_INVALID);
}

TEST_F(Runtime, MissingDirectoryIsAClearError) {
  const std::string missing = dir_ + "/does-not-exist";
  config_.nvme_path = missing.c_str();
  EXPECT_NE(strata_runtime_create(&config_, &rt_), STRATA_OK);
  EXPECT_NE(std::string(strata_last_error(nullptr)).find("does-not-exist"), std::string::npos)
      << strata_last_error(nullptr);
}

TEST_F(Runtime, AcceptsAnOlderSmallerConfigStruct) {
  // sizeof a header's strata_config that ended at numa_node (padded to the struct's alignment).
  config_.struct_size = (offsetof(strata_config, numa_node) + sizeof(int) + 7) / 8 * 8;
  create();
}

TEST_F(Runtime, InvalidCallsReturnTheirCodes) {
  create();
  const strata_tensor t = register_tensor(10000);
  strata_acquired a{};
  a.struct_size = sizeof a;
  strata_tensor_desc d{};
  d.struct_size = sizeof d;
  d.bytes = 100;
  std::vector<uint8_t> buffer(20000);
  auto* bogus = reinterpret_cast<strata_runtime*>(&buffer[0]);
  strata_tensor out = 0;

  struct Case {
    const char* what;
    int got;
    int want;
  };
  const Case cases[] = {
      {"null runtime", strata_step_begin(nullptr), STRATA_E_INVALID},
      {"bogus runtime", strata_step_begin(bogus), STRATA_E_BAD_HANDLE},
      {"null desc", strata_tensor_register(rt_, nullptr, &out), STRATA_E_INVALID},
      {"null out", strata_tensor_register(rt_, &d, nullptr), STRATA_E_INVALID},
      {"zero handle", strata_acquire(rt_, STRATA_TENSOR_NONE, STRATA_TIER_PINNED, 0, &a),
       STRATA_E_BAD_HANDLE},
      {"made-up handle", strata_acquire(rt_, 0xdead00000001ull, STRATA_TIER_PINNED, 0, &a),
       STRATA_E_BAD_HANDLE},
      {"acquire on nvme", strata_acquire(rt_, t, STRATA_TIER_NVME, 0, &a), STRATA_E_INVALID},
      {"acquire unknown flags", strata_acquire(rt_, t, STRATA_TIER_PINNED, 0x80, &a),
       STRATA_E_INVALID},
      {"acquire null out", strata_acquire(rt_, t, STRATA_TIER_PINNED, 0, nullptr),
       STRATA_E_INVALID},
      {"release without acquire", strata_release(rt_, t, 0, nullptr), STRATA_E_STATE},
      {"release unknown flags", strata_release(rt_, t, 0x40, nullptr), STRATA_E_INVALID},
      {"read unwritten", strata_tensor_read(rt_, t, buffer.data(), 0, 10), STRATA_E_STATE},
      {"write out of range", strata_tensor_write(rt_, t, buffer.data(), 9999, 2), STRATA_E_INVALID},
      {"write zero bytes", strata_tensor_write(rt_, t, buffer.data(), 0, 0), STRATA_E_INVALID},
      {"write null src", strata_tensor_write(rt_, t, nullptr, 0, 10), STRATA_E_INVALID},
      {"malloc zero", strata_malloc(rt_, 0, STRATA_TIER_PINNED, 0, &out), STRATA_E_INVALID},
      {"malloc absurd", strata_malloc(rt_, ~0ull, STRATA_TIER_PINNED, 0, &out), STRATA_E_INVALID},
      {"malloc on nvme", strata_malloc(rt_, 100, STRATA_TIER_NVME, 0, &out), STRATA_E_INVALID},
      {"unknown phase", strata_layer_begin(rt_, static_cast<strata_phase>(9), 0), STRATA_E_INVALID},
      {"negative layer", strata_layer_begin(rt_, STRATA_PHASE_FORWARD, -5), STRATA_E_INVALID},
      {"trace while off", strata_export_trace(rt_, "/tmp/x.json"), STRATA_E_STATE},
      {"prefetch to nvme", strata_prefetch(rt_, t, STRATA_TIER_NVME), STRATA_E_INVALID},
      {"empty schedule", strata_declare_schedule(rt_, nullptr, 0), STRATA_E_INVALID},
  };
  for (const Case& c : cases) EXPECT_EQ(c.got, c.want) << c.what << ": " << strata_last_error(rt_);

  d.bytes = 0;
  EXPECT_EQ(strata_tensor_register(rt_, &d, &out), STRATA_E_INVALID);
  d.bytes = ~0ull;
  EXPECT_EQ(strata_tensor_register(rt_, &d, &out), STRATA_E_INVALID);
  d.bytes = 100;
  d.dtype = static_cast<strata_dtype>(42);
  EXPECT_EQ(strata_tensor_register(rt_, &d, &out), STRATA_E_INVALID);
  d.dtype = STRATA_DTYPE_F32;
  d.struct_size = 3;
  EXPECT_EQ(strata_tensor_register(rt_, &d, &out), STRATA_E_INVALID);
  EXPECT_NE(std::string(strata_last_error(rt_)).find("struct_size"), std::string::npos);

  // Acquired: write, unregister and a second, discarding acquire are refused.
  std::vector<uint8_t> data(10000, 7);
  ASSERT_EQ(strata_tensor_write(rt_, t, data.data(), 0, data.size()), STRATA_OK);
  ASSERT_EQ(strata_acquire(rt_, t, STRATA_TIER_PINNED, 0, &a), STRATA_OK) << strata_last_error(rt_);
  EXPECT_EQ(strata_tensor_write(rt_, t, data.data(), 0, 10), STRATA_E_STATE);
  EXPECT_EQ(strata_tensor_unregister(rt_, t), STRATA_E_STATE);
  EXPECT_EQ(strata_release(rt_, t, 0, nullptr), STRATA_OK);

  // Double unregister and use after unregister.
  EXPECT_EQ(strata_tensor_unregister(rt_, t), STRATA_OK);
  EXPECT_EQ(strata_tensor_unregister(rt_, t), STRATA_E_BAD_HANDLE);
  EXPECT_EQ(strata_acquire(rt_, t, STRATA_TIER_PINNED, 0, &a), STRATA_E_BAD_HANDLE);
  EXPECT_EQ(strata_tensor_read(rt_, t, data.data(), 0, 10), STRATA_E_BAD_HANDLE);
}

TEST_F(Runtime, DestroyTwiceIsABadHandleNotACrash) {
  create();
  EXPECT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
  EXPECT_EQ(strata_runtime_destroy(rt_), STRATA_E_BAD_HANDLE);
  EXPECT_EQ(strata_step_begin(rt_), STRATA_E_BAD_HANDLE);
  rt_ = nullptr;
  EXPECT_EQ(strata_runtime_destroy(nullptr), STRATA_OK);
}

TEST_F(Runtime, LastErrorIsPerThread) {
  create();
  EXPECT_EQ(strata_malloc(rt_, 0, STRATA_TIER_PINNED, 0, nullptr), STRATA_E_INVALID);
  const std::string mine = strata_last_error(rt_);
  EXPECT_NE(mine.find("strata_malloc"), std::string::npos) << mine;
  std::string theirs = "unset";
  std::thread([&] { theirs = strata_last_error(rt_); }).join();
  EXPECT_EQ(theirs, "");
}

TEST_F(Runtime, WrittenBytesReadBackExactly) {
  create();
  for (uint64_t bytes : {1ull, 4095ull, 4097ull, 1ull << 20, (1ull << 20) + 3}) {
    const strata_tensor t = register_tensor(bytes);
    std::vector<uint8_t> in(bytes), out(bytes);
    strata::testing::fill_expected(in.data(), bytes, bytes, 0);
    ASSERT_EQ(strata_tensor_write(rt_, t, in.data(), 0, bytes), STRATA_OK)
        << strata_last_error(rt_);
    ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
    ASSERT_EQ(strata_tensor_read(rt_, t, out.data(), 0, bytes), STRATA_OK)
        << strata_last_error(rt_);
    EXPECT_EQ(in, out) << bytes;
    // A partial overwrite keeps the rest.
    if (bytes > 10) {
      const uint8_t patch[3] = {1, 2, 3};
      ASSERT_EQ(strata_tensor_write(rt_, t, patch, 5, 3), STRATA_OK);
      std::memcpy(in.data() + 5, patch, 3);
      ASSERT_EQ(strata_tensor_read(rt_, t, out.data(), 0, bytes), STRATA_OK);
      EXPECT_EQ(in, out) << bytes;
    }
    EXPECT_EQ(strata_tensor_unregister(rt_, t), STRATA_OK);
  }
}

TEST_F(Runtime, FrameworkStandinTrainsOverTensorsFarLargerThanTheBudgets) {
  create();
  strata::testing::FrameworkStandin standin(rt_, {});
  ASSERT_EQ(standin.setup(), STRATA_OK) << strata_last_error(rt_);
  ASSERT_GT(standin.total_bytes(), 4 * (config_.pinned_budget_bytes + config_.device_budget_bytes));
  for (int step = 0; step < 3; ++step) {
    ASSERT_EQ(standin.step(), STRATA_OK)
        << "step " << step << ": " << strata_last_error(rt_) << standin.mismatch();
  }
  ASSERT_EQ(standin.verify_all(), STRATA_OK) << strata_last_error(rt_) << standin.mismatch();

  strata_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(strata_get_stats(rt_, &stats), STRATA_OK) << strata_last_error(rt_);
  EXPECT_GT(stats.pinned.peak_reserved_bytes, 0u);
  EXPECT_LE(stats.pinned.peak_reserved_bytes, config_.pinned_budget_bytes);
  EXPECT_GT(stats.device.peak_in_use_bytes, 0u);
  EXPECT_GE(stats.nvme_bytes_written, standin.total_bytes() / 4);
  EXPECT_GT(stats.nvme_bytes_read, 0u);
  // The NVMe tier: the swap file held, and the live extents of every tensor written in it.
  EXPECT_EQ(stats.nvme.reserved_bytes, config_.nvme_capacity_bytes);
  EXPECT_GE(stats.nvme.in_use_bytes, standin.total_bytes() / 2);
  EXPECT_LE(stats.nvme.in_use_bytes, stats.nvme.reserved_bytes);
  EXPECT_GE(stats.nvme.peak_in_use_bytes, stats.nvme.in_use_bytes);
  EXPECT_GT(stats.os_peak_rss_bytes, 0u);
  stats.struct_size = 2;
  EXPECT_EQ(strata_get_stats(rt_, &stats), STRATA_E_INVALID);
}

// ZeRO-Infinity's layout (the finetune benchmark's baseline): the same training, a file per
// tensor in a private directory, and nothing left behind.
TEST_F(Runtime, TheFilePerTensorLayoutTrainsTheStandinWithAFilePerSpilledTensor) {
  config_.nvme_layout = STRATA_NVME_FILE_PER_TENSOR;
  create();
  strata::testing::FrameworkStandin standin(rt_, {});
  ASSERT_EQ(standin.setup(), STRATA_OK) << strata_last_error(rt_);
  for (int step = 0; step < 3; ++step) {
    ASSERT_EQ(standin.step(), STRATA_OK)
        << "step " << step << ": " << strata_last_error(rt_) << standin.mismatch();
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  ASSERT_EQ(standin.verify_all(), STRATA_OK) << strata_last_error(rt_) << standin.mismatch();

  std::vector<fs::path> directories;
  for (const auto& entry : fs::directory_iterator(dir_)) directories.push_back(entry.path());
  ASSERT_EQ(directories.size(), 1u) << "one private directory, no swap file";
  EXPECT_NE(directories[0].filename().string().find(".tensors"), std::string::npos);
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(directories[0])) {
    EXPECT_EQ(entry.path().extension(), ".swp");
    EXPECT_EQ(fs::status(entry).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
    ++files;
  }
  EXPECT_GE(files, standin.tensor_count() / 2) << "a file per tensor that went to NVMe";

  strata_stats stats{};
  stats.struct_size = sizeof stats;
  ASSERT_EQ(strata_get_stats(rt_, &stats), STRATA_OK) << strata_last_error(rt_);
  EXPECT_GE(stats.nvme_bytes_written, standin.total_bytes() / 4);
  EXPECT_GT(stats.nvme_bytes_read, 0u);
  ASSERT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
  rt_ = nullptr;
  EXPECT_TRUE(fs::is_empty(dir_)) << "files left behind";
}

TEST_F(Runtime, AnUnknownNvmeLayoutOrFilesOnARawDeviceAreRefused) {
  config_.nvme_layout = static_cast<strata_nvme_layout>(7);
  EXPECT_EQ(strata_runtime_create(&config_, &rt_), STRATA_E_INVALID);
  EXPECT_NE(std::string(strata_last_error(nullptr)).find("nvme_layout"), std::string::npos);
  config_.nvme_layout = STRATA_NVME_FILE_PER_TENSOR;
  config_.nvme_path = nullptr;
  config_.raw_device = "/dev/null";
  EXPECT_EQ(strata_runtime_create(&config_, &rt_), STRATA_E_INVALID);
  EXPECT_NE(std::string(strata_last_error(nullptr)).find("raw_device"), std::string::npos);
}

// Found by c_api_fuzz: a device acquire whose eviction must write a dirty device tensor back
// through pinned memory, where the acquired tensor's own staged copy and pinned-resident
// tensors leave too little room.
TEST_F(Runtime, ADeviceAcquireWhoseEvictionNeedsItsOwnStagingRoomCompletes) {
  create_with_tight_pools();
  strata_tensor_desc d{};
  d.struct_size = sizeof d;
  d.name = "pinned";
  d.bytes = 10014;
  d.dtype = STRATA_DTYPE_U8;
  d.kind = STRATA_KIND_OTHER;
  d.home_tier = STRATA_TIER_PINNED;
  strata_tensor small = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_tensor_register(rt_, &d, &small), STRATA_OK) << strata_last_error(rt_);
  strata_tensor resident = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_malloc(rt_, 213386, STRATA_TIER_PINNED, 0, &resident), STRATA_OK)
      << strata_last_error(rt_);
  ASSERT_EQ(strata_step_begin(rt_), STRATA_OK) << strata_last_error(rt_);
  ASSERT_EQ(strata_layer_begin(rt_, STRATA_PHASE_BACKWARD, 5), STRATA_OK) << strata_last_error(rt_);
  const strata_tensor wanted = register_tensor(180317, "wanted");
  std::vector<uint8_t> bytes(213386);
  strata::testing::fill_expected(bytes.data(), bytes.size(), 1, 0);
  ASSERT_EQ(strata_tensor_write(rt_, wanted, bytes.data(), 0, 180317), STRATA_OK);
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  const strata_tensor dirty = register_tensor(183619, "dirty");
  ASSERT_EQ(strata_tensor_write(rt_, resident, bytes.data(), 0, 213386), STRATA_OK);
  ASSERT_EQ(strata_prefetch(rt_, resident, STRATA_TIER_DEVICE), STRATA_OK);
  ASSERT_EQ(strata_tensor_discard(rt_, dirty), STRATA_OK);
  strata_acquired a{};
  a.struct_size = sizeof a;
  // Discarded, it has no contents to read: it is written whole on the device (DISCARD).
  ASSERT_EQ(strata_acquire(rt_, dirty, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK)
      << strata_last_error(rt_);
  std::memset(a.data, 0x5a, a.bytes);
  ASSERT_EQ(strata_release(rt_, dirty, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  expect_device_acquire_completes(wanted, bytes, 180317);
  expect_filled(dirty, 183619, 0x5a);
}

// Reliability finding 33 (c_api_fuzz, 300 s): the same, with the acquired tensor's pinned copy
// dirty (written, never synced). Its copy could not give way, so the acquire waited its 300 s
// and timed out. Now that copy is written back first and then gives way.
TEST_F(Runtime, ADeviceAcquireWhoseEvictionNeedsItsOwnDirtyStagingRoomCompletes) {
  create_with_tight_pools();
  strata_tensor resident = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_malloc(rt_, 213386, STRATA_TIER_PINNED, 0, &resident), STRATA_OK)
      << strata_last_error(rt_);
  std::vector<uint8_t> bytes(213386);
  strata::testing::fill_expected(bytes.data(), bytes.size(), 1, 0);
  ASSERT_EQ(strata_tensor_write(rt_, resident, bytes.data(), 0, bytes.size()), STRATA_OK);
  const strata_tensor dirty = register_tensor(180224, "dirty");
  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, dirty, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK)
      << strata_last_error(rt_);
  std::memset(a.data, 0x5a, a.bytes);
  ASSERT_EQ(strata_release(rt_, dirty, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  // Written into pinned memory and not synced: its only copy is there, dirty.
  const strata_tensor wanted = register_tensor(183296, "wanted");
  ASSERT_EQ(strata_tensor_write(rt_, wanted, bytes.data(), 0, 183296), STRATA_OK);
  expect_device_acquire_completes(wanted, bytes, 183296);
  expect_filled(dirty, 180224, 0x5a);
}

// Reliability finding 42 (c_api_fuzz, 60 s, in CI): the device holds an offloadable allocation,
// dirty, whose only way out is through pinned memory, and pinned memory is full of allocations
// that live there. A device acquire that needs its room waited its whole 300 s and timed out;
// now it fails at once with the pinned pool's numbers, and both allocations keep their bytes.
TEST_F(Runtime, ADeviceAcquireWhoseVictimCanNeverLeaveThroughPinnedMemoryFailsAtOnce) {
  create_with_tight_pools();
  strata_tensor big = STRATA_TENSOR_NONE, wanted = STRATA_TENSOR_NONE,
                on_device = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_malloc(rt_, 258181, STRATA_TIER_PINNED, 0, &big), STRATA_OK)
      << strata_last_error(rt_);
  ASSERT_EQ(strata_malloc(rt_, 213386, STRATA_TIER_PINNED, 0, &wanted), STRATA_OK)
      << strata_last_error(rt_);
  std::vector<uint8_t> bytes(258181);
  strata::testing::fill_expected(bytes.data(), bytes.size(), 1, 0);
  // Pinned allocations take their memory when first written: 468 KiB of the 512 KiB.
  ASSERT_EQ(strata_tensor_write(rt_, big, bytes.data(), 0, 258181), STRATA_OK);
  ASSERT_EQ(strata_tensor_write(rt_, wanted, bytes.data(), 0, 213386), STRATA_OK);
  ASSERT_EQ(strata_malloc(rt_, 188806, STRATA_TIER_DEVICE, STRATA_MALLOC_OFFLOADABLE, &on_device),
            STRATA_OK)
      << strata_last_error(rt_);
  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, on_device, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD, &a),
            STRATA_OK)
      << strata_last_error(rt_);
  std::memset(a.data, 0x6b, a.bytes);
  ASSERT_EQ(strata_release(rt_, on_device, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(strata_acquire(rt_, wanted, STRATA_TIER_DEVICE, 0, &a), STRATA_E_PINNED_BUDGET);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  const std::string m = strata_last_error(rt_);
  EXPECT_NE(m.find("pool 'device'"), std::string::npos) << m;
  EXPECT_NE(m.find("only through pinned memory"), std::string::npos) << m;
  EXPECT_NE(m.find("pinned_budget_bytes"), std::string::npos) << m;
  // Nothing was lost: with one pinned allocation freed, the device one leaves and the acquire
  // succeeds with the bytes written.
  ASSERT_EQ(strata_free(rt_, big), STRATA_OK);
  expect_device_acquire_completes(wanted, bytes, 213386);
  expect_filled(on_device, 188806, 0x6b);
}

// Found by c_api_fuzz: a dirty tensor on the device goes back to NVMe through pinned memory;
// when pinned allocations leave too little room for it, a sync fails with the numbers instead of
// waiting forever, the data stays on the device, and once room is freed the sync succeeds.
TEST_F(Runtime, ASyncThatCannotWriteATensorBackFailsAndKeepsItsData) {
  config_.pinned_budget_bytes = 1 << 20;
  config_.device_budget_bytes = 1 << 20;
  create();
  strata_tensor first = STRATA_TENSOR_NONE, second = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_malloc(rt_, 313660, STRATA_TIER_PINNED, 0, &first), STRATA_OK);
  ASSERT_EQ(strata_malloc(rt_, 475530, STRATA_TIER_PINNED, 0, &second), STRATA_OK);
  // Pinned allocations take their memory when first written.
  std::vector<uint8_t> fill(475530, 1);
  ASSERT_EQ(strata_tensor_write(rt_, first, fill.data(), 0, 313660), STRATA_OK);
  ASSERT_EQ(strata_tensor_write(rt_, second, fill.data(), 0, 475530), STRATA_OK);
  const strata_tensor big = register_tensor(445763, "big");
  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, big, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK)
      << strata_last_error(rt_);
  std::memset(a.data, 0x3c, a.bytes);
  ASSERT_EQ(strata_release(rt_, big, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  EXPECT_EQ(strata_sync(rt_), STRATA_E_PINNED_BUDGET);
  const std::string m = strata_last_error(rt_);
  EXPECT_NE(m.find("big"), std::string::npos) << m;
  EXPECT_NE(m.find("pinned_budget_bytes"), std::string::npos) << m;
  ASSERT_EQ(strata_free(rt_, second), STRATA_OK);
  // With room freed, the data is where it was.
  ASSERT_EQ(strata_acquire(rt_, big, STRATA_TIER_DEVICE, 0, &a), STRATA_OK)
      << strata_last_error(rt_);
  EXPECT_EQ(
      std::vector<uint8_t>(static_cast<uint8_t*>(a.data), static_cast<uint8_t*>(a.data) + a.bytes),
      std::vector<uint8_t>(445763, 0x3c));
  ASSERT_EQ(strata_release(rt_, big, 0, nullptr), STRATA_OK);
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  std::vector<uint8_t> back(445763);
  ASSERT_EQ(strata_tensor_read(rt_, big, back.data(), 0, back.size()), STRATA_OK)
      << strata_last_error(rt_);
  EXPECT_EQ(back, std::vector<uint8_t>(445763, 0x3c));
}

TEST_F(Runtime, AllocatorFaceHandsOutResidentAndOffloadableMemory) {
  create();
  strata_tensor fixed = 0, spill = 0;
  ASSERT_EQ(strata_malloc(rt_, 100000, STRATA_TIER_DEVICE, 0, &fixed), STRATA_OK)
      << strata_last_error(rt_);
  ASSERT_EQ(strata_malloc(rt_, 300000, STRATA_TIER_PINNED, STRATA_MALLOC_OFFLOADABLE, &spill),
            STRATA_OK);
  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, fixed, STRATA_TIER_DEVICE, 0, &a), STRATA_OK)
      << strata_last_error(rt_);
  void* first = a.data;
  std::memset(a.data, 0x5a, 100000);
  ASSERT_EQ(strata_release(rt_, fixed, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  ASSERT_EQ(strata_acquire(rt_, spill, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK);
  std::memset(a.data, 0x3c, 300000);
  ASSERT_EQ(strata_release(rt_, spill, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  // Pressure: fill the pinned budget with other tensors so the offloadable one is spilled.
  std::vector<strata_tensor> others;
  for (int i = 0; i < 12; ++i) {
    others.push_back(register_tensor(300000));
    ASSERT_EQ(strata_acquire(rt_, others.back(), STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD, &a),
              STRATA_OK)
        << strata_last_error(rt_);
    ASSERT_EQ(strata_release(rt_, others.back(), STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  }
  ASSERT_EQ(strata_acquire(rt_, spill, STRATA_TIER_PINNED, 0, &a), STRATA_OK)
      << strata_last_error(rt_);
  const auto* bytes = static_cast<const uint8_t*>(a.data);
  for (int i = 0; i < 300000; i += 997) ASSERT_EQ(bytes[i], 0x3c) << i;
  ASSERT_EQ(strata_release(rt_, spill, 0, nullptr), STRATA_OK);
  ASSERT_EQ(strata_acquire(rt_, fixed, STRATA_TIER_DEVICE, 0, &a), STRATA_OK);
  EXPECT_EQ(a.data, first) << "a non-offloadable allocation stays where it is";
  EXPECT_EQ(static_cast<const uint8_t*>(a.data)[99999], 0x5a);
  ASSERT_EQ(strata_release(rt_, fixed, 0, nullptr), STRATA_OK);
  EXPECT_EQ(strata_free(rt_, fixed), STRATA_OK);
  EXPECT_EQ(strata_free(rt_, spill), STRATA_OK);
  EXPECT_EQ(strata_free(rt_, spill), STRATA_E_BAD_HANDLE);
}

// strata_acquire_timeout: a wait that only the caller's own release could end (here the pinned
// pool is held by the caller's other acquire) gives up at the caller's bound having acquired
// nothing, so a binding can wait in slices and hear Ctrl-C between them; the same tensor is
// acquired once the room is released.
TEST_F(Runtime, AnAcquireWithItsOwnTimeoutGivesUpHavingAcquiredNothing) {
  create();
  const uint64_t bytes = kHalfPoolBytes;
  std::vector<uint8_t> expected;
  strata_tensor held = STRATA_TENSOR_NONE, wanted = STRATA_TENSOR_NONE;
  ASSERT_NO_FATAL_FAILURE(hold_the_pinned_pool(&held, &wanted, &expected));

  strata_acquired w{};
  w.struct_size = sizeof w;
  for (const uint32_t timeout_ms : {0u, 200u}) {
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(strata_acquire_timeout(rt_, wanted, STRATA_TIER_PINNED, 0, timeout_ms, &w),
              STRATA_E_TIMEOUT)
        << strata_last_error(rt_);
    const auto waited = std::chrono::steady_clock::now() - start;
    EXPECT_GE(waited, std::chrono::milliseconds(timeout_ms));
    EXPECT_LT(waited, std::chrono::milliseconds(timeout_ms) + std::chrono::seconds(10));
    const std::string m = strata_last_error(rt_);
    EXPECT_NE(m.find("wanted"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(timeout_ms) + " ms"), std::string::npos) << m;
    // Nothing was acquired: releasing it is the error of a tensor not acquired.
    EXPECT_EQ(strata_release(rt_, wanted, 0, nullptr), STRATA_E_STATE);
  }
  EXPECT_EQ(strata_acquire_timeout(rt_, wanted, STRATA_TIER_NVME, 0, 10, &w), STRATA_E_INVALID);
  EXPECT_EQ(strata_acquire_timeout(rt_, wanted, STRATA_TIER_PINNED, 8, 10, &w), STRATA_E_INVALID);
  EXPECT_EQ(strata_acquire_timeout(rt_, wanted, STRATA_TIER_PINNED, 0, 10, nullptr),
            STRATA_E_INVALID);

  ASSERT_EQ(strata_release(rt_, held, 0, nullptr), STRATA_OK);
  ASSERT_EQ(strata_acquire_timeout(rt_, wanted, STRATA_TIER_PINNED, 0, 30000, &w), STRATA_OK)
      << strata_last_error(rt_);
  ASSERT_EQ(w.bytes, bytes);
  EXPECT_EQ(std::memcmp(w.data, expected.data(), bytes), 0);
  ASSERT_EQ(strata_release(rt_, wanted, 0, nullptr), STRATA_OK);
  // Resident now: no wait is needed, so a bound of 0 acquires it.
  ASSERT_EQ(strata_acquire_timeout(rt_, wanted, STRATA_TIER_PINNED, 0, 0, &w), STRATA_OK)
      << strata_last_error(rt_);
  ASSERT_EQ(strata_release(rt_, wanted, 0, nullptr), STRATA_OK);
}

// strata_tensor_write_timeout / read_timeout: with the pinned room held by the caller's own
// acquire, each gives up at its bound having copied nothing, the tensor's contents and the
// caller's buffer as they were; with the room released, each copies.
TEST_F(Runtime, ACopyWithItsOwnTimeoutGivesUpHavingCopiedNothing) {
  create();
  const uint64_t bytes = kHalfPoolBytes;
  std::vector<uint8_t> expected;
  strata_tensor held = STRATA_TENSOR_NONE, wanted = STRATA_TENSOR_NONE;
  ASSERT_NO_FATAL_FAILURE(hold_the_pinned_pool(&held, &wanted, &expected));

  std::vector<uint8_t> replacement(bytes, 0xA5);
  std::vector<uint8_t> back(bytes, 0x5A);
  for (const uint32_t timeout_ms : {0u, 200u}) {
    auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(strata_tensor_write_timeout(rt_, wanted, replacement.data(), 0, bytes, timeout_ms),
              STRATA_E_TIMEOUT)
        << strata_last_error(rt_);
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(timeout_ms));
    std::string m = strata_last_error(rt_);
    EXPECT_NE(m.find("wanted"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(timeout_ms) + " ms"), std::string::npos) << m;
    start = std::chrono::steady_clock::now();
    ASSERT_EQ(strata_tensor_read_timeout(rt_, wanted, back.data(), 4096, 8192, timeout_ms),
              STRATA_E_TIMEOUT)
        << strata_last_error(rt_);
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(timeout_ms));
    m = strata_last_error(rt_);
    EXPECT_NE(m.find("strata_tensor_read_timeout"), std::string::npos) << m;
    EXPECT_EQ(back, std::vector<uint8_t>(bytes, 0x5A)) << "the caller's buffer was written";
  }
  EXPECT_EQ(strata_tensor_write_timeout(rt_, wanted, nullptr, 0, bytes, 10), STRATA_E_INVALID);
  EXPECT_EQ(strata_tensor_read_timeout(rt_, wanted, back.data(), 0, bytes + 1, 10),
            STRATA_E_INVALID);

  ASSERT_EQ(strata_release(rt_, held, 0, nullptr), STRATA_OK);
  // The timed-out write changed nothing: the tensor still holds what was written before it.
  ASSERT_EQ(strata_tensor_read_timeout(rt_, wanted, back.data(), 0, bytes, 30000), STRATA_OK)
      << strata_last_error(rt_);
  EXPECT_EQ(back, expected);
  ASSERT_EQ(strata_tensor_write_timeout(rt_, wanted, replacement.data(), 0, bytes, 30000),
            STRATA_OK)
      << strata_last_error(rt_);
  ASSERT_EQ(strata_tensor_read(rt_, wanted, back.data(), 0, bytes), STRATA_OK);
  EXPECT_EQ(back, replacement);
}

TEST_F(Runtime, SeveralThreadsAcquireAndReleaseAtOnce) {
  create();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 6;
  constexpr uint64_t kBytes = 150000;
  std::vector<strata_tensor> tensors;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    tensors.push_back(register_tensor(kBytes));
    std::vector<uint8_t> in(kBytes);
    strata::testing::fill_expected(in.data(), kBytes, i, 0);
    ASSERT_EQ(strata_tensor_write(rt_, tensors.back(), in.data(), 0, kBytes), STRATA_OK);
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int round = 0; round < 5; ++round) {
        for (int k = 0; k < kPerThread; ++k) {
          const int i = th * kPerThread + k;
          strata_acquired a{};
          a.struct_size = sizeof a;
          const strata_tier tier = (round + k) % 2 ? STRATA_TIER_DEVICE : STRATA_TIER_PINNED;
          if (strata_acquire(rt_, tensors[i], tier, 0, &a) != STRATA_OK ||
              strata::testing::first_mismatch(a.data, kBytes, i, round) != kBytes) {
            ++failures;
            return;
          }
          strata::testing::fill_expected(a.data, kBytes, i, round + 1);
          if (strata_release(rt_, tensors[i], STRATA_RELEASE_DIRTY, nullptr) != STRATA_OK)
            ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0) << strata_last_error(rt_);
}

TEST_F(Runtime, ExportsAChromeTraceWithoutTensorData) {
  config_.trace_events = 4096;
  create();
  const strata_tensor t = register_tensor(300000, "secret-name-is-fine");
  std::vector<uint8_t> in(300000, 0xAB);
  ASSERT_EQ(strata_tensor_write(rt_, t, in.data(), 0, in.size()), STRATA_OK);
  ASSERT_EQ(strata_sync(rt_), STRATA_OK);
  const std::string path = dir_ + "/trace.json";
  ASSERT_EQ(strata_export_trace(rt_, path.c_str()), STRATA_OK) << strata_last_error(rt_);
  std::ifstream file(path);
  const nlohmann::json trace = nlohmann::json::parse(file);
  ASSERT_TRUE(trace.contains("traceEvents"));
  // The write-back is a span named by its tensor, with its size, kind and layer; no data.
  bool has_write = false;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X" || e.value("cat", "") != "nvme write") continue;
    EXPECT_EQ(e.value("name", ""), "secret-name-is-fine") << e.dump();
    EXPECT_TRUE(e.contains("args") && e["args"].contains("kind") && e["args"].contains("layer"))
        << e.dump();
    has_write = true;
  }
  EXPECT_TRUE(has_write);
}

}  // namespace

namespace {

// Faults injected under the runtime (STRATA_FAULTS) reach the caller, and no tensor loses its
// last good copy: every tensor still reads back the last contents written.
class FaultyRuntime : public Runtime {
 protected:
  void create_with_faults(const char* spec) {
    setenv("STRATA_FAULTS", spec, 1);
    create();
    unsetenv("STRATA_FAULTS");
  }
};

// strata_sync_timeout: with every write-back stalled 1.5 s, a 100 ms bound ends in
// STRATA_E_TIMEOUT, the write-backs still in flight; a later sync waits for them.
TEST_F(FaultyRuntime, ASyncWithItsOwnTimeoutGivesUpAndALaterSyncFinishes) {
  create_with_faults("write:stall:ms=1500");
  constexpr uint64_t kBytes = 300000;
  const strata_tensor t = register_tensor(kBytes, "stalled");
  std::vector<uint8_t> in(kBytes);
  strata::testing::fill_expected(in.data(), kBytes, 3, 0);
  ASSERT_EQ(strata_tensor_write(rt_, t, in.data(), 0, kBytes), STRATA_OK);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(strata_sync_timeout(rt_, 100), STRATA_E_TIMEOUT) << strata_last_error(rt_);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_LT(waited, std::chrono::milliseconds(1400)) << "it waited for the stalled write";
  const std::string m = strata_last_error(rt_);
  EXPECT_NE(m.find("100 ms"), std::string::npos) << m;
  ASSERT_EQ(strata_sync_timeout(rt_, 30000), STRATA_OK) << strata_last_error(rt_);
  EXPECT_EQ(strata_sync_timeout(nullptr, 10), STRATA_E_INVALID);
  std::vector<uint8_t> back(kBytes);
  ASSERT_EQ(strata_tensor_read(rt_, t, back.data(), 0, kBytes), STRATA_OK);
  EXPECT_EQ(back, in);
}

TEST_F(FaultyRuntime, FailedWriteBacksReachTheCallerAndKeepTheNewestCopy) {
  create_with_faults("write:eio:every=2");
  constexpr uint64_t kBytes = 300000;  // several of these overflow the pinned budget
  std::vector<strata_tensor> tensors;
  int failures = 0;
  for (int i = 0; i < 10; ++i) {
    tensors.push_back(register_tensor(kBytes));
    std::vector<uint8_t> in(kBytes);
    strata::testing::fill_expected(in.data(), kBytes, i, 0);
    ASSERT_EQ(strata_tensor_write(rt_, tensors.back(), in.data(), 0, kBytes), STRATA_OK);
    const int rc = strata_sync(rt_);
    if (rc != STRATA_OK) {
      EXPECT_EQ(rc, STRATA_E_IO) << strata_last_error(rt_);
      ++failures;
    }
  }
  EXPECT_GT(failures, 0) << "the plan fails every second write";
  // Retrying until the writes land: each attempt either succeeds or reports the error again.
  int rc = STRATA_E_IO;
  for (int attempt = 0; attempt < 20 && rc != STRATA_OK; ++attempt) rc = strata_sync(rt_);
  EXPECT_EQ(rc, STRATA_OK) << strata_last_error(rt_);
  for (int i = 0; i < 10; ++i) {
    std::vector<uint8_t> out(kBytes);
    ASSERT_EQ(strata_tensor_read(rt_, tensors[i], out.data(), 0, kBytes), STRATA_OK)
        << strata_last_error(rt_);
    EXPECT_EQ(strata::testing::first_mismatch(out.data(), kBytes, i, 0), kBytes) << i;
  }
}

TEST_F(FaultyRuntime, FailedReadsReachTheCallerAndARetrySucceeds) {
  create_with_faults("read:eio:every=2");
  constexpr uint64_t kBytes = 300000;
  std::vector<strata_tensor> tensors;
  for (int i = 0; i < 10; ++i) {
    tensors.push_back(register_tensor(kBytes));
    std::vector<uint8_t> in(kBytes);
    strata::testing::fill_expected(in.data(), kBytes, i, 0);
    ASSERT_EQ(strata_tensor_write(rt_, tensors.back(), in.data(), 0, kBytes), STRATA_OK);
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  int io_errors = 0;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 10; ++i) {
      strata_acquired a{};
      a.struct_size = sizeof a;
      int rc = strata_acquire(rt_, tensors[i], STRATA_TIER_PINNED, 0, &a);
      for (int attempt = 0; attempt < 5 && rc == STRATA_E_IO; ++attempt) {
        ++io_errors;
        rc = strata_acquire(rt_, tensors[i], STRATA_TIER_PINNED, 0, &a);
      }
      ASSERT_EQ(rc, STRATA_OK) << strata_last_error(rt_);
      EXPECT_EQ(strata::testing::first_mismatch(a.data, kBytes, i, 0), kBytes) << i;
      ASSERT_EQ(strata_release(rt_, tensors[i], 0, nullptr), STRATA_OK);
    }
  }
  EXPECT_GT(io_errors, 0) << "tensors evicted from the small pinned budget are read again";
}

TEST_F(FaultyRuntime, CorruptionOnTheDeviceIsDetectedNotReturned) {
  create_with_faults("read:corrupt:every=1");
  constexpr uint64_t kBytes = 300000;
  std::vector<strata_tensor> tensors;
  for (int i = 0; i < 10; ++i) {
    tensors.push_back(register_tensor(kBytes));
    std::vector<uint8_t> in(kBytes);
    strata::testing::fill_expected(in.data(), kBytes, i, 0);
    ASSERT_EQ(strata_tensor_write(rt_, tensors.back(), in.data(), 0, kBytes), STRATA_OK);
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK);
  int corrupt = 0;
  for (int i = 0; i < 10; ++i) {
    std::vector<uint8_t> out(kBytes);
    const int rc = strata_tensor_read(rt_, tensors[i], out.data(), 0, kBytes);
    if (rc == STRATA_OK) {
      // Still resident from the write: never touched the device.
      EXPECT_EQ(strata::testing::first_mismatch(out.data(), kBytes, i, 0), kBytes) << i;
    } else {
      EXPECT_EQ(rc, STRATA_E_CORRUPT) << strata_last_error(rt_);
      ++corrupt;
    }
  }
  EXPECT_GT(corrupt, 0);
}

TEST_F(FaultyRuntime, AMalformedFaultSpecRefusesCreation) {
  setenv("STRATA_FAULTS", "write:explode", 1);
  EXPECT_EQ(strata_runtime_create(&config_, &rt_), STRATA_E_INVALID);
  unsetenv("STRATA_FAULTS");
  EXPECT_NE(std::string(strata_last_error(nullptr)).find("STRATA_FAULTS"), std::string::npos);
}

}  // namespace
