// Ranged I/O on the extent store: blocks written and read a few at a time, each verified against
// its own checksum, with the argument, content-length and in-flight rules of extent_store.h.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/align.h"
#include "io/engine_factory.h"
#include "storage/extent_store.h"
#include "storage_test_util.h"

namespace strata::storage {
namespace {

using testing::AlignedBuffer;
using testing::Completion;

constexpr uint64_t kStoreCapacity = 16ull << 20;

// "block [a, b)", as the store's messages name a block.
std::string block_text(uint64_t start, uint64_t end) {
  return "block [" + std::to_string(start) + ", " + std::to_string(end) + ")";
}

class ExtentStoreRanges : public ::testing::TestWithParam<io::IoEngineKind> {
 protected:
  void SetUp() override {
    auto engine = testing::make_engine(GetParam());
    if (!engine && engine.status().code() == STRATA_E_UNSUPPORTED) {
      GTEST_SKIP() << engine.status().message();
    }
    ASSERT_TRUE(engine.is_ok()) << engine.status().message();
    engine_ = std::move(engine).value();
    ASSERT_NO_FATAL_FAILURE(open(*engine_));
  }

  // Opens the store with blocks of four alignment units, so that extents of a few blocks stay
  // small. Call through ASSERT_NO_FATAL_FAILURE.
  void open(io::IoEngine& engine) {
    store_.reset();
    BackingDeviceOptions device;
    device.swap_dir = dir_.path();
    device.capacity_bytes = kStoreCapacity;
    auto backing = BackingDevice::open(device);
    ASSERT_TRUE(backing.is_ok()) << backing.status().message();
    ExtentStoreOptions options;
    options.block_bytes = 4 * backing->alignment();
    auto store = ExtentStore::open(std::move(backing).value(), engine, options);
    ASSERT_TRUE(store.is_ok()) << store.status().message();
    store_ = std::move(store).value();
    block_ = store_->block_bytes();
    ASSERT_EQ(block_, options.block_bytes);
  }

  // Reopens the store on a gate, which holds every request in flight until it is opened.
  void open_gated() {
    gate_ = std::make_unique<testing::GatedEngine>(*engine_);
    ASSERT_NO_FATAL_FAILURE(open(*gate_));
  }

  Extent allocate(uint64_t bytes) {
    auto extent = store_->allocate(bytes);
    EXPECT_TRUE(extent.is_ok()) << extent.status().message();
    return extent.is_ok() ? *extent : Extent{};
  }

  // Writes [offset, offset + bytes) of `image` - what the extent should hold - straight from it
  // (offset is a block multiple, so the slice is aligned).
  Status write_slice(const Extent& extent, const AlignedBuffer& image, uint64_t offset,
                     uint64_t bytes, uint64_t content_bytes) {
    return store_->write_range(extent, offset, image.data() + offset, bytes, content_bytes);
  }

  // Reads [offset, offset + bytes) and expects exactly image's bytes there.
  Status read_and_compare(const Extent& extent, const AlignedBuffer& image, uint64_t offset,
                          uint64_t bytes) {
    AlignedBuffer back(align_up(bytes, store_->alignment()));
    std::memset(back.data(), 0xA5, back.size());
    auto read = store_->read_range(extent, offset, back.data(), bytes);
    if (!read) return std::move(read).take_status();
    EXPECT_EQ(*read, bytes);
    EXPECT_EQ(std::memcmp(back.data(), image.data() + offset, bytes), 0)
        << "wrong bytes in [" << offset << ", " << offset + bytes << ")";
    return Status::ok();
  }

  // Reads the whole content and expects `bytes` bytes of image.
  void expect_whole(const Extent& extent, const AlignedBuffer& image, uint64_t bytes) {
    AlignedBuffer back(extent.capacity);
    auto read = store_->read(extent, back.data(), back.size());
    ASSERT_TRUE(read.is_ok()) << read.status().message();
    EXPECT_EQ(*read, bytes);
    EXPECT_EQ(std::memcmp(back.data(), image.data(), bytes), 0);
  }

