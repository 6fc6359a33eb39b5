#include "storage/extent_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/align.h"
#include "io/engine_factory.h"
#include "storage/checksum.h"
#include "storage_test_util.h"

namespace strata::storage {
namespace {

using testing::AlignedBuffer;
using testing::Completion;
using testing::GatedEngine;
using testing::make_engine;
using testing::RefusingEngine;
using testing::ScratchDir;
using testing::tamper;

constexpr uint64_t kStoreCapacity = 64ull << 20;

// Sizes that are deliberately not multiples of 4096, from one byte to several MiB.
const std::vector<uint64_t> kOddSizes = {1,
                                         7,
                                         511,
                                         4095,
                                         4097,
                                         12289,
                                         65537,
                                         (1u << 20) - 1,
                                         (1u << 20) + 3,
                                         (3u << 20) + 123,
                                         (5u << 20) - 1};

BackingDeviceOptions swap_options(const ScratchDir& dir, uint64_t capacity = kStoreCapacity) {
  BackingDeviceOptions options;
  options.swap_dir = dir.path();
  options.capacity_bytes = capacity;
  return options;
}

std::unique_ptr<ExtentStore> open_store(io::IoEngine& engine, const BackingDeviceOptions& device,
                                        const ExtentStoreOptions& options = {}) {
  auto backing = BackingDevice::open(device);
  EXPECT_TRUE(backing.is_ok()) << backing.status().message();
  if (!backing) return nullptr;
  auto store = ExtentStore::open(std::move(backing).value(), engine, options);
  EXPECT_TRUE(store.is_ok()) << store.status().message();
  if (!store) return nullptr;
  return std::move(store).value();
}

// Writes `bytes` of data from `seed` into a fresh extent and returns it.
Extent write_random(ExtentStore& store, uint64_t bytes, uint64_t seed) {
  auto extent = store.allocate(bytes);
  EXPECT_TRUE(extent.is_ok()) << extent.status().message();
  AlignedBuffer data(extent->capacity);
  data.fill_random(seed, bytes);
  const Status written = store.write(*extent, data.data(), bytes);
  EXPECT_TRUE(written.is_ok()) << written.message();
  return *extent;
}

// Reads an extent back and checks it holds exactly the bytes write_random(seed) put there.
void expect_content(ExtentStore& store, const Extent& extent, uint64_t bytes, uint64_t seed) {
  AlignedBuffer expected(extent.capacity);
  expected.fill_random(seed, bytes);
  AlignedBuffer actual(extent.capacity);
  std::memset(actual.data(), 0xA5, extent.capacity);
  auto read = store.read(extent, actual.data(), extent.capacity);
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  EXPECT_EQ(*read, bytes);
  ASSERT_EQ(std::memcmp(actual.data(), expected.data(), bytes), 0) << bytes << " bytes";
}

// ---------------------------------------------------------------------------------------------
// Behaviour that must be the same on every engine.

class ExtentStoreOnEngine : public ::testing::TestWithParam<io::IoEngineKind> {
 protected:
  void SetUp() override {
    auto engine = make_engine(GetParam());
    if (!engine && engine.status().code() == STRATA_E_UNSUPPORTED) {
      GTEST_SKIP() << engine.status().message();
    }
    ASSERT_TRUE(engine.is_ok()) << engine.status().message();
    engine_ = std::move(engine).value();
    store_ = open_store(*engine_, swap_options(dir_));
    ASSERT_NE(store_, nullptr);
  }

