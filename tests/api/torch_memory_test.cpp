// PyTorch's pluggable allocator entry points (strata_torch_alloc / strata_torch_free) against a
// live runtime on the host-emulated device, called from C (tests/memory/
// torch_allocator_c_helpers.c) as torch calls them: the memory comes from the runtime's device
// budget, shows in strata_get_stats, competes with the tensors Strata moves, and goes back.
#include <gtest/gtest.h>
#include <strata/strata.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "memory/device.h"
#include "memory/torch_allocator_c_helpers.h"
#include "model/test_dir.h"

namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1ull << 20;

class TorchMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = strata::testing::scratch_dir(
               ("torch-memory-" +
                std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())))
               .string();
    strata_config c;
    strata_config_init(&c);
    c.nvme_path = dir_.c_str();
    c.nvme_capacity_bytes = 64 * kMiB;
    c.pinned_budget_bytes = 8 * kMiB;
    c.device_budget_bytes = 8 * kMiB;
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
  strata_runtime* rt_ = nullptr;
  std::string dir_;
};

TEST_F(TorchMemory, AllocationsComeFromTheDeviceBudgetAndShowInTheStats) {
  const uint64_t before = stats().device.kinds[STRATA_KIND_OTHER].in_use_bytes;
  void* p = c_torch_alloc(3 * kMiB, 0);
  ASSERT_NE(p, nullptr) << "the runtime's device did not serve torch";
  std::memset(p, 0x5A, 3 * kMiB);  // the emulated device is host memory: writable from here
  const strata_stats during = stats();
  EXPECT_EQ(during.device.kinds[STRATA_KIND_OTHER].in_use_bytes, before + 3 * kMiB);
  EXPECT_GE(during.device.in_use_bytes, 3 * kMiB);
  // Past what the budget can still hold: NULL at once, torch's out-of-memory.
  EXPECT_EQ(c_torch_alloc(6 * kMiB, 0), nullptr);
  c_torch_free(p, 3 * kMiB, 0);
  EXPECT_EQ(stats().device.kinds[STRATA_KIND_OTHER].in_use_bytes, before);
  EXPECT_EQ(c_torch_round_trip(4 * kMiB, 0), 0);  // allocated, written and read back from C
}

TEST_F(TorchMemory, TorchsMemoryIsRoomTheSchedulerCannotUse) {
  void* held = c_torch_alloc(6 * kMiB, 0);
  ASSERT_NE(held, nullptr);
  // A 4 MiB tensor cannot be acquired on the device beside torch's 6 MiB of an 8 MiB budget:
  // refused with the reason rather than waited for (only torch could free the room).
  strata_tensor_desc d{};
  d.struct_size = sizeof d;
  d.name = "weight";
  d.bytes = 4 * kMiB;
  d.dtype = STRATA_DTYPE_U8;
  d.kind = STRATA_KIND_PARAMETER;
  d.home_tier = STRATA_TIER_NVME;
  strata_tensor t = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_tensor_register(rt_, &d, &t), STRATA_OK) << strata_last_error(rt_);
  strata_acquired a{};
  a.struct_size = sizeof a;
  EXPECT_NE(strata_acquire(rt_, t, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK);
  c_torch_free(held, 6 * kMiB, 0);
  // Given back: the tensor fits now.
  ASSERT_EQ(strata_acquire(rt_, t, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD, &a), STRATA_OK)
      << strata_last_error(rt_);
  EXPECT_EQ(strata_release(rt_, t, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK);
  EXPECT_EQ(strata_tensor_unregister(rt_, t), STRATA_OK);
}

TEST_F(TorchMemory, AfterTheRuntimeIsGoneTorchIsNoLongerServedFromIt) {
  void* p = c_torch_alloc(kMiB, 0);
  ASSERT_NE(p, nullptr);
  // Torch may still hold memory when the runtime goes: destroying it gives that memory back
  // with everything else, and a late free is ignored with a warning.
  ASSERT_EQ(strata_runtime_destroy(rt_), STRATA_OK);
  rt_ = nullptr;
  c_torch_free(p, kMiB, 0);
  if (strata::memory::usable_cuda_devices() == 0) EXPECT_EQ(c_torch_alloc(kMiB, 0), nullptr);
}

}  // namespace
