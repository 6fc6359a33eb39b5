// The CUDA kernels against the CPU path: the same inputs must give the same bits (both implement
// adamw_element.h with one rounding per operation), and the gradient check must agree with the
// CPU one. Skipped where the build has no CUDA or the machine no GPU.
#include "optim/adamw_cuda.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "adam_test_util.h"
#include "optim/cpu_adam.h"

#if defined(STRATA_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace strata::optim {
namespace {

using testing::Gradients;
using testing::make_gradients;
using testing::make_states;
using testing::Rng;
using testing::same_bits;
using testing::States;

TEST(CudaKernelsUnavailable, EveryEntryPointSaysUnsupported) {
  if (cuda::kernels_built()) GTEST_SKIP() << "this build has the CUDA kernels";
  EXPECT_EQ(cuda::device_count(), 0);
  AdamWSlice slice;
  EXPECT_EQ(cuda::adamw_step(AdamWParams{}, slice, nullptr).code(), STRATA_E_UNSUPPORTED);
  EXPECT_EQ(cuda::grad_stats_begin(nullptr, nullptr).code(), STRATA_E_UNSUPPORTED);
}

#if defined(STRATA_HAVE_CUDA)

// Device memory for the tests, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void upload(const void* host, size_t bytes, size_t offset = 0) {
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  void download(void* host, size_t bytes, size_t offset = 0) const {
    ASSERT_EQ(cudaMemcpy(host, static_cast<char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
  }

 private:
  void* ptr_ = nullptr;
};

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::kernels_built()) GTEST_SKIP() << "this build of Strata has no CUDA kernels";
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    auto adam = CpuAdam::create({.threads = 2});
    ASSERT_TRUE(adam.is_ok());
    cpu_ = std::move(*adam);
  }
  std::unique_ptr<CpuAdam> cpu_;
};

