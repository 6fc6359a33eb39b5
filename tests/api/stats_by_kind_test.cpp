// strata_get_stats counts every tensor under its own kind on every tier it occupies (issue 14:
// a parameter used to be counted as "other"): one tensor of every kind, each of its own size,
// acquired on the device and on the pinned tier and resting on NVMe, every counter checked. And
// the drive's busy time over the same transfers (nvme_read_busy_us, nvme_write_busy_us,
// nvme_busy_us) follows the header's rules.
#include <gtest/gtest.h>
#include <strata/strata.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "model/test_dir.h"

namespace {

namespace fs = std::filesystem;
constexpr uint64_t kKiB = 1024;
constexpr int kKinds = STRATA_KIND_OTHER + 1;
// The streaming staging buffers of a 16 MiB pinned budget, automatic (strata.h,
// stream_chunk_bytes; docs/memory.md): 4 per direction, the 4 MiB chunk halved until they take
// at most a quarter of the budget, 512 KiB. Pinned memory in use of kind OTHER from creation on.
constexpr uint64_t kStaging = 2 * 4 * 512 * 1024;

class StatsByKind : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = strata::testing::scratch_dir("stats-by-kind").string();
    strata_config c;
    strata_config_init(&c);
    c.nvme_path = dir_.c_str();
    c.nvme_capacity_bytes = 64ull << 20;
    c.pinned_budget_bytes = 16ull << 20;
    c.device_budget_bytes = 16ull << 20;
    c.device_backend = STRATA_DEVICE_EMULATED;
    ASSERT_EQ(strata_runtime_create(&c, &rt_), STRATA_OK) << strata_last_error(nullptr);
  }
  void TearDown() override {
    if (rt_ != nullptr) EXPECT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
    fs::remove_all(dir_);
  }
  strata_stats stats() {
    strata_stats st{};
    st.struct_size = sizeof st;
    EXPECT_EQ(strata_get_stats(rt_, &st), STRATA_OK);
    return st;
  }
  // A tensor of `bytes` and `kind` resting on NVMe (its extent taken at registration).
  strata_tensor register_on_nvme(const char* name, uint64_t bytes, strata_tensor_kind kind) {
    strata_tensor_desc d{};
    d.struct_size = sizeof d;
    d.name = name;
    d.bytes = bytes;
    d.dtype = STRATA_DTYPE_U8;
    d.kind = kind;
    d.home_tier = STRATA_TIER_NVME;
    strata_tensor t = STRATA_TENSOR_NONE;
    EXPECT_EQ(strata_tensor_register(rt_, &d, &t), STRATA_OK) << strata_last_error(rt_);
    return t;
  }
  // Tensor k: (k + 1) x 64 KiB, so that a count under the wrong kind cannot match by chance.
  static uint64_t size_of(int kind) { return static_cast<uint64_t>(kind + 1) * 64 * kKiB; }

  strata_runtime* rt_ = nullptr;
  std::string dir_;
};