  ScratchDir dir_;
  std::unique_ptr<io::IoEngine> engine_;
  std::unique_ptr<ExtentStore> store_;  // destroyed before the engine
};

TEST_P(ExtentStoreOnEngine, RoundTripsOddSizesByteForByte) {
  std::vector<Extent> extents;
  for (size_t i = 0; i < kOddSizes.size(); ++i) {
    extents.push_back(write_random(*store_, kOddSizes[i], 100 + i));
  }
  // Read back after all writes, so that neighbouring extents cannot have overwritten each other.
  for (size_t i = 0; i < kOddSizes.size(); ++i) {
    SCOPED_TRACE(kOddSizes[i]);
    expect_content(*store_, extents[i], kOddSizes[i], 100 + i);
    auto bytes = store_->content_bytes(extents[i]);
    ASSERT_TRUE(bytes.is_ok());
    EXPECT_EQ(*bytes, kOddSizes[i]);
  }
  const ExtentStoreStats stats = store_->stats();
  uint64_t total = 0;
  for (uint64_t size : kOddSizes) total += size;
  EXPECT_EQ(stats.writes, kOddSizes.size());
  EXPECT_EQ(stats.reads, kOddSizes.size());
  EXPECT_EQ(stats.bytes_written, total);
  EXPECT_EQ(stats.bytes_read, total);
  EXPECT_EQ(stats.checksum_failures, 0u);
  EXPECT_EQ(stats.extents, kOddSizes.size());
}

TEST_P(ExtentStoreOnEngine, RewritingAnExtentReplacesItsContent) {
  const Extent extent = write_random(*store_, 10000, 1);
  AlignedBuffer shorter(extent.capacity);
  shorter.fill_random(2, 3000);
  ASSERT_TRUE(store_->write(extent, shorter.data(), 3000).is_ok());
  expect_content(*store_, extent, 3000, 2);
}

TEST_P(ExtentStoreOnEngine, ManyAsyncRequestsInFlightComplete) {
  constexpr int kCount = 48;
  std::vector<Extent> extents;
  std::vector<AlignedBuffer> buffers;
  std::vector<uint64_t> sizes;
  std::mt19937_64 rng(5);
  for (int i = 0; i < kCount; ++i) {
    sizes.push_back(1 + rng() % (300 << 10));
    auto extent = store_->allocate(sizes.back());
    ASSERT_TRUE(extent.is_ok());
    extents.push_back(*extent);
    buffers.emplace_back(extent->capacity);
    buffers.back().fill_random(1000 + i, sizes.back());
  }

  std::vector<ExtentIo> ios(kCount);
  {
    std::latch done(kCount);
    for (int i = 0; i < kCount; ++i) {
      ios[i].on_complete = [](ExtentIo*, void* context) {
        static_cast<std::latch*>(context)->count_down();
      };
      ios[i].context = &done;
      ASSERT_TRUE(store_->write_async(extents[i], buffers[i].data(), sizes[i], &ios[i]).is_ok());
    }
    done.wait();
  }
  for (const ExtentIo& io : ios) EXPECT_TRUE(io.status.is_ok()) << io.status.message();

  std::vector<AlignedBuffer> read_back;
  for (int i = 0; i < kCount; ++i) read_back.emplace_back(extents[i].capacity);
  {
    std::latch done(kCount);
    for (int i = 0; i < kCount; ++i) {
      ios[i].context = &done;  // ExtentIo objects are reusable once complete
      ASSERT_TRUE(store_->read_async(extents[i], read_back[i].data(), extents[i].capacity, &ios[i])
                      .is_ok());
    }
    done.wait();
  }
  for (int i = 0; i < kCount; ++i) {
    ASSERT_TRUE(ios[i].status.is_ok()) << ios[i].status.message();
    EXPECT_EQ(ios[i].bytes, sizes[i]);
    EXPECT_EQ(std::memcmp(read_back[i].data(), buffers[i].data(), sizes[i]), 0) << i;
  }
}

TEST_P(ExtentStoreOnEngine, ThreadsWorkOnDistinctExtentsAtOnce) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int round = 0; round < kRounds; ++round) {
        const uint64_t bytes = 1 + rng() % (200 << 10);
        const uint64_t seed = static_cast<uint64_t>(t) * 1000 + round;
        auto extent = store_->allocate(bytes);
        if (!extent) {
          ++failures;
          continue;
        }
        AlignedBuffer data(extent->capacity);
        data.fill_random(seed, bytes);
        AlignedBuffer back(extent->capacity);
        auto read = store_->write(*extent, data.data(), bytes).is_ok()
                        ? store_->read(*extent, back.data(), extent->capacity)
                        : Result<uint64_t>(io_error("write failed"));
        if (!read || *read != bytes || std::memcmp(back.data(), data.data(), bytes) != 0) {
          ++failures;
        }
        // Keep every other extent so that live extents interleave with freed ones.
        if (round % 2 == 0 && !store_->free(*extent).is_ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  const ExtentStoreStats stats = store_->stats();
  EXPECT_EQ(stats.writes, uint64_t{kThreads} * kRounds);
  EXPECT_EQ(stats.extents, uint64_t{kThreads} * kRounds / 2);
}

TEST_P(ExtentStoreOnEngine, AcceptsARegisteredBuffer) {
  auto extent = store_->allocate(70000);
  ASSERT_TRUE(extent.is_ok());
  AlignedBuffer buffer(extent->capacity);
  auto index = engine_->register_buffer(buffer.data(), buffer.size());
  ASSERT_TRUE(index.is_ok()) << index.status().message();
  buffer.fill_random(9, 70000);
  ASSERT_TRUE(store_->write(*extent, buffer.data(), 70000, *index).is_ok());
  std::memset(buffer.data(), 0, buffer.size());
  auto read = store_->read(*extent, buffer.data(), buffer.size(), *index);
  ASSERT_TRUE(read.is_ok()) << read.status().message();
  AlignedBuffer expected(extent->capacity);
  expected.fill_random(9, 70000);
  EXPECT_EQ(std::memcmp(buffer.data(), expected.data(), 70000), 0);
  EXPECT_TRUE(engine_->unregister_buffer(*index).is_ok());
}

TEST_P(ExtentStoreOnEngine, CorruptionBehindStrataIsDetected) {
  const uint64_t kBytes = 3 * 4096 + 17;
  const Extent extent = write_random(*store_, kBytes, 77);
  tamper(store_->device().path(), extent.offset + 5000, 0x01);

  AlignedBuffer back(extent.capacity);
  auto read = store_->read(extent, back.data(), extent.capacity);
  ASSERT_FALSE(read.is_ok());
  EXPECT_EQ(read.status().code(), STRATA_E_CORRUPT);
  const std::string& message = read.status().message();
  EXPECT_NE(message.find("offset " + std::to_string(extent.offset)), std::string::npos) << message;
  EXPECT_NE(message.find("expected xxh3 "), std::string::npos) << message;
  EXPECT_EQ(store_->stats().checksum_failures, 1u);

  // Putting the byte back makes the content whole again: the check is on content, not history.
  tamper(store_->device().path(), extent.offset + 5000, 0x01);
  expect_content(*store_, extent, kBytes, 77);
  // The padding after the logical bytes is not content.
  tamper(store_->device().path(), extent.offset + kBytes + 1, 0xFF);
  expect_content(*store_, extent, kBytes, 77);
}

INSTANTIATE_TEST_SUITE_P(Engines, ExtentStoreOnEngine,
                         ::testing::Values(io::IoEngineKind::kPsync, io::IoEngineKind::kUring),
                         [](const auto& param_info) {
                           return std::string(io::io_engine_kind_name(param_info.param));
                         });

// ---------------------------------------------------------------------------------------------
// The same workload on each engine leaves the same bytes on the device and reads the same back.

struct WorkloadOutcome {
  std::vector<uint64_t> read_hashes;  // checksum of what each read returned
  uint64_t file_hash = 0;             // checksum of the whole swap file afterwards
};

Result<WorkloadOutcome> run_workload(io::IoEngineKind kind, const ScratchDir& dir,
                                     const std::string& file_name) {
  auto engine = make_engine(kind);
  if (!engine) return std::move(engine).take_status();
  BackingDeviceOptions device = swap_options(dir, 16ull << 20);
  device.swap_file_name = file_name;
  device.keep = true;
  WorkloadOutcome outcome;
  {
    auto store = open_store(**engine, device);
    if (store == nullptr) return io_error("no store");
    std::vector<std::pair<Extent, uint64_t>> live;
    std::mt19937_64 rng(2024);
    for (int step = 0; step < 60; ++step) {
      if (!live.empty() && rng() % 3 == 0) {
        const size_t victim = rng() % live.size();
        STRATA_TRY(store->free(live[victim].first));
        live.erase(live.begin() + static_cast<long>(victim));
        continue;
      }
      const uint64_t bytes = 1 + rng() % (600 << 10);
      auto extent = store->allocate(bytes);
      if (!extent) return std::move(extent).take_status();
      AlignedBuffer data(extent->capacity);
      data.fill_random(step, bytes);
      STRATA_TRY(store->write(*extent, data.data(), bytes));
      live.emplace_back(*extent, bytes);
    }
    for (const auto& [extent, bytes] : live) {
      AlignedBuffer back(extent.capacity);
      auto read = store->read(extent, back.data(), extent.capacity);
      if (!read) return std::move(read).take_status();
      outcome.read_hashes.push_back(checksum(back.data(), *read));
    }
  }
  const int fd = ::open(dir.file(file_name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open the kept swap file");
  std::vector<uint8_t> whole(16ull << 20);
  const ssize_t got = ::pread(fd, whole.data(), whole.size(), 0);
  ::close(fd);
  if (got != static_cast<ssize_t>(whole.size())) return io_error("short read of the swap file");
  outcome.file_hash = checksum(whole.data(), whole.size());
  return outcome;
}

TEST(ExtentStore, PsyncAndUringEnginesGiveIdenticalResults) {
  ScratchDir dir;
  auto psync = run_workload(io::IoEngineKind::kPsync, dir, "psync.swap");
  ASSERT_TRUE(psync.is_ok()) << psync.status().message();
  auto uring = run_workload(io::IoEngineKind::kUring, dir, "uring.swap");
  if (!uring && uring.status().code() == STRATA_E_UNSUPPORTED) {
    GTEST_SKIP() << uring.status().message();
  }
  ASSERT_TRUE(uring.is_ok()) << uring.status().message();
  EXPECT_FALSE(psync->read_hashes.empty());
  EXPECT_EQ(psync->read_hashes, uring->read_hashes);
  EXPECT_EQ(psync->file_hash, uring->file_hash);
}

// ---------------------------------------------------------------------------------------------
// Engine-independent rules, on the psync engine.

class ExtentStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = make_engine(io::IoEngineKind::kPsync);
    ASSERT_TRUE(engine.is_ok()) << engine.status().message();
    engine_ = std::move(engine).value();
  }
  std::unique_ptr<ExtentStore> open(uint64_t capacity = kStoreCapacity,
                                    const ExtentStoreOptions& options = {}) {
    return open_store(*engine_, swap_options(dir_, capacity), options);
  }

  ScratchDir dir_;
  std::unique_ptr<io::IoEngine> engine_;
};

TEST_F(ExtentStoreTest, ExhaustionIsNoSpaceAndFreeingRecovers) {
  auto store = open(1ull << 20);
  ASSERT_NE(store, nullptr);
  std::vector<Extent> extents;
  for (;;) {
    auto extent = store->allocate(100000);  // 25 pages each
    if (!extent) {
      EXPECT_EQ(extent.status().code(), STRATA_E_NOSPACE);
      EXPECT_NE(extent.status().message().find("requested"), std::string::npos);
      break;
    }
    extents.push_back(*extent);
  }
  ASSERT_EQ(extents.size(), 10u);  // 256 pages / 25
  for (size_t i = 0; i < extents.size(); ++i) {
    AlignedBuffer data(extents[i].capacity);
    data.fill_random(i, 100000);
    ASSERT_TRUE(store->write(extents[i], data.data(), 100000).is_ok());
  }
  ASSERT_TRUE(store->free(extents[3]).is_ok());
  ASSERT_TRUE(store->free(extents[4]).is_ok());
  // The two freed neighbours coalesced: a request for both of them fits.
  auto bigger = store->allocate(200000);
  ASSERT_TRUE(bigger.is_ok()) << bigger.status().message();
  AlignedBuffer data(bigger->capacity);
  data.fill_random(99, 200000);
  ASSERT_TRUE(store->write(*bigger, data.data(), 200000).is_ok());
  expect_content(*store, *bigger, 200000, 99);
  for (size_t i : {0, 2, 5, 9}) expect_content(*store, extents[i], 100000, i);
}

TEST_F(ExtentStoreTest, ReadingAnExtentNeverWrittenIsAStateError) {
  auto store = open();
  ASSERT_NE(store, nullptr);
  auto extent = store->allocate(5000);
  ASSERT_TRUE(extent.is_ok());
  AlignedBuffer buffer(extent->capacity);
  auto read = store->read(*extent, buffer.data(), buffer.size());
  ASSERT_FALSE(read.is_ok());
  EXPECT_EQ(read.status().code(), STRATA_E_STATE);
  EXPECT_NE(read.status().message().find("never written"), std::string::npos);
  EXPECT_EQ(store->content_bytes(*extent).status().code(), STRATA_E_STATE);
}

TEST_F(ExtentStoreTest, AFreedHandleIsRefusedEvenOnceItsSpaceIsReused) {
  auto store = open();
  ASSERT_NE(store, nullptr);
  const Extent old = write_random(*store, 8192, 1);
  ASSERT_TRUE(store->free(old).is_ok());
  const Extent reused = write_random(*store, 8192, 2);
  ASSERT_EQ(reused.offset, old.offset) << "best fit hands the same space out again";
  EXPECT_NE(reused.id, old.id);

  AlignedBuffer buffer(old.capacity);
  EXPECT_EQ(store->read(old, buffer.data(), buffer.size()).status().code(), STRATA_E_STATE);
  EXPECT_EQ(store->write(old, buffer.data(), 10).code(), STRATA_E_STATE);
  EXPECT_EQ(store->free(old).code(), STRATA_E_STATE);
  Extent forged = reused;
  forged.capacity += 4096;
  EXPECT_EQ(store->free(forged).code(), STRATA_E_STATE);
  expect_content(*store, reused, 8192, 2);
}

TEST_F(ExtentStoreTest, RefusesMisalignedBuffersAndWrongSizes) {
  auto store = open();
  ASSERT_NE(store, nullptr);
  auto extent = store->allocate(8192);
  ASSERT_TRUE(extent.is_ok());
  AlignedBuffer buffer(3 * 8192);
  EXPECT_EQ(store->write(*extent, buffer.data() + 512, 100).code(), STRATA_E_INVALID);
  EXPECT_EQ(store->write(*extent, nullptr, 100).code(), STRATA_E_INVALID);
  EXPECT_EQ(store->write(*extent, buffer.data(), 0).code(), STRATA_E_INVALID);
  EXPECT_EQ(store->write(*extent, buffer.data(), 8193).code(), STRATA_E_INVALID);
  ASSERT_TRUE(store->write(*extent, buffer.data(), 8000).is_ok());
  EXPECT_EQ(store->read(*extent, buffer.data(), 4096).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(store->allocate(0).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(store->stats().write_errors, 0u) << "refused up front, not failed I/O";
}

TEST_F(ExtentStoreTest, WithoutChecksumsContentIsNotVerified) {
  ExtentStoreOptions options;
  options.verify_checksums = false;
  auto store = open(kStoreCapacity, options);
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(store->verify_checksums());
  const Extent extent = write_random(*store, 6000, 3);
  expect_content(*store, extent, 6000, 3);
  tamper(store->device().path(), extent.offset + 10, 0x80);
  AlignedBuffer buffer(extent.capacity);
  auto read = store->read(extent, buffer.data(), buffer.size());
  ASSERT_TRUE(read.is_ok()) << "the option trades detection for CPU time";
  EXPECT_EQ(store->stats().checksum_failures, 0u);
}

TEST_F(ExtentStoreTest, ClosingTheStoreRemovesTheSwapFile) {
  auto store = open();
  ASSERT_NE(store, nullptr);
  const std::string path = store->device().path();
  write_random(*store, 5000, 1);
  EXPECT_EQ(::access(path.c_str(), F_OK), 0);
  EXPECT_TRUE(store->close().is_ok());
  store.reset();
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  EXPECT_TRUE(dir_.entries().empty());
}

// Raw device mode needs a block device to scribble on, so it runs only when one is named:
//   STRATA_TEST_RAW_DEVICE=/dev/loopN (its content is destroyed).
TEST_F(ExtentStoreTest, RawBlockDeviceRoundTrips) {
  const char* raw = std::getenv("STRATA_TEST_RAW_DEVICE");
  if (raw == nullptr || *raw == '\0') GTEST_SKIP() << "STRATA_TEST_RAW_DEVICE is not set";
  BackingDeviceOptions device;
  device.raw_device = raw;
  device.capacity_bytes = 8ull << 20;
  auto store = open_store(*engine_, device);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->device().is_raw_device());
  EXPECT_TRUE(store->device().direct_io());
  EXPECT_EQ(store->capacity(), 8ull << 20);
  std::vector<Extent> extents;
  for (size_t i = 0; i < 4; ++i) extents.push_back(write_random(*store, kOddSizes[i + 4], i));
  for (size_t i = 0; i < 4; ++i) expect_content(*store, extents[i], kOddSizes[i + 4], i);

  // A second exclusive opener is refused while the store holds the device.
  auto second = BackingDevice::open(device);
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), STRATA_E_INVALID);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);
  ASSERT_TRUE(store->close().is_ok());
  store.reset();
  EXPECT_EQ(::access(raw, F_OK), 0) << "a raw device is never removed";
}

