// CUDA kernels of the optimizer: the fused Adam/AdamW step and the overflow check / sum of
// squares. The element update is adamw_element.h itself (explicit _rn intrinsics on the device,
// so nvcc cannot fuse a multiply and an add), which keeps GPU and CPU results bit-identical.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "optim/adamw_cuda.h"
#include "optim/adamw_element.h"
#include "optim/half_convert.h"

namespace strata::optim::cuda {
namespace {

constexpr int kThreads = 256;
// Enough resident blocks to saturate HBM on the largest GPUs; the loops stride over the rest.
constexpr unsigned kMaxBlocks = 8192;

Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::ok();
  return Status::error(STRATA_E_DEVICE, std::string("CUDA optimizer: ") + what + ": " +
                                            cudaGetErrorName(error) + " (" +
                                            cudaGetErrorString(error) + ")");
}

cudaStream_t as_stream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

template <int kGrad>
__device__ __forceinline__ float load_grad(const void* grad, size_t i) {
  if constexpr (kGrad == 0) return static_cast<const float*>(grad)[i];
  if constexpr (kGrad == 1) return bf16_to_float(static_cast<const uint16_t*>(grad)[i]);
  if constexpr (kGrad == 2) return fp16_to_float(static_cast<const uint16_t*>(grad)[i]);
}

template <int kOut>
__device__ __forceinline__ uint16_t narrow(float p) {
  if constexpr (kOut == 1) return float_to_bf16(p);
  return float_to_fp16(p);
}

template <int kGrad, int kOut, bool kL2>
__device__ __forceinline__ void update_one(const AdamWConstants& c, float* __restrict__ param,
                                           float* __restrict__ m, float* __restrict__ v,
                                           const void* __restrict__ grad, void* __restrict__ out,
                                           size_t i) {
  float p = param[i];
  float mi = m[i];
  float vi = v[i];
  detail::adamw_element<kL2>(c, load_grad<kGrad>(grad, i), p, mi, vi);
  param[i] = p;
  m[i] = mi;
  v[i] = vi;
  if constexpr (kOut != 0) static_cast<uint16_t*>(out)[i] = narrow<kOut>(p);
}

template <int kGrad, int kOut, bool kL2>
__global__ void adamw_kernel(AdamWConstants c, float* __restrict__ param, float* __restrict__ m,
                             float* __restrict__ v, const void* __restrict__ grad,
                             void* __restrict__ out, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    update_one<kGrad, kOut, kL2>(c, param, m, v, grad, out, i);
  }
}

// Four elements per thread with 16-byte loads of param, m, v (and of fp32 gradients; 8-byte
// loads of 16-bit ones). Launched only when every pointer is aligned for that.
template <int kGrad, int kOut, bool kL2>
__global__ void adamw_kernel_vec4(AdamWConstants c, float* __restrict__ param,
                                  float* __restrict__ m, float* __restrict__ v,
                                  const void* __restrict__ grad, void* __restrict__ out, size_t n) {
  const size_t groups = n / 4;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t q = first; q < groups; q += stride) {
    float4 p = reinterpret_cast<float4*>(param)[q];
    float4 mm = reinterpret_cast<float4*>(m)[q];
    float4 vv = reinterpret_cast<float4*>(v)[q];
    float g[4];
    if constexpr (kGrad == 0) {
      const float4 g4 = reinterpret_cast<const float4*>(grad)[q];
      g[0] = g4.x, g[1] = g4.y, g[2] = g4.z, g[3] = g4.w;
    } else {
      const uint2 raw = reinterpret_cast<const uint2*>(grad)[q];
      const uint16_t h[4] = {
          static_cast<uint16_t>(raw.x & 0xFFFFu), static_cast<uint16_t>(raw.x >> 16),
          static_cast<uint16_t>(raw.y & 0xFFFFu), static_cast<uint16_t>(raw.y >> 16)};
      for (int k = 0; k < 4; ++k) g[k] = kGrad == 1 ? bf16_to_float(h[k]) : fp16_to_float(h[k]);
    }
    detail::adamw_element<kL2>(c, g[0], p.x, mm.x, vv.x);
    detail::adamw_element<kL2>(c, g[1], p.y, mm.y, vv.y);
    detail::adamw_element<kL2>(c, g[2], p.z, mm.z, vv.z);
    detail::adamw_element<kL2>(c, g[3], p.w, mm.w, vv.w);
    reinterpret_cast<float4*>(param)[q] = p;
    reinterpret_cast<float4*>(m)[q] = mm;
    reinterpret_cast<float4*>(v)[q] = vv;
    if constexpr (kOut != 0) {
      uint2 packed;
      packed.x = static_cast<uint32_t>(narrow<kOut>(p.x)) |
                 (static_cast<uint32_t>(narrow<kOut>(p.y)) << 16);
      packed.y = static_cast<uint32_t>(narrow<kOut>(p.z)) |
                 (static_cast<uint32_t>(narrow<kOut>(p.w)) << 16);
      reinterpret_cast<uint2*>(out)[q] = packed;
    }
  }
  // The last n % 4 elements, one per thread of the first block.
  if (blockIdx.x == 0 && threadIdx.x < n % 4) {
    update_one<kGrad, kOut, kL2>(c, param, m, v, grad, out, groups * 4 + threadIdx.x);
  }
}

