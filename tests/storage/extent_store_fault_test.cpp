// The extent store under injected I/O faults: what a failed write leaves behind, what a failed
// or corrupted read reports, and that retried / short transfers stay invisible.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "io/engine_factory.h"
#include "io/fault_injection.h"
#include "storage/extent_store.h"
#include "storage_test_util.h"

namespace strata::storage {
namespace {

using testing::AlignedBuffer;
using testing::ScratchDir;

constexpr uint64_t kBlock = 256 << 10;  // engine block size: multi-block writes fail part-way

class ExtentStoreUnderFaults : public ::testing::TestWithParam<io::IoEngineKind> {
 protected:
  void SetUp() override {
    io::IoEngineOptions options;
    options.block_size = kBlock;
    options.queue_depth = 8;
    auto inner = io::make_io_engine(GetParam(), options);
    if (!inner && inner.status().code() == STRATA_E_UNSUPPORTED) {
      GTEST_SKIP() << inner.status().message();
    }
    ASSERT_TRUE(inner.is_ok()) << inner.status().message();
    inner_ = std::move(inner).value();
  }

  // Opens a store whose engine applies `spec`. The first extent allocated sits at offset 0, so
  // specs can aim at it with offset=. Call through ASSERT_NO_FATAL_FAILURE.
  void open(const std::string& spec, bool verify_checksums = true,
            uint64_t block_bytes = ExtentStoreOptions{}.block_bytes) {
    auto plan = io::FaultPlan::parse(spec);
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    auto engine = io::FaultInjectingEngine::wrap(std::move(inner_), std::move(plan).value());
    ASSERT_TRUE(engine.is_ok()) << engine.status().message();
    engine_ = std::move(engine).value();

    BackingDeviceOptions device;
    device.swap_dir = dir_.path();
    device.capacity_bytes = 16ull << 20;
    auto backing = BackingDevice::open(device);
    ASSERT_TRUE(backing.is_ok()) << backing.status().message();
    ExtentStoreOptions store_options;
    store_options.verify_checksums = verify_checksums;
    store_options.block_bytes = block_bytes;
    auto store = ExtentStore::open(std::move(backing).value(), *engine_, store_options);
    ASSERT_TRUE(store.is_ok()) << store.status().message();
    store_ = std::move(store).value();
  }

  // Writes `bytes` bytes generated from `seed`; returns the write's status.
  Status write(const Extent& extent, uint64_t bytes, uint64_t seed) {
    AlignedBuffer data(extent.capacity);
    data.fill_random(seed, bytes);
    return store_->write(extent, data.data(), bytes);
  }

  // Reads the extent and compares it with what write(seed) produced; returns the read's status.
  Status read_and_compare(const Extent& extent, uint64_t bytes, uint64_t seed) {
    AlignedBuffer expected(extent.capacity);
    expected.fill_random(seed, bytes);
    AlignedBuffer actual(extent.capacity);
    auto read = store_->read(extent, actual.data(), extent.capacity);
    if (!read) return std::move(read).take_status();
    EXPECT_EQ(*read, bytes);
    EXPECT_EQ(std::memcmp(actual.data(), expected.data(), bytes), 0) << "wrong bytes returned";
    return Status::ok();
  }

