#include "memory/emulated_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "memory/device.h"
#include "memory/host_memory.h"
#include "sanitizers.h"

namespace strata::memory {
namespace {

std::unique_ptr<Device> open_emulated(uint64_t budget) {
  DeviceOptions o;
  o.backend = DeviceBackend::kEmulated;
  o.budget_bytes = budget;
  Result<std::unique_ptr<Device>> device = open_device(o);
  EXPECT_TRUE(device.is_ok()) << device.status().message();
  return std::move(device).value();
}

EmulatedDeviceControl& control(Device& device) {
  return dynamic_cast<EmulatedDeviceControl&>(device);
}

std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> v(bytes);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(EmulatedDevice, AnEventCompletesOnlyAfterTheCopyBeforeIt) {
  auto device = open_emulated(64 << 20);
  const std::vector<uint8_t> src = pattern(4 << 20, 1);
  Result<DeviceBuffer> dst = allocate_buffer(*device, src.size());
  ASSERT_TRUE(dst.is_ok());
  std::memset(dst->data(), 0, src.size());
  Result<Event> done = device->create_event();
  ASSERT_TRUE(done.is_ok());

  control(*device).pause(CopyStream::kHostToDevice);
  ASSERT_TRUE(device->copy_async(CopyStream::kHostToDevice, dst->data(), src.data(), src.size()));
  ASSERT_TRUE(device->record(*done, CopyStream::kHostToDevice));
  // Queued, not run: the event must say so and the destination must be untouched.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(*device->query(*done));
  EXPECT_EQ(control(*device).pending(CopyStream::kHostToDevice), 1u);
  EXPECT_EQ(static_cast<uint8_t*>(dst->data())[0], 0);

  control(*device).resume(CopyStream::kHostToDevice);
  ASSERT_TRUE(device->synchronize(*done));
  EXPECT_TRUE(*device->query(*done));
  EXPECT_EQ(std::memcmp(dst->data(), src.data(), src.size()), 0);
}

TEST(EmulatedDevice, AnEventNeverRecordedIsComplete) {
  auto device = open_emulated(1 << 20);
  Result<Event> e = device->create_event();
  ASSERT_TRUE(e.is_ok());
  EXPECT_TRUE(*device->query(*e));
  EXPECT_TRUE(device->synchronize(*e));
}

TEST(EmulatedDevice, CopiesOnAStreamRunInOrder) {
  auto device = open_emulated(16 << 20);
  constexpr size_t kBytes = 1 << 20;
  Result<DeviceBuffer> dst = allocate_buffer(*device, kBytes);
  ASSERT_TRUE(dst.is_ok());
  std::vector<std::vector<uint8_t>> sources;
  for (uint32_t i = 0; i < 8; ++i) sources.push_back(pattern(kBytes, i + 10));
  // Eight copies to the same place: the last one queued must be what stays.
  for (const auto& s : sources) {
    ASSERT_TRUE(device->copy_async(CopyStream::kHostToDevice, dst->data(), s.data(), kBytes));
  }
  ASSERT_TRUE(device->synchronize(CopyStream::kHostToDevice));
  EXPECT_EQ(std::memcmp(dst->data(), sources.back().data(), kBytes), 0);
}

TEST(EmulatedDevice, AStreamWaitingOnAnEventRunsAfterTheOtherStream) {
  auto device = open_emulated(16 << 20);
  const std::vector<uint8_t> src = pattern(2 << 20, 3);
  std::vector<uint8_t> back(src.size(), 0);
  Result<DeviceBuffer> on_device = allocate_buffer(*device, src.size());
  ASSERT_TRUE(on_device.is_ok());
  Result<Event> uploaded = device->create_event();
  Result<Event> downloaded = device->create_event();
  ASSERT_TRUE(uploaded.is_ok() && downloaded.is_ok());

  control(*device).pause(CopyStream::kHostToDevice);
  ASSERT_TRUE(
      device->copy_async(CopyStream::kHostToDevice, on_device->data(), src.data(), src.size()));
  ASSERT_TRUE(device->record(*uploaded, CopyStream::kHostToDevice));
  ASSERT_TRUE(device->wait(CopyStream::kDeviceToHost, *uploaded));
  ASSERT_TRUE(
      device->copy_async(CopyStream::kDeviceToHost, back.data(), on_device->data(), back.size()));
  ASSERT_TRUE(device->record(*downloaded, CopyStream::kDeviceToHost));

  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // The download is held behind the upload, which is held by the pause.
  EXPECT_FALSE(*device->query(*downloaded));
  EXPECT_EQ(control(*device).pending(CopyStream::kDeviceToHost), 2u);  // the wait and the copy
  EXPECT_EQ(back[0], 0);

  control(*device).resume(CopyStream::kHostToDevice);
  ASSERT_TRUE(device->synchronize(*downloaded));
  EXPECT_TRUE(*device->query(*uploaded));
  EXPECT_EQ(back, src);
}

TEST(EmulatedDevice, ManyRoundTripsAreByteExactAndOverflowTheQueueSafely) {
  auto device = open_emulated(64 << 20);
  constexpr size_t kChunks = 3000;  // more than the queue holds: copy_async must block, not fail
  constexpr size_t kChunk = 8192;
  const std::vector<uint8_t> src = pattern(kChunks * kChunk, 4);
  std::vector<uint8_t> back(src.size(), 0);
  Result<DeviceBuffer> on_device = allocate_buffer(*device, src.size());
  ASSERT_TRUE(on_device.is_ok());
  auto* d = static_cast<uint8_t*>(on_device->data());
  for (size_t i = 0; i < kChunks; ++i) {
    ASSERT_TRUE(device->copy_async(CopyStream::kHostToDevice, d + i * kChunk,
                                   src.data() + i * kChunk, kChunk));
  }
  Result<Event> uploaded = device->create_event();
  ASSERT_TRUE(device->record(*uploaded, CopyStream::kHostToDevice));
  ASSERT_TRUE(device->wait(CopyStream::kDeviceToHost, *uploaded));
  for (size_t i = kChunks; i-- > 0;) {  // reverse order: independent ranges
    ASSERT_TRUE(device->copy_async(CopyStream::kDeviceToHost, back.data() + i * kChunk,
                                   d + i * kChunk, kChunk));
  }
  ASSERT_TRUE(device->synchronize(CopyStream::kDeviceToHost));
  EXPECT_EQ(back, src);
}

TEST(EmulatedDevice, TheBudgetIsEnforcedWithTheNumbers) {
  auto device = open_emulated(1 << 20);
  EXPECT_EQ(device->budget_bytes(), 1u << 20);
  Result<void*> a = device->allocate(600 << 10);
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(device->in_use_bytes(), 600u << 10);
  Result<void*> b = device->allocate(600 << 10);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), STRATA_E_DEVICE_BUDGET);
  const std::string& m = b.status().message();
  EXPECT_NE(m.find("614400 B"), std::string::npos) << m;   // asked / in use
  EXPECT_NE(m.find("1048576 B"), std::string::npos) << m;  // budget
  EXPECT_NE(m.find("device_budget_bytes"), std::string::npos) << m;
  ASSERT_TRUE(device->free(*a));
  EXPECT_EQ(device->in_use_bytes(), 0u);
  Result<void*> whole = device->allocate(1 << 20);
  ASSERT_TRUE(whole.is_ok());
  EXPECT_TRUE(device->free(*whole));
}