// With checksums, hashing is the content thread's (content_thread.h): the engine's one thread
// only hands a finished read over, so a read completes on another thread than a write does
// (writes complete on the engine's). Without checksums there is nothing to hash and the read
// completes on the engine's thread too. Either way the bytes read are the bytes written.
TEST_F(ExtentStoreTest, WithChecksumsReadsAreVerifiedAndCompletedOffTheEngineThread) {
  auto engine = make_engine(io::IoEngineKind::kUring);
  if (!engine) GTEST_SKIP() << "io_uring unavailable: " << engine.status().message();
  struct OnThread {
    ExtentIo io;
    std::latch done{1};
    std::thread::id thread;
    OnThread() {
      io.on_complete = [](ExtentIo*, void* context) {
        auto* self = static_cast<OnThread*>(context);
        self->thread = std::this_thread::get_id();
        self->done.count_down();
      };
      io.context = this;
    }
  };
  for (const bool checksums : {true, false}) {
    SCOPED_TRACE(checksums ? "with checksums" : "without checksums");
    ExtentStoreOptions options;
    options.verify_checksums = checksums;
    auto store = open_store(**engine, swap_options(dir_), options);
    ASSERT_NE(store, nullptr);
    const Extent extent = *store->allocate(3 * 4096);
    AlignedBuffer data(3 * 4096);
    data.fill_random(7, 3 * 4096);
    OnThread write;
    ASSERT_TRUE(store->write_async(extent, data.data(), 3 * 4096, &write.io).is_ok());
    write.done.wait();
    ASSERT_TRUE(write.io.status.is_ok()) << write.io.status.message();
    AlignedBuffer back(3 * 4096);
    OnThread read;
    ASSERT_TRUE(store->read_async(extent, back.data(), back.size(), &read.io).is_ok());
    read.done.wait();
    ASSERT_TRUE(read.io.status.is_ok()) << read.io.status.message();
    EXPECT_EQ(std::memcmp(back.data(), data.data(), 3 * 4096), 0);
    EXPECT_NE(write.thread, std::this_thread::get_id());
    EXPECT_EQ(read.thread != write.thread, checksums);
  }
}