bool aligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

template <int kGrad, int kOut, bool kL2>
cudaError_t launch_adamw(const AdamWConstants& c, const AdamWSlice& s, cudaStream_t stream) {
  const bool vec4 = aligned(s.param, 16) && aligned(s.m, 16) && aligned(s.v, 16) &&
                    aligned(s.grad, kGrad == 0 ? 16 : 8) && (kOut == 0 || aligned(s.param_out, 8));
  const size_t work = vec4 ? (s.n + 3) / 4 : s.n;
  const unsigned blocks =
      static_cast<unsigned>(std::min<size_t>((work + kThreads - 1) / kThreads, kMaxBlocks));
  if (vec4) {
    adamw_kernel_vec4<kGrad, kOut, kL2>
        <<<blocks, kThreads, 0, stream>>>(c, s.param, s.m, s.v, s.grad, s.param_out, s.n);
  } else {
    adamw_kernel<kGrad, kOut, kL2>
        <<<blocks, kThreads, 0, stream>>>(c, s.param, s.m, s.v, s.grad, s.param_out, s.n);
  }
  return cudaGetLastError();
}

template <int kGrad>
cudaError_t dispatch_out(const AdamWConstants& c, const AdamWSlice& s, bool l2,
                         cudaStream_t stream) {
  const int out = s.param_out == nullptr ? 0 : (s.param_out_dtype == DType::kBFloat16 ? 1 : 2);
  switch (out * 2 + (l2 ? 1 : 0)) {
    case 0:
      return launch_adamw<kGrad, 0, false>(c, s, stream);
    case 1:
      return launch_adamw<kGrad, 0, true>(c, s, stream);
    case 2:
      return launch_adamw<kGrad, 1, false>(c, s, stream);
    case 3:
      return launch_adamw<kGrad, 1, true>(c, s, stream);
    case 4:
      return launch_adamw<kGrad, 2, false>(c, s, stream);
    default:
      return launch_adamw<kGrad, 2, true>(c, s, stream);
  }
}

// Sum of a double over the block, the same tree every time.
__device__ double block_sum(double x) {
  __shared__ double warp_sums[32];
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_down_sync(0xFFFFFFFFu, x, offset);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  x = threadIdx.x < warps ? warp_sums[threadIdx.x] : 0.0;
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_down_sync(0xFFFFFFFFu, x, offset);
  }
  return x;
}

template <int kGrad>
__global__ void sum_squares_kernel(const void* __restrict__ grad, size_t n,
                                   double* __restrict__ partials) {
  double acc = 0.0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double x = load_grad<kGrad>(grad, i);
    acc += x * x;  // exact square of an fp32 value; NaN and infinity propagate
  }
  const double sum = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] += sum;  // one writer per slot: deterministic
}