TEST_F(StatsByKind, EveryKindIsCountedUnderItselfOnEveryTier) {
  std::vector<strata_tensor> tensors(kKinds, STRATA_TENSOR_NONE);
  const std::vector<std::string> names = {"parameter", "gradient",   "master", "adam_m",
                                          "adam_v",    "checkpoint", "other"};
  for (int k = 0; k < kKinds; ++k) {
    tensors[static_cast<size_t>(k)] = register_on_nvme(
        names[static_cast<size_t>(k)].c_str(), size_of(k), static_cast<strata_tensor_kind>(k));
    ASSERT_NE(tensors[static_cast<size_t>(k)], STRATA_TENSOR_NONE);
  }
  // Each NVMe-home tensor has its extent from registration: NVMe space under its kind.
  strata_stats st = stats();
  for (int k = 0; k < kKinds; ++k) {
    EXPECT_GE(st.nvme.kinds[k].in_use_bytes, size_of(k)) << names[static_cast<size_t>(k)];
    EXPECT_LT(st.nvme.kinds[k].in_use_bytes, size_of(k) + 64 * kKiB)
        << names[static_cast<size_t>(k)];
  }
  for (strata_tier tier : {STRATA_TIER_DEVICE, STRATA_TIER_PINNED}) {
    SCOPED_TRACE(tier == STRATA_TIER_DEVICE ? "device" : "pinned");
    for (int k = 0; k < kKinds; ++k) {
      strata_acquired a{};
      a.struct_size = sizeof a;
      ASSERT_EQ(
          strata_acquire(rt_, tensors[static_cast<size_t>(k)], tier, STRATA_ACQUIRE_DISCARD, &a),
          STRATA_OK)
          << strata_last_error(rt_);
    }
    st = stats();
    const strata_tier_stats& t = tier == STRATA_TIER_DEVICE ? st.device : st.pinned;
    uint64_t sum = 0;
    for (int k = 0; k < kKinds; ++k) {
      // Exactly its size (a pinned buffer may be padded to the store's 4 KiB blocks: these are
      // multiples of it), and the staging buffers beside the pinned tier's OTHER.
      const uint64_t staging = tier == STRATA_TIER_PINNED && k == STRATA_KIND_OTHER ? kStaging : 0;
      EXPECT_EQ(t.kinds[k].in_use_bytes, size_of(k) + staging) << names[static_cast<size_t>(k)];
      EXPECT_GE(t.kinds[k].peak_in_use_bytes, size_of(k)) << names[static_cast<size_t>(k)];
      sum += t.kinds[k].in_use_bytes;
    }
    EXPECT_EQ(t.kinds[STRATA_STATS_KIND_SLOTS - 1].in_use_bytes, 0u);  // the spare slot
    EXPECT_GE(t.in_use_bytes, sum);
    for (strata_tensor h : tensors) {
      ASSERT_EQ(strata_release(rt_, h, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
    }
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  for (strata_tensor h : tensors) ASSERT_EQ(strata_tensor_unregister(rt_, h), STRATA_OK);
  st = stats();
  EXPECT_EQ(st.device.in_use_bytes, 0u);
  EXPECT_EQ(st.pinned.in_use_bytes, kStaging);
  EXPECT_EQ(st.nvme.in_use_bytes, 0u);
  for (int k = 0; k < kKinds; ++k) {
    EXPECT_EQ(st.device.kinds[k].in_use_bytes, 0u) << names[static_cast<size_t>(k)];
    EXPECT_EQ(st.pinned.kinds[k].in_use_bytes, k == STRATA_KIND_OTHER ? kStaging : 0u)
        << names[static_cast<size_t>(k)];
    EXPECT_EQ(st.nvme.kinds[k].in_use_bytes, 0u) << names[static_cast<size_t>(k)];
  }
}

// Reserved bytes come from what holds them (the arenas, the swap file), in-use bytes from the
// scheduler's charges; on every tier in use stays within reserved, and NVMe traffic is counted.
TEST_F(StatsByKind, ReservedComesFromTheArenasAndInUseStaysWithinIt) {
  strata_stats st = stats();
  EXPECT_EQ(st.nvme.reserved_bytes, 64ull << 20);              // the swap file's capacity
  EXPECT_EQ(st.device.reserved_bytes, (16ull << 20) * 5 / 4);  // the budget and its slack
  EXPECT_EQ(st.pinned.reserved_bytes, kStaging);  // the staging buffers, mapped at creation
  EXPECT_EQ(st.pinned.in_use_bytes, kStaging);
  EXPECT_EQ(st.host.reserved_bytes, 0u);
  EXPECT_EQ(st.host.in_use_bytes, 0u);

  const uint64_t bytes = 3 * 64 * kKiB + 100;  // not a multiple of a page: the charge rounds up
  const strata_tensor t = register_on_nvme("w", bytes, STRATA_KIND_PARAMETER);
  ASSERT_NE(t, STRATA_TENSOR_NONE);
  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, t, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK);
  st = stats();
  EXPECT_EQ(st.pinned.in_use_bytes, kStaging + 196 * kKiB);  // 192 KiB + 100 B in 4 KiB pages
  EXPECT_GE(st.pinned.reserved_bytes, st.pinned.in_use_bytes);
  EXPECT_EQ(st.pinned.kinds[STRATA_KIND_PARAMETER].in_use_bytes, 196 * kKiB);
  ASSERT_EQ(strata_release(rt_, t, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  const uint64_t written_before = st.nvme_bytes_written;
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  st = stats();
  EXPECT_EQ(st.nvme_bytes_written - written_before, bytes);  // logical bytes, as written
  EXPECT_GE(st.nvme.in_use_bytes, bytes);
  EXPECT_LE(st.nvme.in_use_bytes, st.nvme.reserved_bytes);
  ASSERT_EQ(strata_tensor_unregister(rt_, t), STRATA_OK);
  st = stats();
  EXPECT_EQ(st.pinned.in_use_bytes, kStaging);
  EXPECT_GE(st.pinned.peak_in_use_bytes, kStaging + 196 * kKiB);
  EXPECT_GE(st.pinned.peak_reserved_bytes, kStaging + 196 * kKiB);
}

// The busy times cover the transfers counted by kind: 20 MiB of parameters through the 12 MiB
// pool, written, then read and written back. Each figure grows with its own direction's traffic
// only; the drive's lies between the larger of the two and their sum; none grows by more than
// the time that passed.
TEST_F(StatsByKind, TheDrivesBusyTimeGrowsWithItsTransfersAndNoFasterThanTheClock) {
  constexpr uint64_t kMiB = 1024 * kKiB;
  std::vector<strata_tensor> tensors;
  for (int i = 0; i < 20; ++i) {
    const std::string name = "p" + std::to_string(i);
    tensors.push_back(register_on_nvme(name.c_str(), kMiB, STRATA_KIND_PARAMETER));
    ASSERT_NE(tensors.back(), STRATA_TENSOR_NONE);
  }
  // Each tensor once through the pinned tier, its contents read unless `fresh`, released dirty:
  // the next ones' room needs it written back.
  const auto pass = [&](bool fresh) {
    for (strata_tensor t : tensors) {
      strata_acquired a{};
      a.struct_size = sizeof a;
      ASSERT_EQ(strata_acquire(rt_, t, STRATA_TIER_PINNED, fresh ? STRATA_ACQUIRE_DISCARD : 0u, &a),
                STRATA_OK)
          << strata_last_error(rt_);
      ASSERT_EQ(strata_release(rt_, t, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
    }
    ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  };
  const auto expect_rules = [](const strata_stats& st) {
    EXPECT_GE(st.nvme_busy_us, std::max(st.nvme_read_busy_us, st.nvme_write_busy_us));
    EXPECT_LE(st.nvme_busy_us, st.nvme_read_busy_us + st.nvme_write_busy_us);
  };
  const auto began = std::chrono::steady_clock::now();
  const strata_stats start = stats();
  expect_rules(start);

  pass(/*fresh=*/true);  // written only: nothing to read yet
  const strata_stats written = stats();
  EXPECT_EQ(written.nvme_bytes_read_by_kind[STRATA_KIND_PARAMETER],
            start.nvme_bytes_read_by_kind[STRATA_KIND_PARAMETER]);
  EXPECT_GT(written.nvme_bytes_written_by_kind[STRATA_KIND_PARAMETER], 0u);
  EXPECT_EQ(written.nvme_read_busy_us, start.nvme_read_busy_us);
  EXPECT_GT(written.nvme_write_busy_us, start.nvme_write_busy_us);
  // Writes alone: the drive was busy exactly when its write link was.
  EXPECT_EQ(written.nvme_busy_us - start.nvme_busy_us,
            written.nvme_write_busy_us - start.nvme_write_busy_us);
  expect_rules(written);

  pass(/*fresh=*/false);  // read back, and written back again
  const strata_stats both = stats();
  const auto passed_us =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::steady_clock::now() - began)
                                .count());
  EXPECT_GT(both.nvme_bytes_read_by_kind[STRATA_KIND_PARAMETER], 0u);
  EXPECT_GT(both.nvme_read_busy_us, written.nvme_read_busy_us);
  EXPECT_GT(both.nvme_write_busy_us, written.nvme_write_busy_us);
  EXPECT_GT(both.nvme_busy_us, written.nvme_busy_us);
  expect_rules(both);
  EXPECT_LE(both.nvme_busy_us - start.nvme_busy_us, passed_us);

  // Nothing moves: nothing is added.
  const strata_stats idle = stats();
  EXPECT_EQ(idle.nvme_read_busy_us, both.nvme_read_busy_us);
  EXPECT_EQ(idle.nvme_write_busy_us, both.nvme_write_busy_us);
  EXPECT_EQ(idle.nvme_busy_us, both.nvme_busy_us);
  for (strata_tensor t : tensors) ASSERT_EQ(strata_tensor_unregister(rt_, t), STRATA_OK);
}

// The copies between pinned memory and the device are counted with their busy time: three 8 MiB
// tensors written on the device through a 16 MiB device pool (the third evicts the first, a
// copy back to the host), then the first read back onto the device (a copy to it).
TEST_F(StatsByKind, DeviceCopiesAreCountedWithTheirBusyTime) {
  constexpr uint64_t kBytes = 8 * 1024 * kKiB;
  std::vector<strata_tensor> tensors;
  for (const char* name : {"a", "b", "c"}) {
    tensors.push_back(register_on_nvme(name, kBytes, STRATA_KIND_PARAMETER));
    ASSERT_NE(tensors.back(), STRATA_TENSOR_NONE);
  }
  const auto began = std::chrono::steady_clock::now();
  const strata_stats start = stats();
  for (strata_tensor t : tensors) {
    strata_acquired a{};
    a.struct_size = sizeof a;
    ASSERT_EQ(strata_acquire(rt_, t, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK)
        << strata_last_error(rt_);
    ASSERT_EQ(strata_release(rt_, t, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  }
  ASSERT_EQ(strata_sync(rt_), STRATA_OK) << strata_last_error(rt_);
  const strata_stats written = stats();
  EXPECT_GE(written.device_to_host_bytes - start.device_to_host_bytes, kBytes);
  EXPECT_GT(written.device_to_host_busy_us, start.device_to_host_busy_us);
  EXPECT_EQ(written.host_to_device_bytes, start.host_to_device_bytes);  // nothing read yet
  EXPECT_EQ(written.host_to_device_busy_us, start.host_to_device_busy_us);

  strata_acquired a{};
  a.struct_size = sizeof a;
  ASSERT_EQ(strata_acquire(rt_, tensors[0], STRATA_TIER_DEVICE, 0, &a), STRATA_OK)
      << strata_last_error(rt_);
  ASSERT_EQ(strata_release(rt_, tensors[0], 0u, nullptr), STRATA_OK);
  const strata_stats read = stats();
  const auto passed_us =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::steady_clock::now() - began)
                                .count());
  EXPECT_GE(read.host_to_device_bytes - start.host_to_device_bytes, kBytes);
  EXPECT_GT(read.host_to_device_busy_us, start.host_to_device_busy_us);
  EXPECT_LE(read.host_to_device_busy_us - start.host_to_device_busy_us, passed_us);
  EXPECT_LE(read.device_to_host_busy_us - start.device_to_host_busy_us, passed_us);
  for (strata_tensor t : tensors) ASSERT_EQ(strata_tensor_unregister(rt_, t), STRATA_OK);
}

// A caller built before the busy times (its struct ends at stream_buffers) gets what it knows,
// and nothing past its struct_size is touched (docs/c-api.md).
TEST_F(StatsByKind, AnOlderCallersStructEndsBeforeTheBusyTimesAndKeepsItsOwnBytes) {
  strata_stats st;
  std::fill_n(reinterpret_cast<unsigned char*>(&st), sizeof st, 0xAB);
  st.struct_size = offsetof(strata_stats, nvme_read_busy_us);
  ASSERT_EQ(strata_get_stats(rt_, &st), STRATA_OK) << strata_last_error(rt_);
  EXPECT_EQ(st.pinned_budget_bytes, 16ull << 20);
  EXPECT_EQ(st.nvme_read_busy_us, 0xABABABABABABABABull);
  EXPECT_EQ(st.nvme_busy_us, 0xABABABABABABABABull);
}

}  // namespace