  ScratchDir dir_;
  std::unique_ptr<io::IoEngine> inner_;
  std::unique_ptr<io::FaultInjectingEngine> engine_;
  std::unique_ptr<ExtentStore> store_;  // destroyed before the engine
};

TEST_P(ExtentStoreUnderFaults, AFailedFirstWriteLeavesTheExtentUnwritten) {
  ASSERT_NO_FATAL_FAILURE(open("write:eio"));
  auto extent = store_->allocate(10000);
  ASSERT_TRUE(extent.is_ok());
  const Status written = write(*extent, 10000, 1);
  EXPECT_EQ(written.code(), STRATA_E_IO);
  EXPECT_NE(written.message().find("extent #"), std::string::npos) << written.message();
  EXPECT_GE(engine_->injected(io::FaultKind::kEio), 1u);

  EXPECT_EQ(store_->content_bytes(*extent).status().code(), STRATA_E_STATE);
  AlignedBuffer buffer(extent->capacity);
  auto read = store_->read(*extent, buffer.data(), buffer.size());
  EXPECT_EQ(read.status().code(), STRATA_E_STATE);
  EXPECT_NE(read.status().message().find("only write failed"), std::string::npos);
  const ExtentStoreStats stats = store_->stats();
  EXPECT_EQ(stats.write_errors, 1u);
  EXPECT_EQ(stats.writes, 0u);
  EXPECT_EQ(stats.bytes_written, 0u);
  // The space is still the caller's to free.
  EXPECT_TRUE(store_->free(*extent).is_ok());
}

TEST_P(ExtentStoreUnderFaults, NoSpaceFromTheDeviceIsReportedAsNoSpace) {
  ASSERT_NO_FATAL_FAILURE(open("write:enospc"));
  auto extent = store_->allocate(5000);
  ASSERT_TRUE(extent.is_ok());
  EXPECT_EQ(write(*extent, 5000, 1).code(), STRATA_E_NOSPACE);
  EXPECT_EQ(store_->content_bytes(*extent).status().code(), STRATA_E_STATE);
}

TEST_P(ExtentStoreUnderFaults, AFailedRewriteThatTouchedNothingKeepsThePreviousContent) {
  // The second write attempt to the extent's only block fails before doing any I/O.
  ASSERT_NO_FATAL_FAILURE(open("write:eio:every=2:count=1"));
  auto extent = store_->allocate(9000);
  ASSERT_TRUE(extent.is_ok());
  ASSERT_TRUE(write(*extent, 9000, 1).is_ok());
  EXPECT_EQ(write(*extent, 5000, 2).code(), STRATA_E_IO);
  EXPECT_EQ(*store_->content_bytes(*extent), 9000u) << "the old record stays";
  EXPECT_TRUE(read_and_compare(*extent, 9000, 1).is_ok());
}

TEST_P(ExtentStoreUnderFaults, AFailedRewriteThatOverwrotePartOfTheExtentIsDetected) {
  // Four blocks; the rewrite's second block fails, after its first block has replaced old bytes.
  ASSERT_NO_FATAL_FAILURE(open("write:eio:offset=262144-524288:every=2:count=1"));
  const uint64_t bytes = 4 * kBlock - 100;
  auto extent = store_->allocate(bytes);
  ASSERT_TRUE(extent.is_ok());
  ASSERT_EQ(extent->offset, 0u);
  ASSERT_TRUE(write(*extent, bytes, 1).is_ok());
  EXPECT_EQ(write(*extent, bytes, 2).code(), STRATA_E_IO);

  // Neither the old content (partly overwritten) nor the new one (incomplete) is returned.
  const Status read = read_and_compare(*extent, bytes, 1);
  EXPECT_EQ(read.code(), STRATA_E_CORRUPT);
  EXPECT_NE(read.message().find("last write to this extent failed"), std::string::npos)
      << read.message();

  // A successful write makes the extent whole again.
  ASSERT_TRUE(write(*extent, bytes, 3).is_ok());
  EXPECT_TRUE(read_and_compare(*extent, bytes, 3).is_ok());
}

TEST_P(ExtentStoreUnderFaults, WithoutChecksumsAFailedRewriteMakesTheContentUnreadable) {
  ASSERT_NO_FATAL_FAILURE(open("write:eio:every=2:count=1", /*verify_checksums=*/false));
  auto extent = store_->allocate(9000);
  ASSERT_TRUE(extent.is_ok());
  ASSERT_TRUE(write(*extent, 9000, 1).is_ok());
  EXPECT_EQ(write(*extent, 9000, 2).code(), STRATA_E_IO);
  // Nothing can tell what survived, so nothing is returned as if it were good.
  AlignedBuffer buffer(extent->capacity);
  auto read = store_->read(*extent, buffer.data(), buffer.size());
  EXPECT_EQ(read.status().code(), STRATA_E_STATE);
  EXPECT_NE(read.status().message().find("last write failed"), std::string::npos);
  ASSERT_TRUE(write(*extent, 9000, 3).is_ok());
  EXPECT_TRUE(read_and_compare(*extent, 9000, 3).is_ok());
}

// What a ranged read of store block `index` (kBlock bytes) returns, compared with `expected`.
Status read_block(ExtentStore& store, const Extent& extent, uint64_t index,
                  const AlignedBuffer& expected) {
  AlignedBuffer back(kBlock);
  auto read = store.read_range(extent, index * kBlock, back.data(), kBlock);
  if (!read) return std::move(read).take_status();
  EXPECT_EQ(std::memcmp(back.data(), expected.data() + index * kBlock, kBlock), 0)
      << "wrong bytes in block " << index;
  return Status::ok();
}

// Four store blocks of one engine block each, written whole from old_data; then the ranged
// write of blocks 1-2 from new_data, which fails at block 2 (the second write attempt there,
// the first being the whole write) after block 1 has been overwritten.
struct FailedRangedRewrite {
  static constexpr uint64_t kBytes = 4 * kBlock;
  Extent extent;
  AlignedBuffer old_data{kBytes};
  AlignedBuffer new_data{kBytes};
};

class ExtentStoreUnderRangedFaults : public ExtentStoreUnderFaults {
 protected:
  // Call through ASSERT_NO_FATAL_FAILURE.
  void fail_ranged_rewrite(bool verify_checksums, FailedRangedRewrite* out) {
    ASSERT_NO_FATAL_FAILURE(
        open("write:eio:offset=524288-786432:every=2:count=1", verify_checksums, kBlock));
    auto extent = store_->allocate(FailedRangedRewrite::kBytes);
    ASSERT_TRUE(extent.is_ok());
    ASSERT_EQ(extent->offset, 0u);
    out->extent = *extent;
    out->old_data.fill_random(1, FailedRangedRewrite::kBytes);
    out->new_data.fill_random(2, FailedRangedRewrite::kBytes);
    ASSERT_TRUE(store_->write(*extent, out->old_data.data(), FailedRangedRewrite::kBytes).is_ok());
    const Status failed = store_->write_range(*extent, kBlock, out->new_data.data() + kBlock,
                                              2 * kBlock, FailedRangedRewrite::kBytes);
    EXPECT_EQ(failed.code(), STRATA_E_IO);
    EXPECT_NE(failed.message().find("bytes [262144, 786432)"), std::string::npos)
        << failed.message();
    EXPECT_EQ(store_->stats().write_errors, 1u);
  }
};

TEST_P(ExtentStoreUnderRangedFaults, AFailedRangedWriteKeepsThePreviousRecordOfItsBlocksOnly) {
  FailedRangedRewrite torn;
  ASSERT_NO_FATAL_FAILURE(fail_ranged_rewrite(/*verify_checksums=*/true, &torn));
  auto length = store_->content_bytes(torn.extent);
  ASSERT_TRUE(length.is_ok()) << length.status().message();
  EXPECT_EQ(*length, FailedRangedRewrite::kBytes) << "the records, length included, stay";
  // Blocks the write did not cover, and block 2 that it never reached, hold the old bytes.
  for (uint64_t index : {0, 2, 3}) {
    EXPECT_TRUE(read_block(*store_, torn.extent, index, torn.old_data).is_ok()) << index;
  }
  // Block 1 holds new bytes under its old record: detected, never returned.
  const Status read = read_block(*store_, torn.extent, 1, torn.old_data);
  EXPECT_EQ(read.code(), STRATA_E_CORRUPT);
  EXPECT_NE(read.message().find("block [262144, 524288)"), std::string::npos) << read.message();
  EXPECT_NE(read.message().find("last write to this extent failed"), std::string::npos)
      << read.message();
  EXPECT_EQ(read_and_compare(torn.extent, FailedRangedRewrite::kBytes, 1).code(), STRATA_E_CORRUPT);

  // Writing block 1 again makes the extent whole: old, new, old, old.
  ASSERT_TRUE(store_
                  ->write_range(torn.extent, kBlock, torn.new_data.data() + kBlock, kBlock,
                                FailedRangedRewrite::kBytes)
                  .is_ok());
  std::memcpy(torn.old_data.data() + kBlock, torn.new_data.data() + kBlock, kBlock);
  for (uint64_t index = 0; index < 4; ++index) {
    EXPECT_TRUE(read_block(*store_, torn.extent, index, torn.old_data).is_ok()) << index;
  }
}

TEST_P(ExtentStoreUnderRangedFaults,
       WithoutChecksumsAFailedRangedWriteMakesOnlyItsBlocksUnreadable) {
  FailedRangedRewrite torn;
  ASSERT_NO_FATAL_FAILURE(fail_ranged_rewrite(/*verify_checksums=*/false, &torn));
  EXPECT_EQ(store_->content_bytes(torn.extent).status().code(), STRATA_E_STATE)
      << "a whole read would be refused";
  for (uint64_t index : {1, 2}) {
    const Status read = read_block(*store_, torn.extent, index, torn.old_data);
    EXPECT_EQ(read.code(), STRATA_E_STATE) << index;
    EXPECT_NE(read.message().find("last write failed"), std::string::npos) << read.message();
  }
  for (uint64_t index : {0, 3}) {
    EXPECT_TRUE(read_block(*store_, torn.extent, index, torn.old_data).is_ok()) << index;
  }
  AlignedBuffer whole(FailedRangedRewrite::kBytes);
  EXPECT_EQ(store_->read(torn.extent, whole.data(), whole.size()).status().code(), STRATA_E_STATE);

  // A write over them succeeds (the fault fired once): old, new, new, old.
  ASSERT_TRUE(store_
                  ->write_range(torn.extent, kBlock, torn.new_data.data() + kBlock, 2 * kBlock,
                                FailedRangedRewrite::kBytes)
                  .is_ok());
  std::memcpy(torn.old_data.data() + kBlock, torn.new_data.data() + kBlock, 2 * kBlock);
  for (uint64_t index = 0; index < 4; ++index) {
    EXPECT_TRUE(read_block(*store_, torn.extent, index, torn.old_data).is_ok()) << index;
  }
}

TEST_P(ExtentStoreUnderFaults, AFailedReadIsAnIoErrorAndTheContentSurvives) {
  ASSERT_NO_FATAL_FAILURE(open("read:eio:count=1"));
  auto extent = store_->allocate(20000);
  ASSERT_TRUE(extent.is_ok());
  ASSERT_TRUE(write(*extent, 20000, 1).is_ok());
  EXPECT_EQ(read_and_compare(*extent, 20000, 1).code(), STRATA_E_IO);
  EXPECT_EQ(store_->stats().read_errors, 1u);
  EXPECT_TRUE(read_and_compare(*extent, 20000, 1).is_ok());
}

TEST_P(ExtentStoreUnderFaults, BytesCorruptedInTransitAreCaught) {
  ASSERT_NO_FATAL_FAILURE(open("read:corrupt:bytes=3:count=1"));
  const uint64_t bytes = 3 * 4096;  // no padding: any flipped byte is content
  auto extent = store_->allocate(bytes);
  ASSERT_TRUE(extent.is_ok());
  ASSERT_TRUE(write(*extent, bytes, 1).is_ok());
  const Status read = read_and_compare(*extent, bytes, 1);
  EXPECT_EQ(read.code(), STRATA_E_CORRUPT);
  EXPECT_EQ(engine_->injected(io::FaultKind::kCorrupt), 1u);
  EXPECT_EQ(store_->stats().checksum_failures, 1u);
  EXPECT_TRUE(read_and_compare(*extent, bytes, 1).is_ok()) << "the device copy is intact";
}

TEST_P(ExtentStoreUnderFaults, RetriedAndShortTransfersAreInvisible) {
  ASSERT_NO_FATAL_FAILURE(open("any:short:every=2;any:eagain:every=3"));
  const uint64_t sizes[] = {1, 4097, 100000, 3 * kBlock + 5};
  std::vector<Extent> extents;
  for (uint64_t i = 0; i < std::size(sizes); ++i) {
    auto extent = store_->allocate(sizes[i]);
    ASSERT_TRUE(extent.is_ok());
    ASSERT_TRUE(write(*extent, sizes[i], 10 + i).is_ok());
    extents.push_back(*extent);
  }
  for (uint64_t i = 0; i < std::size(sizes); ++i) {
    EXPECT_TRUE(read_and_compare(extents[i], sizes[i], 10 + i).is_ok());
  }
  EXPECT_GT(engine_->injected(io::FaultKind::kShort), 0u);
  EXPECT_GT(engine_->injected(io::FaultKind::kEagain), 0u);
}

// Both suites run on both engines.
const auto kEngines = ::testing::Values(io::IoEngineKind::kPsync, io::IoEngineKind::kUring);
std::string engine_name(const ::testing::TestParamInfo<io::IoEngineKind>& param_info) {
  return io::io_engine_kind_name(param_info.param);
}
INSTANTIATE_TEST_SUITE_P(Engines, ExtentStoreUnderFaults, kEngines, engine_name);
INSTANTIATE_TEST_SUITE_P(Engines, ExtentStoreUnderRangedFaults, kEngines, engine_name);

}  // namespace
}  // namespace strata::storage