  testing::ScratchDir dir_;
  std::unique_ptr<io::IoEngine> engine_;
  std::unique_ptr<testing::GatedEngine> gate_;
  std::unique_ptr<ExtentStore> store_;  // destroyed before the engines
  uint64_t block_ = 0;
};

TEST_P(ExtentStoreRanges, RangedWritesThenRangedAndWholeReadsGiveExactlyTheBytes) {
  const uint64_t content = 5 * block_ + block_ / 2 + 7;  // a tail that is not device-aligned
  const Extent extent = allocate(content);
  AlignedBuffer image(extent.capacity);
  image.fill_random(1, extent.capacity);
  // Out of order, the tail first; each write names the same content length.
  ASSERT_TRUE(write_slice(extent, image, 4 * block_, content - 4 * block_, content).is_ok());
  ASSERT_TRUE(write_slice(extent, image, 0, 2 * block_, content).is_ok());
  ASSERT_TRUE(write_slice(extent, image, 2 * block_, 2 * block_, content).is_ok());
  EXPECT_EQ(*store_->content_bytes(extent), content);

  for (uint64_t offset = 0; offset < content; offset += block_) {
    SCOPED_TRACE(offset);
    EXPECT_TRUE(
        read_and_compare(extent, image, offset, std::min(block_, content - offset)).is_ok());
  }
  EXPECT_TRUE(read_and_compare(extent, image, block_, content - block_).is_ok());
  ASSERT_NO_FATAL_FAILURE(expect_whole(extent, image, content));

  const ExtentStoreStats stats = store_->stats();
  EXPECT_EQ(stats.writes, 3u) << "a ranged write counts as one";
  EXPECT_EQ(stats.bytes_written, content);
  EXPECT_EQ(stats.reads, 8u);
  EXPECT_EQ(stats.bytes_read, content + (content - block_) + content);
  EXPECT_EQ(stats.checksum_failures, 0u);
}

TEST_P(ExtentStoreRanges, EveryBlockIsVerifiedAndAMismatchNamesItsBlock) {
  const uint64_t content = 4 * block_;
  const Extent extent = allocate(content);
  AlignedBuffer image(extent.capacity);
  image.fill_random(2, content);
  ASSERT_TRUE(store_->write(extent, image.data(), content).is_ok());
  const std::string& path = store_->device().path();
  ASSERT_NO_FATAL_FAILURE(testing::tamper(path, extent.offset + 2 * block_ + 100, 0x10));

  const Status ranged = read_and_compare(extent, image, block_, 2 * block_);
  EXPECT_EQ(ranged.code(), STRATA_E_CORRUPT);
  const std::string& message = ranged.message();
  EXPECT_NE(message.find("extent #" + std::to_string(extent.id)), std::string::npos) << message;
  EXPECT_NE(message.find(block_text(2 * block_, 3 * block_)), std::string::npos) << message;
  EXPECT_NE(message.find("expected xxh3 "), std::string::npos) << message;
  EXPECT_NE(message.find(", got "), std::string::npos) << message;
  EXPECT_NE(message.find("changed since it was written"), std::string::npos) << message;
  EXPECT_EQ(store_->stats().checksum_failures, 1u);
  EXPECT_EQ(store_->stats().read_errors, 1u);

  // The blocks around it are intact and read on their own.
  EXPECT_TRUE(read_and_compare(extent, image, 0, 2 * block_).is_ok());
  EXPECT_TRUE(read_and_compare(extent, image, 3 * block_, block_).is_ok());

  // A second damaged block: a whole read names the first and counts both.
  ASSERT_NO_FATAL_FAILURE(testing::tamper(path, extent.offset + 7, 0x01));
  AlignedBuffer back(extent.capacity);
  auto whole = store_->read(extent, back.data(), back.size());
  EXPECT_EQ(whole.status().code(), STRATA_E_CORRUPT);
  EXPECT_NE(whole.status().message().find(block_text(0, block_)), std::string::npos)
      << whole.status().message();
  EXPECT_NE(whole.status().message().find("1 more"), std::string::npos) << whole.status().message();
  EXPECT_EQ(store_->stats().checksum_failures, 3u) << "blocks that mismatched, not reads";
}

TEST_P(ExtentStoreRanges, AWriteOverlappingARequestInFlightIsRefusedAndDisjointOnesProceed) {
  ASSERT_NO_FATAL_FAILURE(open_gated());
  const uint64_t content = 4 * block_;
  const Extent extent = allocate(content);
  AlignedBuffer image(extent.capacity);
  image.fill_random(3, content);
  AlignedBuffer second(extent.capacity);
  second.fill_random(4, content);
  {
    Completion first;
    ASSERT_TRUE(store_->write_async(extent, image.data(), content, &first.io).is_ok());
    gate_->open();
    first.done.wait();
    ASSERT_TRUE(first.io.status.is_ok()) << first.io.status.message();
    gate_->close();
  }

  // A read of blocks 0-1 in flight.
  AlignedBuffer back_a(2 * block_);
  Completion read_a;
  ASSERT_TRUE(store_->read_range_async(extent, 0, back_a.data(), 2 * block_, &read_a.io).is_ok());
  Completion refused;
  const Status over_read = store_->write_range_async(extent, block_, second.data() + block_, block_,
                                                     content, &refused.io);
  EXPECT_EQ(over_read.code(), STRATA_E_STATE);
  const auto range = [](uint64_t start, uint64_t end) {
    return "bytes [" + std::to_string(start) + ", " + std::to_string(end) + ")";
  };
  EXPECT_NE(over_read.message().find(range(block_, 2 * block_)), std::string::npos)
      << over_read.message();
  EXPECT_NE(over_read.message().find("a read of " + range(0, 2 * block_)), std::string::npos)
      << over_read.message();

  // A write of block 2, disjoint, proceeds; reads and writes over it are refused.
  Completion write_c;
  ASSERT_TRUE(store_
                  ->write_range_async(extent, 2 * block_, second.data() + 2 * block_, block_,
                                      content, &write_c.io)
                  .is_ok());
  AlignedBuffer scratch(extent.capacity);
  const Status read_over_write =
      store_->read_range_async(extent, 2 * block_, scratch.data(), block_, &refused.io);
  EXPECT_EQ(read_over_write.code(), STRATA_E_STATE);
  EXPECT_NE(read_over_write.message().find("a write of " + range(2 * block_, 3 * block_)),
            std::string::npos)
      << read_over_write.message();
  EXPECT_EQ(store_
                ->write_range_async(extent, 2 * block_, second.data() + 2 * block_, 2 * block_,
                                    content, &refused.io)
                .code(),
            STRATA_E_STATE);
  EXPECT_EQ(store_->read_async(extent, scratch.data(), scratch.size(), &refused.io).code(),
            STRATA_E_STATE)
      << "the whole content includes block 2";

  // Reads may share blocks with reads, and a read disjoint from the write proceeds.
  AlignedBuffer back_d(block_);
  Completion read_d;
  ASSERT_TRUE(store_->read_range_async(extent, block_, back_d.data(), block_, &read_d.io).is_ok());
  AlignedBuffer back_e(block_);
  Completion read_e;
  ASSERT_TRUE(
      store_->read_range_async(extent, 3 * block_, back_e.data(), block_, &read_e.io).is_ok());
  const Status freed = store_->free(extent);
  EXPECT_EQ(freed.code(), STRATA_E_STATE);
  EXPECT_NE(freed.message().find("in flight"), std::string::npos);

  gate_->open();
  for (Completion* c : {&read_a, &write_c, &read_d, &read_e}) {
    c->done.wait();
    EXPECT_TRUE(c->io.status.is_ok()) << c->io.status.message();
  }
  EXPECT_EQ(std::memcmp(back_a.data(), image.data(), 2 * block_), 0);
  EXPECT_EQ(std::memcmp(back_d.data(), image.data() + block_, block_), 0);
  EXPECT_EQ(std::memcmp(back_e.data(), image.data() + 3 * block_, block_), 0);

  Completion read_c;
  ASSERT_TRUE(
      store_->read_range_async(extent, 2 * block_, scratch.data(), block_, &read_c.io).is_ok());
  read_c.done.wait();  // the gate is open
  ASSERT_TRUE(read_c.io.status.is_ok()) << read_c.io.status.message();
  EXPECT_EQ(std::memcmp(scratch.data(), second.data() + 2 * block_, block_), 0);
  EXPECT_TRUE(store_->free(extent).is_ok());
}

TEST_P(ExtentStoreRanges, MisalignedOrOutOfRangeArgumentsAreInvalid) {
  const uint64_t content = 3 * block_;
  const Extent extent = allocate(content);
  AlignedBuffer image(extent.capacity);
  image.fill_random(5, content);
  const uint64_t unit = store_->alignment();
  const auto expect_invalid = [](const Status& status, const std::string& needle) {
    EXPECT_EQ(status.code(), STRATA_E_INVALID) << status.message();
    EXPECT_NE(status.message().find(needle), std::string::npos) << status.message();
  };
  expect_invalid(write_slice(extent, image, unit, block_, content),
                 "not a multiple of the block size " + std::to_string(block_));
  expect_invalid(write_slice(extent, image, 0, block_ + unit, content),
                 std::to_string(block_ + unit) + " bytes is not a multiple");
  expect_invalid(write_slice(extent, image, 0, block_, block_ / 2),
                 "content length of " + std::to_string(block_ / 2));
  expect_invalid(write_slice(extent, image, 0, block_, extent.capacity + block_),
                 "capacity of " + std::to_string(extent.capacity));
  expect_invalid(write_slice(extent, image, 0, 0, content), "at least one byte");

  AlignedBuffer back(extent.capacity);
  const Status unwritten = store_->read_range(extent, 0, back.data(), block_).status();
  EXPECT_EQ(unwritten.code(), STRATA_E_STATE);
  EXPECT_NE(unwritten.message().find("never written"), std::string::npos) << unwritten.message();

  // Only block 1 written: block 0 is within the content but holds none.
  ASSERT_TRUE(write_slice(extent, image, block_, block_, content).is_ok());
  const Status hole = store_->read_range(extent, 0, back.data(), block_).status();
  EXPECT_EQ(hole.code(), STRATA_E_STATE);
  EXPECT_NE(hole.message().find(block_text(0, block_) + " was never written"), std::string::npos)
      << hole.message();
  EXPECT_EQ(store_->read(extent, back.data(), back.size()).status().code(), STRATA_E_STATE);
  EXPECT_EQ(store_->content_bytes(extent).status().code(), STRATA_E_STATE)
      << "no whole content to read yet";
  EXPECT_TRUE(read_and_compare(extent, image, block_, block_).is_ok());

  const std::string past = "content length of " + std::to_string(content);
  expect_invalid(store_->read_range(extent, block_, back.data(), content).status(), past);
  expect_invalid(store_->read_range(extent, content, back.data(), 1).status(), past);
  expect_invalid(store_->read_range(extent, unit, back.data(), block_).status(),
                 "not a multiple of the block size");
  expect_invalid(store_->read_range(extent, block_, back.data(), block_ / 2).status(),
                 "does not end at the content's end");
  expect_invalid(store_->read_range(extent, block_, back.data(), 0).status(), "at least one byte");
  EXPECT_EQ(store_->stats().write_errors, 0u) << "refused up front, not failed I/O";
  EXPECT_EQ(store_->stats().read_errors, 0u);
}

TEST_P(ExtentStoreRanges, ATailRangeOfAPartialLastBlockRoundTrips) {
  const uint64_t content = 2 * block_ + 1000;
  const Extent extent = allocate(content);
  AlignedBuffer image(extent.capacity);
  image.fill_random(6, extent.capacity);
  ASSERT_TRUE(write_slice(extent, image, 0, 2 * block_, content).is_ok());
  ASSERT_TRUE(write_slice(extent, image, 2 * block_, 1000, content).is_ok());
  EXPECT_TRUE(read_and_compare(extent, image, 2 * block_, 1000).is_ok());
  EXPECT_TRUE(read_and_compare(extent, image, 0, content).is_ok());
  ASSERT_NO_FATAL_FAILURE(expect_whole(extent, image, content));
  // The padding after the tail reaches the device but is neither content nor hashed.
  ASSERT_NO_FATAL_FAILURE(
      testing::tamper(store_->device().path(), extent.offset + 2 * block_ + 1005, 0xFF));
  EXPECT_TRUE(read_and_compare(extent, image, 2 * block_, 1000).is_ok());
}

TEST_P(ExtentStoreRanges, AShorterWholeWriteMakesTheOldTailUnreadable) {
  const Extent extent = allocate(4 * block_);
  AlignedBuffer first(extent.capacity);
  first.fill_random(7, extent.capacity);
  ASSERT_TRUE(store_->write(extent, first.data(), 4 * block_).is_ok());
  AlignedBuffer second(extent.capacity);
  second.fill_random(8, extent.capacity);
  const uint64_t shorter = block_ + block_ / 2;
  ASSERT_TRUE(store_->write(extent, second.data(), shorter).is_ok());
  EXPECT_EQ(*store_->content_bytes(extent), shorter);

  AlignedBuffer back(extent.capacity);
  const Status old_tail = store_->read_range(extent, 2 * block_, back.data(), block_).status();
  EXPECT_EQ(old_tail.code(), STRATA_E_INVALID);
  EXPECT_NE(old_tail.message().find("content length of " + std::to_string(shorter)),
            std::string::npos)
      << old_tail.message();
  ASSERT_NO_FATAL_FAILURE(expect_whole(extent, second, shorter));
  EXPECT_TRUE(read_and_compare(extent, second, block_, shorter - block_).is_ok());

  // Growing the length again does not bring the old blocks back, nor keep the half block that
  // was the tail: they hold no content until written.
  ASSERT_TRUE(write_slice(extent, second, 0, block_, 4 * block_).is_ok());
  EXPECT_TRUE(read_and_compare(extent, second, 0, block_).is_ok());
  for (uint64_t offset : {block_, 3 * block_}) {
    const Status dropped = store_->read_range(extent, offset, back.data(), block_).status();
    EXPECT_EQ(dropped.code(), STRATA_E_STATE) << offset;
    EXPECT_NE(dropped.message().find("never written"), std::string::npos) << dropped.message();
  }
}

TEST_P(ExtentStoreRanges, ThreadsStreamingDisjointChunksOfOneExtentRunTogether) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 16;
  const uint64_t chunk = 2 * block_;
  const uint64_t content = kThreads * chunk;
  const Extent extent = allocate(content);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const uint64_t offset = static_cast<uint64_t>(t) * chunk;
      AlignedBuffer data(chunk);
      AlignedBuffer back(chunk);
      for (int round = 0; round < kRounds; ++round) {
        data.fill_random(static_cast<uint64_t>(t) * 1000 + round, chunk);
        auto read = store_->write_range(extent, offset, data.data(), chunk, content).is_ok()
                        ? store_->read_range(extent, offset, back.data(), chunk)
                        : Result<uint64_t>(io_error("write failed"));
        if (!read || *read != chunk || std::memcmp(back.data(), data.data(), chunk) != 0) {
          ++failures;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store_->stats().writes, uint64_t{kThreads} * kRounds);
  EXPECT_EQ(store_->stats().reads, uint64_t{kThreads} * kRounds);
}

INSTANTIATE_TEST_SUITE_P(Engines, ExtentStoreRanges,
                         ::testing::Values(io::IoEngineKind::kPsync, io::IoEngineKind::kUring),
                         [](const auto& param_info) {
                           return std::string(io::io_engine_kind_name(param_info.param));
                         });

TEST(ExtentStoreBlockSize, MustBeAPowerOfTwoOfAtLeastTheAlignment) {
  testing::ScratchDir dir;
  auto engine = testing::make_engine(io::IoEngineKind::kPsync);
  ASSERT_TRUE(engine.is_ok()) << engine.status().message();
  BackingDeviceOptions device;
  device.swap_dir = dir.path();
  device.capacity_bytes = 1 << 20;
  for (const uint64_t units : {0, 1, 3, 6}) {  // in halves of the alignment
    auto backing = BackingDevice::open(device);
    ASSERT_TRUE(backing.is_ok()) << backing.status().message();
    ExtentStoreOptions options;
    options.block_bytes = units * backing->alignment() / 2;
    auto store = ExtentStore::open(std::move(backing).value(), **engine, options);
    ASSERT_FALSE(store.is_ok()) << options.block_bytes;
    EXPECT_EQ(store.status().code(), STRATA_E_INVALID);
    EXPECT_NE(
        store.status().message().find("block_bytes is " + std::to_string(options.block_bytes)),
        std::string::npos)
        << store.status().message();
  }
  auto backing = BackingDevice::open(device);
  ASSERT_TRUE(backing.is_ok()) << backing.status().message();
  ExtentStoreOptions options;
  options.block_bytes = 2 * backing->alignment();
  EXPECT_TRUE(ExtentStore::open(std::move(backing).value(), **engine, options).is_ok());
  EXPECT_EQ(ExtentStoreOptions{}.block_bytes, 1u << 20) << "the documented default";
}

}  // namespace
}  // namespace strata::storage