__global__ void finish_kernel(double* workspace) {
  const double sum = block_sum(workspace[threadIdx.x]);
  if (threadIdx.x == 0) workspace[kGradStatsBlocks] = sum;
}

static_assert(kGradStatsBlocks == 1024, "finish_kernel reduces one partial per thread");

}  // namespace

bool kernels_built() {
  return true;
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

Status adamw_step(const AdamWParams& params, const AdamWSlice& slice, void* stream) {
  STRATA_TRY(validate(params));
  STRATA_TRY(validate(slice));
  if (slice.n == 0) return Status::ok();
  const AdamWConstants c = derive_constants(params);
  const bool l2 = c.l2 != 0.0f;
  cudaError_t error;
  switch (slice.grad_dtype) {
    case DType::kFloat32:
      error = dispatch_out<0>(c, slice, l2, as_stream(stream));
      break;
    case DType::kBFloat16:
      error = dispatch_out<1>(c, slice, l2, as_stream(stream));
      break;
    default:
      error = dispatch_out<2>(c, slice, l2, as_stream(stream));
      break;
  }
  return cuda_status(error, "launching the AdamW kernel");
}

Status grad_stats_begin(void* workspace, void* stream) {
  if (workspace == nullptr || !aligned(workspace, 8)) {
    return invalid_argument("CUDA gradient check: the workspace is null or not 8-byte aligned");
  }
  return cuda_status(cudaMemsetAsync(workspace, 0, kGradStatsWorkspaceBytes, as_stream(stream)),
                     "clearing the gradient-check workspace");
}

Status grad_stats_add(const GradSlice& slice, void* workspace, void* stream) {
  STRATA_TRY(validate(slice));
  if (workspace == nullptr || !aligned(workspace, 8)) {
    return invalid_argument("CUDA gradient check: the workspace is null or not 8-byte aligned");
  }
  if (slice.n == 0) return Status::ok();
  auto* partials = static_cast<double*>(workspace);
  const auto blocks = static_cast<unsigned>(kGradStatsBlocks);
  switch (slice.dtype) {
    case DType::kFloat32:
      sum_squares_kernel<0>
          <<<blocks, kThreads, 0, as_stream(stream)>>>(slice.data, slice.n, partials);
      break;
    case DType::kBFloat16:
      sum_squares_kernel<1>
          <<<blocks, kThreads, 0, as_stream(stream)>>>(slice.data, slice.n, partials);
      break;
    default:
      sum_squares_kernel<2>
          <<<blocks, kThreads, 0, as_stream(stream)>>>(slice.data, slice.n, partials);
      break;
  }
  return cuda_status(cudaGetLastError(), "launching the gradient-check kernel");
}

Status grad_stats_finish(void* workspace, void* stream) {
  if (workspace == nullptr || !aligned(workspace, 8)) {
    return invalid_argument("CUDA gradient check: the workspace is null or not 8-byte aligned");
  }
  finish_kernel<<<1, static_cast<unsigned>(kGradStatsBlocks), 0, as_stream(stream)>>>(
      static_cast<double*>(workspace));
  return cuda_status(cudaGetLastError(), "launching the gradient-check reduction");
}

const double* grad_stats_result(const void* workspace) {
  return static_cast<const double*>(workspace) + kGradStatsBlocks;
}

Status grad_stats_read(const void* workspace, GradStats* out, void* stream) {
  if (workspace == nullptr || out == nullptr) {
    return invalid_argument("CUDA gradient check: null workspace or output");
  }
  double sum = 0;
  STRATA_TRY(cuda_status(cudaMemcpyAsync(&sum, grad_stats_result(workspace), sizeof sum,
                                         cudaMemcpyDeviceToHost, as_stream(stream)),
                         "copying the gradient-check result"));
  STRATA_TRY(cuda_status(cudaStreamSynchronize(as_stream(stream)),
                         "waiting for the gradient-check result"));
  out->sum_squares = sum;
  out->found_nonfinite = !std::isfinite(sum);
  return Status::ok();
}

}  // namespace strata::optim::cuda
