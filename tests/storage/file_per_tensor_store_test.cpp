// FilePerTensorStore: ZeRO-Infinity's layout for the baseline - a file per tensor, opened,
// stat'ed and closed around every request - with the same content rules as the extent store.
#include "storage/file_per_tensor_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <vector>

#include "common/align.h"
#include "storage_test_util.h"

namespace strata::storage {
namespace {

namespace fs = std::filesystem;
using testing::AlignedBuffer;
using testing::ScratchDir;

// Waits for one ExtentIo's completion.
struct Completion {
  ExtentIo io;
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;

  Completion() {
    io.context = this;
    io.on_complete = [](ExtentIo*, void* context) {
      auto* c = static_cast<Completion*>(context);
      std::lock_guard lock(c->mutex);
      c->done = true;
      c->done_cv.notify_all();
    };
  }
  Status wait() {
    std::unique_lock lock(mutex);
    done_cv.wait(lock, [&] { return done; });
    return io.status;
  }
};

// Runs one asynchronous call to completion; returns the bytes it moved.
template <typename Submit>
Result<uint64_t> run(Submit submit) {
  Completion c;
  STRATA_TRY(submit(&c.io));
  STRATA_TRY(c.wait());
  return c.io.bytes;
}

Status write_sync(FilePerTensorStore& store, const Extent& e, const void* data, uint64_t bytes) {
  return run([&](ExtentIo* io) { return store.write_async(e, data, bytes, io); }).status();
}

Result<uint64_t> read_sync(FilePerTensorStore& store, const Extent& e, void* data,
                           uint64_t buffer_bytes) {
  return run([&](ExtentIo* io) { return store.read_async(e, data, buffer_bytes, io); });
}

Status write_range_sync(FilePerTensorStore& store, const Extent& e, uint64_t offset,
                        const void* data, uint64_t bytes, uint64_t content_bytes) {
  return run([&](ExtentIo* io) {
           return store.write_range_async(e, offset, data, bytes, content_bytes, io);
         })
      .status();
}

Result<uint64_t> read_range_sync(FilePerTensorStore& store, const Extent& e, uint64_t offset,
                                 void* data, uint64_t bytes) {
  return run([&](ExtentIo* io) { return store.read_range_async(e, offset, data, bytes, io); });
}

std::unique_ptr<FilePerTensorStore> open_store(const ScratchDir& dir, uint64_t capacity,
                                               uint32_t threads = 1) {
  FilePerTensorOptions options;
  options.dir = dir.path();
  options.capacity_bytes = capacity;
  options.threads = threads;
  auto store = FilePerTensorStore::open(options);
  EXPECT_TRUE(store.is_ok()) << store.status().message();
  return store ? std::move(store.value()) : nullptr;
}

TEST(FilePerTensorStore, EachTensorGetsItsOwnPrivateFileAndReadsBackExactly) {
  ScratchDir dir;
  auto store = open_store(dir, 64 << 20);
  ASSERT_NE(store, nullptr);
  const std::vector<uint64_t> sizes = {1, 4095, 4097, (1 << 20) + 3, (3 << 20) + 123};
  std::vector<Extent> extents;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto e = store->allocate(sizes[i]);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    AlignedBuffer data(align_up(sizes[i], 4096));
    data.fill_random(i, sizes[i]);
    ASSERT_TRUE(write_sync(*store, *e, data.data(), sizes[i]).is_ok());
    extents.push_back(*e);
  }
  // One file per tensor, private to the user, in a private directory.
  struct stat st {};
  ASSERT_EQ(::stat(store->directory().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(static_cast<size_t>(std::distance(fs::directory_iterator(store->directory()),
                                              fs::directory_iterator())),
            sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(::stat(store->file_path(extents[i]).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), align_up(sizes[i], 4096));
    AlignedBuffer expected(align_up(sizes[i], 4096));
    expected.fill_random(i, sizes[i]);
    AlignedBuffer back(align_up(sizes[i], 4096));
    auto n = read_sync(*store, extents[i], back.data(), back.size());
    ASSERT_TRUE(n.is_ok()) << n.status().message();
    EXPECT_EQ(*n, sizes[i]);
    EXPECT_EQ(std::memcmp(back.data(), expected.data(), sizes[i]), 0) << "size " << sizes[i];
  }
  const ExtentStoreStats stats = store->stats();
  EXPECT_EQ(stats.writes, sizes.size());
  EXPECT_EQ(stats.reads, sizes.size());
  EXPECT_EQ(stats.extents, sizes.size());
}

TEST(FilePerTensorStore, FreeRemovesTheFileAndCloseRemovesTheDirectory) {
  ScratchDir dir;
  auto store = open_store(dir, 8 << 20);
  ASSERT_NE(store, nullptr);
  auto e = store->allocate(10000);
  ASSERT_TRUE(e.is_ok());
  AlignedBuffer data(align_up(10000, 4096));
  ASSERT_TRUE(write_sync(*store, *e, data.data(), 10000).is_ok());
  const std::string file = store->file_path(*e);
  EXPECT_TRUE(fs::exists(file));
  ASSERT_TRUE(store->free(*e).is_ok());
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(store->free(*e).code(), STRATA_E_STATE) << "a freed handle is refused";
  auto kept = store->allocate(5000);
  ASSERT_TRUE(kept.is_ok());
  ASSERT_TRUE(write_sync(*store, *kept, data.data(), 5000).is_ok());
  ASSERT_TRUE(store->close().is_ok());
  EXPECT_TRUE(dir.entries().empty()) << "files left behind";
}

TEST(FilePerTensorStore, CapacityBoundsWhatTheFilesMayHold) {
  ScratchDir dir;
  auto store = open_store(dir, 1 << 20);
  ASSERT_NE(store, nullptr);
  auto a = store->allocate(600 << 10);
  ASSERT_TRUE(a.is_ok());
  auto b = store->allocate(600 << 10);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), STRATA_E_NOSPACE);
  EXPECT_NE(b.status().message().find("nvme_capacity_bytes"), std::string::npos)
      << b.status().message();
  ASSERT_TRUE(store->free(*a).is_ok());
  EXPECT_TRUE(store->allocate(600 << 10).is_ok()) << "freed space is available again";
}

TEST(FilePerTensorStore, ReadingBeforeAnyWriteAndBadBuffersAreErrors) {
  ScratchDir dir;
  auto store = open_store(dir, 8 << 20);
  ASSERT_NE(store, nullptr);
  auto e = store->allocate(8192);
  ASSERT_TRUE(e.is_ok());
  AlignedBuffer buffer(8192);
  Completion c;
  EXPECT_EQ(store->read_async(*e, buffer.data(), buffer.size(), &c.io).code(), STRATA_E_STATE);
  EXPECT_EQ(store->write_async(*e, buffer.data() + 1, 100, &c.io).code(), STRATA_E_INVALID);
  EXPECT_EQ(store->write_async(*e, buffer.data(), 8193, &c.io).code(), STRATA_E_INVALID);
  ASSERT_TRUE(write_sync(*store, *e, buffer.data(), 8192).is_ok());
  EXPECT_EQ(store->read_async(*e, buffer.data(), 4096, &c.io).code(), STRATA_E_INVALID)
      << "a buffer shorter than the content";
  Extent forged = *e;
  forged.id += 100;
  EXPECT_EQ(store->read_async(forged, buffer.data(), buffer.size(), &c.io).code(), STRATA_E_STATE);
}

TEST(FilePerTensorStore, ATruncatedFileIsCorruptNotShortData) {
  ScratchDir dir;
  auto store = open_store(dir, 8 << 20);
  ASSERT_NE(store, nullptr);
  auto e = store->allocate(3 * 4096);
  ASSERT_TRUE(e.is_ok());
  AlignedBuffer buffer(3 * 4096);
  buffer.fill_random(7, buffer.size());
  ASSERT_TRUE(write_sync(*store, *e, buffer.data(), buffer.size()).is_ok());
  ASSERT_EQ(::truncate(store->file_path(*e).c_str(), 4096), 0);
  auto n = read_sync(*store, *e, buffer.data(), buffer.size());
  ASSERT_FALSE(n.is_ok());
  EXPECT_EQ(n.status().code(), STRATA_E_CORRUPT) << n.status().message();
}

TEST(FilePerTensorStore, ManyThreadsKeepEveryTensorsBytes) {
  ScratchDir dir;
  auto store = open_store(dir, 64 << 20, 4);
  ASSERT_NE(store, nullptr);
  constexpr int kTensors = 48;
  constexpr uint64_t kBytes = 3 * 4096 + 100;
  std::vector<Extent> extents;
  std::vector<AlignedBuffer> buffers;
  std::vector<std::unique_ptr<Completion>> writes;
  buffers.reserve(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    auto e = store->allocate(kBytes);
    ASSERT_TRUE(e.is_ok());
    extents.push_back(*e);
    buffers.emplace_back(align_up(kBytes, 4096));
    buffers.back().fill_random(100 + i, kBytes);
    writes.push_back(std::make_unique<Completion>());
    ASSERT_TRUE(store->write_async(*e, buffers.back().data(), kBytes, &writes.back()->io).is_ok());
  }
  for (auto& w : writes) ASSERT_TRUE(w->wait().is_ok());
  for (int i = 0; i < kTensors; ++i) {
    AlignedBuffer back(align_up(kBytes, 4096));
    auto n = read_sync(*store, extents[i], back.data(), back.size());
    ASSERT_TRUE(n.is_ok());
    EXPECT_EQ(std::memcmp(back.data(), buffers[i].data(), kBytes), 0) << "tensor " << i;
  }
}

TEST(FilePerTensorStore, RangedWritesAndReadsRoundTripAtTheirOffsetsInTheTensorsFile) {
  ScratchDir dir;
  auto store = open_store(dir, 64 << 20);
  ASSERT_NE(store, nullptr);
  const uint64_t block = store->block_bytes();
  EXPECT_EQ(block, 1u << 20);
  const uint64_t content = 2 * block + block / 2 + 5;
  auto e = store->allocate(content);
  ASSERT_TRUE(e.is_ok());
  AlignedBuffer image(e->capacity);
  image.fill_random(11, e->capacity);

  // The middle block first: the file starts with a hole, which is not content.
  ASSERT_TRUE(write_range_sync(*store, *e, block, image.data() + block, block, content).is_ok());
  AlignedBuffer back(e->capacity);
  EXPECT_EQ(read_range_sync(*store, *e, 0, back.data(), block).status().code(), STRATA_E_STATE);
  ASSERT_TRUE(write_range_sync(*store, *e, 2 * block, image.data() + 2 * block, content - 2 * block,
                               content)
                  .is_ok());
  ASSERT_TRUE(write_range_sync(*store, *e, 0, image.data(), block, content).is_ok());

  auto n = read_range_sync(*store, *e, block, back.data(), content - block);
  ASSERT_TRUE(n.is_ok()) << n.status().message();
  EXPECT_EQ(*n, content - block);
  EXPECT_EQ(std::memcmp(back.data(), image.data() + block, content - block), 0);
  n = read_sync(*store, *e, back.data(), back.size());
  ASSERT_TRUE(n.is_ok()) << n.status().message();
  EXPECT_EQ(*n, content);
  EXPECT_EQ(std::memcmp(back.data(), image.data(), content), 0);
  struct stat st {};
  ASSERT_EQ(::stat(store->file_path(*e).c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), align_up(content, 4096));

  // The same argument rules as the extent store.
  Completion c;
  EXPECT_EQ(store->write_range_async(*e, 4096, image.data(), block, content, &c.io).code(),
            STRATA_E_INVALID);
  EXPECT_EQ(store->read_range_async(*e, block, back.data(), content, &c.io).code(),
            STRATA_E_INVALID);
  EXPECT_EQ(store->read_range_async(*e, 0, back.data(), block / 2, &c.io).code(), STRATA_E_INVALID);
  const ExtentStoreStats stats = store->stats();
  EXPECT_EQ(stats.writes, 3u);
  EXPECT_EQ(stats.bytes_written, content);
  EXPECT_EQ(stats.reads, 2u);
}

TEST(FilePerTensorStore, DisjointRangedWritesToANewFileRunTogether) {
  ScratchDir dir;
  auto store = open_store(dir, 64 << 20, /*threads=*/4);
  ASSERT_NE(store, nullptr);
  const uint64_t block = store->block_bytes();
  constexpr int kChunks = 4;
  const uint64_t content = kChunks * block;
  auto e = store->allocate(content);
  ASSERT_TRUE(e.is_ok());
  AlignedBuffer image(content);
  image.fill_random(12, content);
  // All in flight at once: the first creates the file, the others wait for it on their threads.
  std::vector<std::unique_ptr<Completion>> writes;
  for (int i = 0; i < kChunks; ++i) {
    writes.push_back(std::make_unique<Completion>());
    const uint64_t offset = static_cast<uint64_t>(i) * block;
    ASSERT_TRUE(store
                    ->write_range_async(*e, offset, image.data() + offset, block, content,
                                        &writes.back()->io)
                    .is_ok());
  }
  for (auto& w : writes) {
    const Status written = w->wait();
    EXPECT_TRUE(written.is_ok()) << written.message();
  }
  AlignedBuffer back(content);
  auto n = read_sync(*store, *e, back.data(), back.size());
  ASSERT_TRUE(n.is_ok()) << n.status().message();
  EXPECT_EQ(std::memcmp(back.data(), image.data(), content), 0);
}

TEST(FilePerTensorStore, AMissingDirectoryOrBadThreadCountIsRefused) {
  FilePerTensorOptions options;
  options.dir = "/nonexistent/strata-file-per-tensor";
  options.capacity_bytes = 1 << 20;
  EXPECT_EQ(FilePerTensorStore::open(options).status().code(), STRATA_E_INVALID);
  ScratchDir dir;
  options.dir = dir.path();
  options.threads = 0;
  EXPECT_EQ(FilePerTensorStore::open(options).status().code(), STRATA_E_INVALID);
  options.threads = 1;
  options.capacity_bytes = uint64_t{1} << 60;
  EXPECT_EQ(FilePerTensorStore::open(options).status().code(), STRATA_E_NOSPACE);
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace strata::storage
