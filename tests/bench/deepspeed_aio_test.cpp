// The DeepSpeed baseline's aio handle (bench/finetune/deepspeed_aio.h) moving a file as
// DeepSpeed's does.
#include "finetune/deepspeed_aio.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/test_dir.h"

namespace strata::bench::finetune {
namespace {

struct Aligned {
  explicit Aligned(size_t n) : bytes(n) {
    data = static_cast<std::byte*>(
        ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~Aligned() { ::munmap(data, bytes); }
  std::byte* data;
  size_t bytes;
};

TEST(DeepSpeedAio, AFileWrittenInBlocksAcrossThreadsReadsBackExactly) {
  const auto dir = strata::testing::scratch_dir("deepspeed-aio");
  for (uint32_t threads : {1u, 3u}) {
    SCOPED_TRACE(threads);
    int done = 0;
    AioHandle::Options o;
    o.name = "test";
    o.block_bytes = 64 << 10;
    o.queue_depth = 4;
    o.threads = threads;
    auto handle = AioHandle::create(o, [&](const std::string&, bool, const std::string&, uint64_t,
                                           uint64_t, uint64_t) { ++done; });
    ASSERT_TRUE(handle.is_ok()) << handle.status().message();
    const size_t n = (1 << 20) + 3 * 4096;  // not a multiple of the block
    Aligned out(n), in(n);
    for (size_t i = 0; i < n; ++i) out.data[i] = static_cast<std::byte>(i * 7 + threads);
    const std::string path = (dir / ("f" + std::to_string(threads))).string();
    Result<uint64_t> w = (*handle)->write(path, out.data, n);
    ASSERT_TRUE(w.is_ok()) << w.status().message();
    ASSERT_TRUE((*handle)->wait(*w).is_ok());
    Result<uint64_t> r = (*handle)->read(path, in.data, n);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    ASSERT_TRUE((*handle)->wait(*r).is_ok());
    EXPECT_EQ(std::memcmp(out.data, in.data, n), 0);
    EXPECT_EQ((*handle)->bytes_written(), n);
    EXPECT_EQ((*handle)->bytes_read(), n);
    EXPECT_EQ(done, 2);
    // DeepSpeed stats the file before a read: a size that differs is refused, not half-read.
    Result<uint64_t> wrong = (*handle)->read(path, in.data, n - 4096);
    EXPECT_FALSE(wrong.is_ok());
    EXPECT_EQ(wrong.status().code(), STRATA_E_CORRUPT);
    // O_DIRECT needs aligned sizes and buffers.
    EXPECT_EQ((*handle)->read(path, in.data + 1, n).status().code(), STRATA_E_INVALID);
    EXPECT_FALSE((*handle)->read((dir / "missing").string(), in.data, n).is_ok());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::bench::finetune