// Aligned slices take the float4 kernel, slices shifted by one element the scalar one: both must
// equal the CPU bit for bit, for every gradient dtype, copy dtype and Adam/AdamW, over two steps.
TEST_F(CudaKernels, AdamWStepEqualsCpuBitForBit) {
  const DType grad_types[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  for (DType grad_dtype : grad_types) {
    for (int out_kind = 0; out_kind < 3; ++out_kind) {
      for (bool decoupled : {true, false}) {
        for (size_t n : {1, 3, 4, 5, 1023, 1'000'003}) {
          for (size_t shift : {0, 1}) {
            SCOPED_TRACE(std::string(to_string(grad_dtype)) + " out=" + std::to_string(out_kind) +
                         (decoupled ? " AdamW" : " Adam") + " n=" + std::to_string(n) +
                         " shift=" + std::to_string(shift));
            Rng rng(n + shift);
            States cpu = make_states(n, rng, 0.05f);
            const DType out_dtype = out_kind == 2 ? DType::kFloat16 : DType::kBFloat16;
            const size_t gsize = dtype_size(grad_dtype);
            DeviceBuffer dp((n + 1) * 4), dm((n + 1) * 4), dv((n + 1) * 4), dg((n + 1) * gsize),
                dout((n + 1) * 2);
            dp.upload(cpu.p.data(), n * 4, shift * 4);
            dm.upload(cpu.m.data(), n * 4, shift * 4);
            dv.upload(cpu.v.data(), n * 4, shift * 4);
            std::vector<uint16_t> cpu_out(n);
            for (int64_t step = 1; step <= 2; ++step) {
              const Gradients g = make_gradients(n, grad_dtype, rng, 0.05f);
              dg.upload(g.data(), n * gsize, shift * gsize);
              AdamWParams h;
              h.weight_decay = 0.02;
              h.decoupled = decoupled;
              h.step = step;
              h.grad_scale = 0.75f;
              AdamWSlice host{cpu.p.data(), cpu.m.data(),
                              cpu.v.data(), g.data(),
                              grad_dtype,   out_kind ? cpu_out.data() : nullptr,
                              out_dtype,    n};
              ASSERT_TRUE(cpu_->step(h, {&host, 1}).is_ok());
              AdamWSlice device{
                  dp.as<float>() + shift,
                  dm.as<float>() + shift,
                  dv.as<float>() + shift,
                  dg.as<unsigned char>() + shift * gsize,
                  grad_dtype,
                  out_kind ? static_cast<void*>(dout.as<uint16_t>() + shift) : nullptr,
                  out_dtype,
                  n};
              const Status status = cuda::adamw_step(h, device, nullptr);
              ASSERT_TRUE(status.is_ok()) << status.message();
            }
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            States gpu = cpu;
            std::vector<uint16_t> gpu_out(n);
            dp.download(gpu.p.data(), n * 4, shift * 4);
            dm.download(gpu.m.data(), n * 4, shift * 4);
            dv.download(gpu.v.data(), n * 4, shift * 4);
            if (out_kind) dout.download(gpu_out.data(), n * 2, shift * 2);
            for (size_t i = 0; i < n; ++i) {
              ASSERT_TRUE(same_bits(gpu.p[i], cpu.p[i]))
                  << i << ": " << gpu.p[i] << " vs " << cpu.p[i];
              ASSERT_TRUE(same_bits(gpu.m[i], cpu.m[i])) << i;
              ASSERT_TRUE(same_bits(gpu.v[i], cpu.v[i])) << i;
              if (out_kind) ASSERT_EQ(gpu_out[i], cpu_out[i]) << i;
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaKernels, GradStatsAgreeWithCpuAndFindEveryNonFinite) {
  DeviceBuffer workspace(cuda::kGradStatsWorkspaceBytes);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const size_t n = 3'000'017;
    Rng rng(static_cast<uint64_t>(dtype));
    Gradients g = make_gradients(n, dtype, rng, 1.0f);
    const size_t bytes = n * dtype_size(dtype);
    DeviceBuffer dg(bytes);
    dg.upload(g.data(), bytes);
    // Two slices of one buffer accumulate into one result.
    const size_t split = 1'234'567;
    const GradSlice host_slices[] = {{g.data(), dtype, n}};
    auto want = cpu_->grad_stats(host_slices);
    ASSERT_TRUE(want.is_ok());
    auto gpu_stats = [&](GradStats* out) {
      ASSERT_TRUE(cuda::grad_stats_begin(workspace.as<void>(), nullptr).is_ok());
      const GradSlice a{dg.as<unsigned char>(), dtype, split};
      const GradSlice b{dg.as<unsigned char>() + split * dtype_size(dtype), dtype, n - split};
      ASSERT_TRUE(cuda::grad_stats_add(a, workspace.as<void>(), nullptr).is_ok());
      ASSERT_TRUE(cuda::grad_stats_add(b, workspace.as<void>(), nullptr).is_ok());
      ASSERT_TRUE(cuda::grad_stats_finish(workspace.as<void>(), nullptr).is_ok());
      ASSERT_TRUE(cuda::grad_stats_read(workspace.as<void>(), out, nullptr).is_ok());
    };
    GradStats first, second;
    gpu_stats(&first);
    gpu_stats(&second);
    EXPECT_FALSE(first.found_nonfinite);
    EXPECT_EQ(first.sum_squares, second.sum_squares) << "not deterministic";
    EXPECT_NEAR(first.sum_squares / want->sum_squares, 1.0, 1e-12) << to_string(dtype);

    for (size_t pos : {size_t{0}, split - 1, split, n - 1}) {
      for (float bad : {INFINITY, NAN}) {
        const float saved = g.value(pos);
        g.set(pos, bad);
        const size_t esize = dtype_size(dtype);
        dg.upload(static_cast<const unsigned char*>(g.data()) + pos * esize, esize, pos * esize);
        GradStats stats;
        gpu_stats(&stats);
        EXPECT_TRUE(stats.found_nonfinite) << to_string(dtype) << " at " << pos;
        g.set(pos, saved);
        dg.upload(static_cast<const unsigned char*>(g.data()) + pos * esize, esize, pos * esize);
      }
    }
  }
}

TEST_F(CudaKernels, RejectsBadArgumentsWithoutLaunching) {
  AdamWSlice slice;
  slice.n = 10;  // null pointers
  EXPECT_EQ(cuda::adamw_step(AdamWParams{}, slice, nullptr).code(), STRATA_E_INVALID);
  AdamWParams bad;
  bad.beta2 = 1.0;
  EXPECT_EQ(cuda::adamw_step(bad, AdamWSlice{}, nullptr).code(), STRATA_E_INVALID);
  EXPECT_EQ(cuda::grad_stats_begin(nullptr, nullptr).code(), STRATA_E_INVALID);
}

#endif  // STRATA_HAVE_CUDA

}  // namespace
}  // namespace strata::optim