// With checksums a write reaches the engine from the content thread, after write_async returned
// OK; an engine that refuses it then is the write's outcome, through on_complete. Without
// checksums the refusal is write_async's own return. Either way nothing is recorded, the error
// is counted and the extent is no longer in flight (it can be freed).
TEST_F(ExtentStoreTest, AWriteTheEngineRefusesFailsThroughItsCompletionOrItsCall) {
  RefusingEngine refusing(*engine_);
  for (const bool checksums : {true, false}) {
    SCOPED_TRACE(checksums ? "with checksums" : "without checksums");
    ExtentStoreOptions options;
    options.verify_checksums = checksums;
    auto store = open_store(refusing, swap_options(dir_), options);
    ASSERT_NE(store, nullptr);
    const Extent extent = *store->allocate(4096);
    AlignedBuffer data(4096);
    data.fill_random(9, 4096);
    Completion write;
    const Status called = store->write_async(extent, data.data(), 4096, &write.io);
    Status outcome = called;
    if (checksums) {
      ASSERT_TRUE(called.is_ok()) << called.message();
      write.done.wait();
      outcome = write.io.status;
    }
    EXPECT_EQ(outcome.code(), STRATA_E_IO) << outcome.message();
    EXPECT_NE(outcome.message().find("the engine refuses requests"), std::string::npos)
        << outcome.message();
    EXPECT_EQ(store->stats().write_errors, 1u);
    EXPECT_EQ(store->content_bytes(extent).status().code(), STRATA_E_STATE)
        << "a refused write records nothing";
    EXPECT_TRUE(store->free(extent).is_ok());
  }
}

