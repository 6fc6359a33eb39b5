// What the OS charges the process, read and sampled (memory/host_memory.h).
#include "memory/host_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace strata::memory {
namespace {

TEST(ProcMemory, ReadsTheKernelsCountersAndSeesAnonymousMemoryGrow) {
  Result<ProcMemory> before = read_proc_memory();
  ASSERT_TRUE(before.is_ok()) << before.status().message();
  EXPECT_GT(before->vm_rss, 0u);
  EXPECT_GE(before->vm_hwm, before->vm_rss);
  EXPECT_EQ(before->vm_rss, before->rss_anon + before->rss_file + before->rss_shmem);

  constexpr size_t kBytes = 64 << 20;
  std::vector<char> block(kBytes);
  std::memset(block.data(), 1, kBytes);
  Result<ProcMemory> after = read_proc_memory();
  ASSERT_TRUE(after.is_ok());
  // The kernel batches RSS updates per thread; allow a few MiB of slack.
  EXPECT_GE(after->rss_anon + (4 << 20), before->rss_anon + kBytes);
  EXPECT_GE(after->vm_hwm, after->vm_rss);
}

TEST(HostMemorySampler, TracksThePeakOfHostMemory) {
  HostMemorySampler sampler({std::chrono::milliseconds(1), nullptr});
  const uint64_t start = sampler.peak_host_bytes_excluding_device();
  EXPECT_GT(start, 0u);
  {
    constexpr size_t kBytes = 96 << 20;
    std::vector<char> block(kBytes);
    std::memset(block.data(), 1, kBytes);
    sampler.sample_now();
  }
  EXPECT_GE(sampler.peak_host_bytes_excluding_device() + (4 << 20), start + (96 << 20));
  EXPECT_GE(sampler.samples(), 2u);
}

}  // namespace
}  // namespace strata::memory
