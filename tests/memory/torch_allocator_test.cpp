#include "memory/torch_allocator.h"

#include <gtest/gtest.h>

#include "memory/device.h"
#include "memory/host_memory.h"
#include "torch_allocator_c_helpers.h"

namespace strata::memory {
namespace {

std::unique_ptr<Device> open_emulated(uint64_t budget, int ordinal = 0) {
  DeviceOptions o;
  o.backend = DeviceBackend::kEmulated;
  o.budget_bytes = budget;
  o.ordinal = ordinal;
  Result<std::unique_ptr<Device>> device = open_device(o);
  EXPECT_TRUE(device.is_ok());
  return std::move(device).value();
}

// The binding's mechanics over a bare device (a runtime's source goes through its scheduler:
// tests/api/torch_memory_test.cpp).
class DeviceSource final : public TorchMemorySource {
 public:
  explicit DeviceSource(Device& device) : device_(device) {}
  int ordinal() const override { return device_.ordinal(); }
  Result<void*> allocate(uint64_t bytes) override { return device_.allocate(bytes); }
  bool owns(const void* ptr) const override { return device_.owns(ptr); }
  uint64_t allocation_size(const void* ptr) const override { return device_.allocation_size(ptr); }
  Status free(void* ptr, void* stream) override { return device_.free(ptr, stream); }

 private:
  Device& device_;
};

TEST(TorchAllocator, WithoutARuntimeCallsFromCDoNotCrash) {
  ASSERT_EQ(torch_allocator_source(), nullptr);
  void* p = c_torch_alloc(1 << 20, 0);
  if (usable_cuda_devices() == 0) {
    EXPECT_EQ(p, nullptr);  // no runtime, no GPU: torch reports out of memory
  } else {
    EXPECT_NE(p, nullptr);  // plain cudaMalloc
  }
  c_torch_free(p, 1 << 20, 0);
  c_torch_free(nullptr, 0, 0);
  int local = 42;
  c_torch_free(&local, sizeof local, 0);  // not ours: a warning, nothing else
  EXPECT_EQ(local, 42);
  EXPECT_EQ(c_torch_alloc(0, 0), nullptr);
}

TEST(TorchAllocator, ARuntimesDeviceServesCallsFromC) {
  auto device = open_emulated(8 << 20);
  {
    DeviceSource source(*device);
    const auto binding = TorchAllocatorBinding::install(source);
    EXPECT_EQ(torch_allocator_source(), &source);
    void* p = c_torch_alloc(3 << 20, 0);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(device->owns(p));
    EXPECT_EQ(device->allocation_size(p), 3u << 20);
    EXPECT_EQ(device->in_use_bytes(), 3u << 20);
    // Past the runtime's budget: NULL, which torch turns into its out-of-memory error.
    EXPECT_EQ(c_torch_alloc(6 << 20, 0), nullptr);
    c_torch_free(p, 3 << 20, 0);
    EXPECT_EQ(device->in_use_bytes(), 0u);
    EXPECT_EQ(c_torch_round_trip(8 << 20, 0), 0);  // the whole budget, written from C
    EXPECT_EQ(device->in_use_bytes(), 0u);
    // Another GPU than the runtime's: not served from it.
    void* elsewhere = c_torch_alloc(4096, 1);
    if (usable_cuda_devices() < 2) EXPECT_EQ(elsewhere, nullptr);
    c_torch_free(elsewhere, 4096, 1);
  }
  EXPECT_EQ(torch_allocator_source(), nullptr);
  if (usable_cuda_devices() == 0) EXPECT_EQ(c_torch_alloc(4096, 0), nullptr);
}

TEST(TorchAllocator, FreesReachTheOwningDeviceAcrossBindings) {
  auto first = open_emulated(1 << 20);
  auto second = open_emulated(1 << 20);
  DeviceSource first_source(*first), second_source(*second);
  auto outer = TorchAllocatorBinding::install(first_source);
  void* from_first = c_torch_alloc(4096, 0);
  ASSERT_TRUE(first->owns(from_first));
  {
    auto inner = TorchAllocatorBinding::install(second_source);
    EXPECT_EQ(torch_allocator_source(), &second_source);  // the newest runtime serves
    void* from_second = c_torch_alloc(4096, 0);
    ASSERT_TRUE(second->owns(from_second));
    c_torch_free(from_first, 4096, 0);  // still goes back to the first device
    EXPECT_EQ(first->in_use_bytes(), 0u);
    c_torch_free(from_second, 4096, 0);
    EXPECT_EQ(second->in_use_bytes(), 0u);
  }
  EXPECT_EQ(torch_allocator_source(), &first_source);
  outer.reset();
  EXPECT_EQ(torch_allocator_source(), nullptr);
}

TEST(TorchAllocator, AFreeOfAPointerAfterItsRuntimeIsGoneIsIgnored) {
  void* p = nullptr;
  {
    auto device = open_emulated(1 << 20);
    DeviceSource source(*device);
    auto binding = TorchAllocatorBinding::install(source);
    p = c_torch_alloc(4096, 0);
    ASSERT_NE(p, nullptr);
    binding.reset();
    // The binding is gone first, as in a runtime's teardown: torch frees late.
    c_torch_free(p, 4096, 0);
    EXPECT_EQ(device->in_use_bytes(), 4096u);  // untouched: not freed into a device we left
  }
}

TEST(TorchAllocator, TheStatsStructIsTheSameSizeInCAndCpp) {
  EXPECT_EQ(c_stats_struct_size(), sizeof(strata_stats));
}

}  // namespace
}  // namespace strata::memory
