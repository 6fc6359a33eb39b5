// The Device contract, run against every backend this machine can open: the emulated device
// always, CUDA where a GPU is usable (skipped elsewhere). Device memory is only ever touched
// through copies, as on a real GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "memory/device.h"
#include "memory/host_memory.h"
#include "memory/pinned_arena.h"

namespace strata::memory {
namespace {

class DeviceContract : public ::testing::TestWithParam<DeviceBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceBackend::kCuda && usable_cuda_devices() == 0) {
      GTEST_SKIP() << "no usable CUDA device";
    }
    DeviceOptions o;
    o.backend = GetParam();
    o.budget_bytes = 64 << 20;
    Result<std::unique_ptr<Device>> device = open_device(o);
    ASSERT_TRUE(device.is_ok()) << device.status().message();
    device_ = std::move(device).value();
  }

  std::unique_ptr<Device> device_;
};

std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> v(bytes);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_P(DeviceContract, ARoundTripThroughBothStreamsIsByteExact) {
  const std::vector<uint8_t> src = pattern(5 << 20, 1);
  std::vector<uint8_t> back(src.size(), 0);
  Result<DeviceBuffer> on_device = allocate_buffer(*device_, src.size());
  ASSERT_TRUE(on_device.is_ok());
  Result<Event> uploaded = device_->create_event();
  Result<Event> downloaded = device_->create_event();
  ASSERT_TRUE(uploaded.is_ok() && downloaded.is_ok());
  ASSERT_TRUE(
      device_->copy_async(CopyStream::kHostToDevice, on_device->data(), src.data(), src.size()));
  ASSERT_TRUE(device_->record(*uploaded, CopyStream::kHostToDevice));
  ASSERT_TRUE(device_->wait(CopyStream::kDeviceToHost, *uploaded));
  ASSERT_TRUE(
      device_->copy_async(CopyStream::kDeviceToHost, back.data(), on_device->data(), back.size()));
  ASSERT_TRUE(device_->record(*downloaded, CopyStream::kDeviceToHost));
  ASSERT_TRUE(device_->synchronize(*downloaded));
  EXPECT_TRUE(*device_->query(*downloaded));
  EXPECT_TRUE(*device_->query(*uploaded));  // the download waited for it
  EXPECT_EQ(back, src);
}

TEST_P(DeviceContract, CopiesFromPinnedArenaMemoryRegisteredWithTheDevice) {
  PinnedArenaOptions o;
  o.budget_bytes = 16 << 20;
  o.device = device_.get();
  o.lock_pages = false;
  Result<std::unique_ptr<PinnedArena>> arena = PinnedArena::create(o);
  ASSERT_TRUE(arena.is_ok()) << arena.status().message();
  Result<PinnedBuffer> pinned = (*arena)->allocate(3 << 20);
  ASSERT_TRUE(pinned.is_ok()) << pinned.status().message();
  const std::vector<uint8_t> src = pattern(pinned->size(), 2);
  std::memcpy(pinned->data(), src.data(), src.size());
  Result<DeviceBuffer> on_device = allocate_buffer(*device_, src.size());
  ASSERT_TRUE(on_device.is_ok());
  ASSERT_TRUE(device_->copy_async(CopyStream::kHostToDevice, on_device->data(), pinned->data(),
                                  src.size()));
  ASSERT_TRUE(device_->synchronize(CopyStream::kHostToDevice));
  std::memset(pinned->data(), 0, src.size());
  ASSERT_TRUE(device_->copy_async(CopyStream::kDeviceToHost, pinned->data(), on_device->data(),
                                  src.size()));
  ASSERT_TRUE(device_->synchronize(CopyStream::kDeviceToHost));
  EXPECT_EQ(std::memcmp(pinned->data(), src.data(), src.size()), 0);
}

TEST_P(DeviceContract, TheBudgetIsEnforcedAndCounted) {
  Result<void*> most = device_->allocate(48 << 20);
  ASSERT_TRUE(most.is_ok());
  EXPECT_EQ(device_->budget_bytes(), 64u << 20);
  EXPECT_EQ(device_->in_use_bytes(), 48u << 20);
  Result<void*> more = device_->allocate(32 << 20);
  ASSERT_FALSE(more.is_ok());
  EXPECT_EQ(more.status().code(), STRATA_E_DEVICE_BUDGET);
  EXPECT_NE(more.status().message().find("67108864 B"), std::string::npos);
  ASSERT_TRUE(device_->free(*most));
  EXPECT_EQ(device_->in_use_bytes(), 0u);
  Result<void*> now = device_->allocate(32 << 20);
  ASSERT_TRUE(now.is_ok());
  ASSERT_TRUE(device_->free(*now));
}

TEST_P(DeviceContract, ManyAllocationsAreAlignedDisjointAndReusable) {
  std::vector<void*> pointers;
  pointers.reserve(1000);
  for (int i = 0; i < 1000; ++i) {
    Result<void*> p = device_->allocate(1 + (i * 7919) % 40000);
    ASSERT_TRUE(p.is_ok()) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u);
    pointers.push_back(*p);
  }
  for (size_t i = 0; i < pointers.size(); i += 2) ASSERT_TRUE(device_->free(pointers[i]));
  for (size_t i = 1; i < pointers.size(); i += 2) ASSERT_TRUE(device_->free(pointers[i]));
  EXPECT_EQ(device_->in_use_bytes(), 0u);
  Result<void*> whole = device_->allocate(64 << 20);  // all merged back
  ASSERT_TRUE(whole.is_ok());
  ASSERT_TRUE(device_->free(*whole));
}

TEST_P(DeviceContract, BadArgumentsAreErrorsNotCrashes) {
  std::vector<uint8_t> host(4096);
  EXPECT_EQ(device_->free(host.data()).code(), STRATA_E_INVALID);
  EXPECT_EQ(device_->copy_async(CopyStream::kHostToDevice, host.data(), host.data(), 4096).code(),
            STRATA_E_INVALID);
  EXPECT_EQ(device_->allocate(0).status().code(), STRATA_E_INVALID);
  Event empty;
  EXPECT_EQ(device_->record(empty, CopyStream::kHostToDevice).code(), STRATA_E_INVALID);
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceContract,
                         ::testing::Values(DeviceBackend::kEmulated, DeviceBackend::kCuda),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace strata::memory
