// strata_release's device_stream on CUDA (strata.h): NULL is CUDA's default stream, where torch
// queues its work, and the copy out of a DEVICE tensor released DIRTY follows the work queued
// there before the release. Found on an H200 (docs/reliability.md, finding 38): Strata's copy
// streams are non-blocking, so without an event on the default stream its copies ran before
// kernels queued there had finished with the buffer. And a stream strata.hpp's guard was used on
// (Acquired::used_on_stream) orders the buffer's reuse after that stream's work, also for a
// clean release. Needs a GPU; skips itself without one.
#include <gtest/gtest.h>
#include <strata/strata.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <strata/strata.hpp>
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

bool has_cuda_device() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return true;
  (void)cudaGetLastError();  // clear the error the count left
  return false;
}

TEST(DeviceStream, ANullStreamOrdersTheCopyOutAfterTheDefaultStreamsWork) {
  if (!has_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
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

// A DEVICE tensor read on a non-blocking stream and released clean through strata.hpp's guard:
// the next tensor takes its buffer, and Strata's copy into it must wait for the stream's read.
// Before Acquired::used_on_stream the guard could name a stream only with mark_dirty, so a clean
// release passed CUDA's default stream, which a non-blocking stream does not wait for.
TEST(DeviceStream, AStreamTheCppGuardWasUsedOnOrdersTheBuffersReuse) {
  if (!has_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  const std::string dir = strata::testing::scratch_dir("device-stream-hpp").string();
  constexpr uint64_t kBytes = 64 * kMiB;
  strata::Runtime rt(strata::Config()
                         .nvme_path(dir)
                         .nvme_capacity_bytes(4 * kBytes)
                         .pinned_budget_bytes(2 * kBytes)
                         .device_budget_bytes(kBytes)  // one tensor at a time
                         .device_backend(STRATA_DEVICE_CUDA));
  strata::Tensor read_first = rt.register_tensor("read-on-a-non-blocking-stream", kBytes,
                                                 STRATA_DTYPE_U8, STRATA_KIND_PARAMETER, 0);
  strata::Tensor takes_its_buffer =
      rt.register_tensor("takes-its-buffer", kBytes, STRATA_DTYPE_U8, STRATA_KIND_PARAMETER, 1);
  std::vector<unsigned char> first(kBytes), second(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) {
    first[i] = static_cast<unsigned char>(i * 13 + 5);
    second[i] = static_cast<unsigned char>(i * 7 + 1);
  }
  read_first.write(first);
  takes_its_buffer.write(second);
  rt.sync();

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, kBytes), cudaSuccess);
  HostBuffer source(kBytes), seen(kBytes);
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::memset(seen.get(), 0, kBytes);
    void* buffer = nullptr;
    {
      strata::Acquired guard = read_first.acquire(STRATA_TIER_DEVICE);
      buffer = guard.data();
      // Work queued ahead on the stream (4 GiB over PCIe, about 80 ms), then the read.
      for (int i = 0; i < 64; ++i) {
        ASSERT_EQ(cudaMemcpyAsync(scratch, source.get(), kBytes, cudaMemcpyHostToDevice, stream),
                  cudaSuccess);
      }
      ASSERT_EQ(cudaMemcpyAsync(seen.get(), buffer, kBytes, cudaMemcpyDeviceToHost, stream),
                cudaSuccess);
      guard.used_on_stream(stream);
    }  // released clean, while the stream still has the read queued
    {
      strata::Acquired next = takes_its_buffer.acquire(STRATA_TIER_DEVICE);
      ASSERT_EQ(next.data(), buffer) << "the test needs the second tensor in the first's buffer";
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(0, std::memcmp(seen.get(), first.data(), kBytes))
        << "the stream read the buffer after Strata had refilled it";
  }
  cudaFree(scratch);
  cudaStreamDestroy(stream);
  std::filesystem::remove_all(dir);
}

#else

TEST(DeviceStream, ANullStreamOrdersTheCopyOutAfterTheDefaultStreamsWork) {
  GTEST_SKIP() << "this build of Strata has no CUDA";
}

TEST(DeviceStream, AStreamTheCppGuardWasUsedOnOrdersTheBuffersReuse) {
  GTEST_SKIP() << "this build of Strata has no CUDA";
}

#endif  // STRATA_HAVE_CUDA

}  // namespace
