// strata_release's device_stream on CUDA (strata.h): NULL is CUDA's default stream, where torch
// queues its work, and the copy out of a DEVICE tensor released DIRTY follows the work queued
// there before the release. Found on an H200 (docs/reliability.md, finding 38): Strata's copy
// streams are non-blocking, so without an event on the default stream its copies ran before
// kernels queued there had finished with the buffer. Needs a GPU; skips itself without one.
#include <gtest/gtest.h>
#include <strata/strata.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/test_dir.h"

#if defined(STRATA_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

constexpr uint64_t kMiB = uint64_t{1024} * 1024;

#if defined(STRATA_HAVE_CUDA)

// Pinned host memory for the test's own copies, freed on scope exit.
class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes) { EXPECT_EQ(cudaMallocHost(&ptr_, bytes), cudaSuccess); }
  ~HostBuffer() { cudaFreeHost(ptr_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

TEST(DeviceStream, ANullStreamOrdersTheCopyOutAfterTheDefaultStreamsWork) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "no CUDA device on this machine";
  }
  const std::string dir = strata::testing::scratch_dir("device-stream").string();
  strata_config c;
  strata_config_init(&c);
  c.nvme_path = dir.c_str();
  c.nvme_capacity_bytes = 256 * kMiB;
  c.pinned_budget_bytes = 128 * kMiB;
  c.device_budget_bytes = 128 * kMiB;
  c.device_backend = STRATA_DEVICE_CUDA;
  strata_runtime* rt = nullptr;
  ASSERT_EQ(strata_runtime_create(&c, &rt), STRATA_OK) << strata_last_error(nullptr);

  constexpr uint64_t kBytes = 64 * kMiB;
  strata_tensor_desc d{};
  d.struct_size = sizeof d;
  d.name = "written-on-the-default-stream";
  d.bytes = kBytes;
  d.dtype = STRATA_DTYPE_U8;
  d.kind = STRATA_KIND_ACTIVATION_CHECKPOINT;
  d.home_tier = STRATA_TIER_NVME;
  strata_tensor t = STRATA_TENSOR_NONE;
  ASSERT_EQ(strata_tensor_register(rt, &d, &t), STRATA_OK) << strata_last_error(rt);

  HostBuffer source(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) source.get()[i] = static_cast<unsigned char>(i * 13 + 5);
  // Work queued ahead on the default stream, so that the write lands well after the release
  // returns: 64 copies of 64 MiB into scratch, 4 GiB over PCIe, about 80 ms. Without the event
  // the read came back wrong in each of three runs, in 2 or 3 of the 8 rounds (an H200,
  // 2026-12-04).
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, kBytes), cudaSuccess);

  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    strata_acquired acquired{};
    acquired.struct_size = sizeof acquired;
    ASSERT_EQ(strata_acquire(rt, t, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD, &acquired),
              STRATA_OK)
        << strata_last_error(rt);
    source.get()[0] = static_cast<unsigned char>(round);  // each round's contents differ
    for (int i = 0; i < 64; ++i) {
      ASSERT_EQ(cudaMemcpyAsync(scratch, source.get(), kBytes, cudaMemcpyHostToDevice, nullptr),
                cudaSuccess);
    }
    ASSERT_EQ(cudaMemcpyAsync(acquired.data, source.get(), kBytes, cudaMemcpyHostToDevice, nullptr),
              cudaSuccess);
    ASSERT_EQ(strata_release(rt, t, STRATA_RELEASE_DIRTY, nullptr), STRATA_OK)
        << strata_last_error(rt);
    // The newest copy is on the device: reading it copies it out, after the queued write.
    std::vector<unsigned char> back(kBytes);
    ASSERT_EQ(strata_tensor_read(rt, t, back.data(), 0, kBytes), STRATA_OK)
        << strata_last_error(rt);
    EXPECT_EQ(0, std::memcmp(back.data(), source.get(), kBytes));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(scratch);
  EXPECT_EQ(strata_runtime_destroy(rt), STRATA_OK);
  std::filesystem::remove_all(dir);
}

#else

TEST(DeviceStream, ANullStreamOrdersTheCopyOutAfterTheDefaultStreamsWork) {
  GTEST_SKIP() << "this build of Strata has no CUDA";
}

#endif  // STRATA_HAVE_CUDA

}  // namespace
