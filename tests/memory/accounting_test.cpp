#include "memory/accounting.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "memory/device.h"

namespace strata::memory {
namespace {

TEST(Accounting, CountsReservedInUseAndPeaksPerTierAndKind) {
  Accounting a;
  a.reserve(Tier::kPinned, 10000);
  a.use(Tier::kPinned, TensorKind::kParameter, 3000);
  a.use(Tier::kPinned, TensorKind::kGradient, 2000);
  a.unuse(Tier::kPinned, TensorKind::kParameter, 3000);
  a.use(Tier::kPinned, TensorKind::kParameter, 1000);

  const TierCounters pinned = a.tier(Tier::kPinned);
  EXPECT_EQ(pinned.reserved_bytes, 10000u);
  EXPECT_EQ(pinned.in_use_bytes, 3000u);
  EXPECT_EQ(pinned.peak_in_use_bytes, 5000u);
  EXPECT_EQ(pinned.peak_reserved_bytes, 10000u);
  EXPECT_EQ(a.kind(Tier::kPinned, TensorKind::kParameter).in_use_bytes, 1000u);
  EXPECT_EQ(a.kind(Tier::kPinned, TensorKind::kParameter).peak_in_use_bytes, 3000u);
  EXPECT_EQ(a.kind(Tier::kPinned, TensorKind::kGradient).peak_in_use_bytes, 2000u);
  // Other tiers untouched.
  EXPECT_EQ(a.tier(Tier::kDevice).reserved_bytes, 0u);
  EXPECT_EQ(a.kind(Tier::kDevice, TensorKind::kParameter).in_use_bytes, 0u);

  a.reset_peaks();
  EXPECT_EQ(a.tier(Tier::kPinned).peak_in_use_bytes, 3000u);
  EXPECT_EQ(a.kind(Tier::kPinned, TensorKind::kParameter).peak_in_use_bytes, 1000u);
}

TEST(Accounting, ConcurrentUpdatesAreExact) {
  Accounting a;
  constexpr int kThreads = 4;
  constexpr int kIterations = 100000;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&a, t] {
      const auto kind = static_cast<TensorKind>(t % kTensorKindCount);
      for (int i = 0; i < kIterations; ++i) {
        a.reserve(Tier::kDevice, 7);
        a.use(Tier::kDevice, kind, 5);
        if (i % 2 == 1) {
          a.unuse(Tier::kDevice, kind, 5);
          a.unreserve(Tier::kDevice, 7);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const TierCounters d = a.tier(Tier::kDevice);
  EXPECT_EQ(d.reserved_bytes, uint64_t{kThreads} * kIterations / 2 * 7);
  EXPECT_EQ(d.in_use_bytes, uint64_t{kThreads} * kIterations / 2 * 5);
  EXPECT_GE(d.peak_in_use_bytes, d.in_use_bytes);
  EXPECT_LE(d.peak_in_use_bytes, d.in_use_bytes + uint64_t{kThreads} * 5);
}

TEST(Accounting, ScopedUseReleasesOnDestruction) {
  Accounting a;
  {
    ScopedUse use(&a, Tier::kHost, TensorKind::kOther, 4096);
    EXPECT_EQ(a.tier(Tier::kHost).in_use_bytes, 4096u);
    ScopedUse moved = std::move(use);
    EXPECT_EQ(a.tier(Tier::kHost).in_use_bytes, 4096u);
  }
  EXPECT_EQ(a.tier(Tier::kHost).in_use_bytes, 0u);
  EXPECT_EQ(a.tier(Tier::kHost).peak_in_use_bytes, 4096u);
}

TEST(Accounting, NvmeTrafficCounters) {
  Accounting a;
  a.add_nvme_read(1 << 20);
  a.add_nvme_written(3 << 20);
  a.add_nvme_read(1);
  EXPECT_EQ(a.nvme_bytes_read(), (1u << 20) + 1);
  EXPECT_EQ(a.nvme_bytes_written(), 3u << 20);
}

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

TEST(FillStats, FillsEveryTierAndTheOsFigures) {
  Accounting a;
  a.reserve(Tier::kPinned, 8192);
  a.use(Tier::kPinned, TensorKind::kAdamM, 5000);
  a.reserve(Tier::kNvme, 1 << 30);
  a.use(Tier::kNvme, TensorKind::kParameter, 1 << 20);
  a.add_nvme_written(12345);
  strata_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(fill_stats(a, nullptr, nullptr, &s), STRATA_OK);
  EXPECT_EQ(s.struct_size, sizeof s);
  EXPECT_EQ(s.pinned.reserved_bytes, 8192u);
  EXPECT_EQ(s.pinned.in_use_bytes, 5000u);
  EXPECT_EQ(s.pinned.kinds[STRATA_KIND_ADAM_M].in_use_bytes, 5000u);
  EXPECT_EQ(s.pinned.kinds[STRATA_KIND_ADAM_M].peak_in_use_bytes, 5000u);
  EXPECT_EQ(s.nvme.reserved_bytes, 1u << 30);
  EXPECT_EQ(s.nvme.kinds[STRATA_KIND_PARAMETER].in_use_bytes, 1u << 20);
  EXPECT_EQ(s.nvme_bytes_written, 12345u);
  EXPECT_GT(s.os_rss_bytes, 0u);
  EXPECT_GE(s.os_peak_rss_bytes, s.os_rss_bytes);
  EXPECT_GT(s.os_host_bytes_excluding_emulated_device, 0u);
  EXPECT_GE(s.os_peak_host_bytes_excluding_emulated_device,
            s.os_host_bytes_excluding_emulated_device);
  EXPECT_EQ(s.emulated_device_resident_bytes, 0u);
}

TEST(FillStats, FillsOnlyWhatAnOlderSmallerStructHasAndRejectsTooSmallOnes) {
  Accounting a;
  a.reserve(Tier::kHost, 100);
  // A caller compiled against a future, larger header: fields past ours are left alone.
  struct Larger {
    strata_stats stats;
    uint64_t future_field;
  } larger{};
  larger.stats.struct_size = sizeof larger;
  larger.future_field = 0xfeed;
  ASSERT_EQ(fill_stats(a, nullptr, nullptr, &larger.stats), STRATA_OK);
  EXPECT_EQ(larger.stats.host.reserved_bytes, 100u);
  EXPECT_EQ(larger.future_field, 0xfeedu);

  strata_stats s{};
  s.struct_size = offsetof(strata_stats, host);  // a struct with no room for the first version
  EXPECT_EQ(fill_stats(a, nullptr, nullptr, &s), STRATA_E_INVALID);
  EXPECT_EQ(fill_stats(a, nullptr, nullptr, nullptr), STRATA_E_INVALID);
}

}  // namespace
}  // namespace strata::memory
