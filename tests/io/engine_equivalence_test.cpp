// psync and io_uring are interchangeable: the same request sequence leaves the same bytes on
// disk, and each engine reads back exactly what the other wrote.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "io_test_util.h"

namespace strata::io {
namespace {

using testing::AlignedBuffer;
using testing::ScratchFile;
using testing::small_options;

struct Op {
  uint64_t offset;
  uint64_t length;
  uint64_t seed;
};

std::vector<Op> random_ops(uint64_t file_bytes, int count) {
  std::mt19937_64 random(42);
  std::vector<Op> ops;
  for (int i = 0; i < count; ++i) {
    const uint64_t pages = file_bytes / 4096;
    const uint64_t length_pages = 1 + random() % 96;  // up to 384 KiB, overlapping ranges
    const uint64_t first = random() % (pages - length_pages);
    ops.push_back({first * 4096, length_pages * 4096, random()});
  }
  return ops;
}

TEST(EngineEquivalence, PsyncAndUringLeaveIdenticalBytesAndReadEachOthersFiles) {
  if (!testing::uring_support().available) {
    GTEST_SKIP() << "io_uring unavailable: " << testing::uring_support().reason;
  }
  constexpr uint64_t kFileBytes = 4 << 20;
  const auto options = small_options(64 * 1024, 8, 2);
  auto psync = make_io_engine(IoEngineKind::kPsync, options);
  auto uring = make_io_engine(IoEngineKind::kUring, options);
  ASSERT_TRUE(psync.is_ok() && uring.is_ok());
  ScratchFile psync_file(kFileBytes);
  ScratchFile uring_file(kFileBytes);
  const uint32_t p_for_p = (*psync)->register_file(psync_file.fd()).value();
  const uint32_t p_for_u = (*psync)->register_file(uring_file.fd()).value();
  const uint32_t u_for_u = (*uring)->register_file(uring_file.fd()).value();
  const uint32_t u_for_p = (*uring)->register_file(psync_file.fd()).value();

  // The same overlapping writes through each engine, and a model of what the file must hold.
  std::vector<uint8_t> model(kFileBytes, 0);
  for (const Op& op : random_ops(kFileBytes, 120)) {
    AlignedBuffer data(op.length);
    data.fill_random(op.seed);
    ASSERT_TRUE(write_sync(**psync, p_for_p, data.data(), op.length, op.offset).is_ok());
    ASSERT_TRUE(write_sync(**uring, u_for_u, data.data(), op.length, op.offset).is_ok());
    std::memcpy(model.data() + op.offset, data.data(), op.length);
  }

  // Each engine reads the other's file; both equal the model.
  AlignedBuffer by_uring(kFileBytes);
  AlignedBuffer by_psync(kFileBytes);
  ASSERT_TRUE(read_sync(**uring, u_for_p, by_uring.data(), kFileBytes, 0).is_ok());
  ASSERT_TRUE(read_sync(**psync, p_for_u, by_psync.data(), kFileBytes, 0).is_ok());
  EXPECT_EQ(std::memcmp(by_uring.data(), model.data(), kFileBytes), 0);
  EXPECT_EQ(std::memcmp(by_psync.data(), model.data(), kFileBytes), 0);
}

}  // namespace
}  // namespace strata::io