// ---------------------------------------------------------------------------------------------
// Rules about I/O in flight, with the GatedEngine holding requests back (storage_test_util.h).

TEST_F(ExtentStoreTest, AnExtentWithAWriteInFlightRefusesOtherIo) {
  GatedEngine gate(*engine_);
  auto store = open_store(gate, swap_options(dir_));
  ASSERT_NE(store, nullptr);
  const Extent extent = *store->allocate(4096);
  AlignedBuffer data(4096);
  data.fill_random(1, 4096);
  Completion write;
  ASSERT_TRUE(store->write_async(extent, data.data(), 4096, &write.io).is_ok());

  AlignedBuffer other(4096);
  Completion second;
  EXPECT_EQ(store->write_async(extent, other.data(), 10, &second.io).code(), STRATA_E_STATE);
  EXPECT_EQ(store->read_async(extent, other.data(), 4096, &second.io).code(), STRATA_E_STATE);
  const Status freed = store->free(extent);
  EXPECT_EQ(freed.code(), STRATA_E_STATE);
  EXPECT_NE(freed.message().find("in flight"), std::string::npos);
  EXPECT_EQ(store->content_bytes(extent).status().code(), STRATA_E_STATE)
      << "nothing is recorded before the write completes";

  gate.open();
  write.done.wait();
  ASSERT_TRUE(write.io.status.is_ok()) << write.io.status.message();
  EXPECT_EQ(*store->content_bytes(extent), 4096u);
  gate.close();

  // Any number of reads at once, but no write or free among them.
  Completion read1;
  Completion read2;
  AlignedBuffer back1(4096);
  AlignedBuffer back2(4096);
  ASSERT_TRUE(store->read_async(extent, back1.data(), 4096, &read1.io).is_ok());
  ASSERT_TRUE(store->read_async(extent, back2.data(), 4096, &read2.io).is_ok());
  EXPECT_EQ(store->write_async(extent, other.data(), 10, &second.io).code(), STRATA_E_STATE);
  EXPECT_EQ(store->free(extent).code(), STRATA_E_STATE);
  gate.open();
  read1.done.wait();
  read2.done.wait();
  EXPECT_TRUE(read1.io.status.is_ok());
  EXPECT_TRUE(read2.io.status.is_ok());
  EXPECT_EQ(std::memcmp(back1.data(), data.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(back2.data(), data.data(), 4096), 0);
  EXPECT_TRUE(store->free(extent).is_ok());
}

}  // namespace
}  // namespace strata::storage