TEST(EmulatedDevice, RejectsBadPointersAndCopiesOutsideItsMemory) {
  auto device = open_emulated(1 << 20);
  std::vector<uint8_t> host(4096);
  Result<void*> p = device->allocate(4096);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(device->allocation_size(*p), 4096u);
  EXPECT_TRUE(device->owns(*p));
  EXPECT_FALSE(device->owns(host.data()));
  // Host-to-device with a host destination; device range running past the slab.
  EXPECT_EQ(device->copy_async(CopyStream::kHostToDevice, host.data(), host.data(), 16).code(),
            STRATA_E_INVALID);
  auto* end = static_cast<uint8_t*>(*p) + (1 << 20);
  EXPECT_EQ(device->copy_async(CopyStream::kHostToDevice, end - 16, host.data(), 4096).code(),
            STRATA_E_INVALID);
  EXPECT_EQ(device->copy_async(CopyStream::kDeviceToHost, host.data(), *p, 0).code(), STRATA_OK);
  EXPECT_EQ(device->free(host.data()).code(), STRATA_E_INVALID);
  EXPECT_EQ(device->free(static_cast<uint8_t*>(*p) + 256).code(), STRATA_E_INVALID);
  ASSERT_TRUE(device->free(*p));
  EXPECT_EQ(device->free(*p).code(), STRATA_E_INVALID);  // double free
  // An event of another device.
  auto other = open_emulated(1 << 20);
  Result<Event> foreign = other->create_event();
  EXPECT_EQ(device->query(*foreign).status().code(), STRATA_E_INVALID);
  Event empty;
  EXPECT_EQ(device->synchronize(empty).code(), STRATA_E_INVALID);
}

TEST(EmulatedDevice, EventsAreABoundedResourceGivenBackByTheirHandles) {
  DeviceOptions o;
  o.backend = DeviceBackend::kEmulated;
  o.budget_bytes = 1 << 20;
  o.max_events = 4;
  Result<std::unique_ptr<Device>> device = open_device(o);
  ASSERT_TRUE(device.is_ok());
  std::vector<Event> events;
  events.reserve(4);
  for (int i = 0; i < 4; ++i) events.push_back(std::move((*device)->create_event()).value());
  EXPECT_EQ((*device)->create_event().status().code(), STRATA_E_LIMIT);
  events.pop_back();
  EXPECT_TRUE((*device)->create_event().is_ok());
}

TEST(EmulatedDevice, ABandwidthLimitSlowsCopiesDown) {
  DeviceOptions o;
  o.backend = DeviceBackend::kEmulated;
  o.budget_bytes = 8 << 20;
  o.emulated_copy_bytes_per_second = 100 << 20;  // 100 MiB/s: 4 MiB takes 40 ms
  Result<std::unique_ptr<Device>> device = open_device(o);
  ASSERT_TRUE(device.is_ok());
  std::vector<uint8_t> src(4 << 20, 7);
  Result<DeviceBuffer> dst = allocate_buffer(**device, src.size());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      (*device)->copy_async(CopyStream::kHostToDevice, dst->data(), src.data(), src.size()));
  ASSERT_TRUE((*device)->synchronize(CopyStream::kHostToDevice));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(38));
}

TEST(EmulatedDevice, ItsMemoryIsExcludedFromHostAccountingExactly) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer shadows the device's pages with anonymous memory";
#endif
  constexpr uint64_t kBytes = 128 << 20;
  // What the process itself may grow by meanwhile (the stream's worker, the copies' chunk):
  // AddressSanitizer's allocator and interceptors add about 18 MiB of their own here. Either
  // way far below the 128 MiB the device holds, which the accounting must leave out.
  const uint64_t slack = strata::testing::kSanitized ? (32 << 20) : (8 << 20);
  auto device = open_emulated(256 << 20);
  Result<ProcMemory> before = read_proc_memory();
  ASSERT_TRUE(before.is_ok());
  const uint64_t host_before = host_bytes_excluding(*before, device.get());
  EXPECT_EQ(device->host_resident_bytes(), 0u);  // sparse until written

  Result<DeviceBuffer> on_device = allocate_buffer(*device, kBytes);
  ASSERT_TRUE(on_device.is_ok());
  // Fill the device memory through copies from one small host buffer.
  const std::vector<uint8_t> chunk = pattern(1 << 20, 5);
  auto* d = static_cast<uint8_t*>(on_device->data());
  for (uint64_t off = 0; off < kBytes; off += chunk.size()) {
    ASSERT_TRUE(device->copy_async(CopyStream::kHostToDevice, d + off, chunk.data(), chunk.size()));
  }
  ASSERT_TRUE(device->synchronize(CopyStream::kHostToDevice));

  Result<ProcMemory> after = read_proc_memory();
  ASSERT_TRUE(after.is_ok());
  EXPECT_EQ(device->host_resident_bytes(), kBytes);  // the memfd holds exactly what was written
  EXPECT_GE(after->rss_shmem + (4 << 20), before->rss_shmem + kBytes);  // the OS sees it...
  EXPECT_GE(after->vm_rss + (4 << 20), before->vm_rss + kBytes);
  const uint64_t host_after = host_bytes_excluding(*after, device.get());
  EXPECT_LT(host_after, host_before + slack);  // ...and host accounting leaves it out

  HostMemorySampler sampler({std::chrono::milliseconds(1), device.get()});
  sampler.sample_now();
  EXPECT_LT(sampler.peak_host_bytes_excluding_device(), after->vm_rss - kBytes + slack);

  // What strata_get_stats reports from the same two readings (api/stats.cpp).
  Result<ProcMemory> now = read_proc_memory();
  ASSERT_TRUE(now.is_ok());
  EXPECT_EQ(device->host_resident_bytes(), kBytes);
  EXPECT_GE(now->vm_hwm, kBytes);
  EXPECT_LT(host_bytes_excluding(*now, device.get()), now->vm_rss - kBytes + slack);

  // Freed device memory stays resident, as a GPU's slab does (reuse faults no page in again),
  // and host accounting still leaves it out.
  on_device->reset();
  EXPECT_EQ(device->host_resident_bytes(), kBytes);
  Result<ProcMemory> freed = read_proc_memory();
  ASSERT_TRUE(freed.is_ok());
  EXPECT_LT(host_bytes_excluding(*freed, device.get()), host_before + slack);
}

TEST(DeviceOpen, AutoFallsBackToTheEmulatedDeviceWithoutAUsableGpu) {
  if (usable_cuda_devices() > 0) GTEST_SKIP() << "a GPU is usable here";
  DeviceOptions o;
  o.budget_bytes = 1 << 20;
  Result<std::unique_ptr<Device>> device = open_device(o);
  ASSERT_TRUE(device.is_ok()) << device.status().message();
  EXPECT_EQ((*device)->backend(), DeviceBackend::kEmulated);
  EXPECT_TRUE((*device)->pci_bus_id().empty());

  o.backend = DeviceBackend::kCuda;
  Result<std::unique_ptr<Device>> cuda = open_device(o);
  ASSERT_FALSE(cuda.is_ok());
  EXPECT_EQ(cuda.status().code(), STRATA_E_UNSUPPORTED);
}

TEST(DeviceOpen, TheEmulatedDeviceDefaultsToOneGiB) {
  DeviceOptions o;
  o.backend = DeviceBackend::kEmulated;
  Result<std::unique_ptr<Device>> device = open_device(o);
  ASSERT_TRUE(device.is_ok());
  EXPECT_EQ((*device)->budget_bytes(), 1u << 30);
  EXPECT_EQ((*device)->name(), "emulated:0");
}

}  // namespace
}  // namespace strata::memory
