// The NF4 dequantization kernel. Each element is __fmul_rn(codebook[code], absmax), the one
// rounding the CPU paths make, then half_convert.h's narrowing, so GPU and CPU write the same
// bits. Aligned buffers take a kernel that decodes 8 elements per thread from one 4-byte load of
// codes with 16-byte stores; others, one element per thread. Written in C++17 (see
// optim/CMakeLists.txt on nvcc's standard).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "optim/half_convert.h"
#include "quant/nf4_cuda.h"

namespace strata::quant::cuda {
namespace {

constexpr int kThreads = 256;
// Enough resident blocks to saturate HBM on the largest GPUs; the loops stride over the rest.
constexpr unsigned kMaxBlocks = 8192;
constexpr uint64_t kElementsPerThread = 8;

// Passed by value into the kernel's parameter space, then copied to shared memory: neighbouring
// threads read different entries, which constant memory would serialize.
struct Codebook {
  float value[16];
};

Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::ok();
  return Status::error(STRATA_E_DEVICE, std::string("NF4 CUDA dequantize: ") + what + ": " +
                                            cudaGetErrorName(error) + " (" +
                                            cudaGetErrorString(error) + ")");
}

__device__ __forceinline__ void load_codebook(const Codebook& book, float* table) {
  if (threadIdx.x < 16) table[threadIdx.x] = book.value[threadIdx.x];
  __syncthreads();
}

// A scale at any alignment, as 4 little-endian bytes.
__device__ __forceinline__ float scale_at(const unsigned char* absmax, uint64_t block) {
  const unsigned char* p = absmax + kNf4AbsmaxBytes * block;
  return __uint_as_float(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

template <int kOut>
__device__ __forceinline__ uint16_t narrow(float value) {
  if constexpr (kOut == 1) return optim::float_to_bf16(value);
  return optim::float_to_fp16(value);
}

template <int kOut>
__device__ __forceinline__ void decode_one(const float* table, const unsigned char* absmax,
                                           const unsigned char* codes, void* dst, uint64_t i) {
  const unsigned code = (codes[i / 2] >> (4 * (i & 1))) & 0xFu;
  const float value = __fmul_rn(table[code], scale_at(absmax, i / kNf4BlockElements));
  if constexpr (kOut == 0) {
    static_cast<float*>(dst)[i] = value;
  } else {
    static_cast<uint16_t*>(dst)[i] = narrow<kOut>(value);
  }
}

template <int kOut>
__global__ void dequantize_elements(Codebook book, const unsigned char* __restrict__ absmax,
                                    const unsigned char* __restrict__ codes, uint64_t n,
                                    void* __restrict__ dst) {
  __shared__ float table[16];
  load_codebook(book, table);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    decode_one<kOut>(table, absmax, codes, dst, i);
  }
}

// Launched only when the scales and codes are 4-byte aligned and dst 16-byte aligned. Nibble k of
// the little-endian word g is element 8g + k; the 8 elements share one block (8 divides 64).
template <int kOut>
__global__ void dequantize_vec8(Codebook book, const unsigned char* __restrict__ absmax,
                                const unsigned char* __restrict__ codes, uint64_t n,
                                void* __restrict__ dst) {
  __shared__ float table[16];
  load_codebook(book, table);
  const uint64_t groups = n / kElementsPerThread;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const auto* scales = reinterpret_cast<const float*>(absmax);
  const auto* words = reinterpret_cast<const uint32_t*>(codes);
  for (uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += stride) {
    const uint32_t packed = words[g];
    const float scale = scales[g / (kNf4BlockElements / kElementsPerThread)];
    float v[kElementsPerThread];
    for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(table[(packed >> (4 * k)) & 0xFu], scale);
    if constexpr (kOut == 0) {
      auto* out = reinterpret_cast<float4*>(dst) + 2 * g;
      out[0] = make_float4(v[0], v[1], v[2], v[3]);
      out[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint32_t w[4];
      for (int k = 0; k < 4; ++k) {
        w[k] = static_cast<uint32_t>(narrow<kOut>(v[2 * k])) |
               static_cast<uint32_t>(narrow<kOut>(v[2 * k + 1])) << 16;
      }
      reinterpret_cast<uint4*>(dst)[g] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  // The last n % 8 elements, one per thread of the first block.
  if (blockIdx.x == 0 && threadIdx.x < n % kElementsPerThread) {
    decode_one<kOut>(table, absmax, codes, dst, groups * kElementsPerThread + threadIdx.x);
  }
}

bool aligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Memory a kernel on the current device may read and write: its own, managed, or mapped pinned
// host memory. Pageable host memory (and anything unknown to CUDA) is refused here rather than
// faulting on the device, which would poison the caller's CUDA context.
Status check_addressable(const char* name, const void* ptr) {
  cudaPointerAttributes attributes{};
  cudaError_t error = cudaPointerGetAttributes(&attributes, ptr);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so that the next call does not report it
    return cuda_status(error, (std::string("looking up ") + name).c_str());
  }
  int device = 0;
  STRATA_TRY(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  const std::string what = std::string("NF4 CUDA dequantize: ") + name;
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
      if (attributes.device == device) return Status::ok();
      return invalid_argument(what + " is memory of device " + std::to_string(attributes.device) +
                              ", not of the current device " + std::to_string(device));
    case cudaMemoryTypeManaged:
      return Status::ok();
    case cudaMemoryTypeHost:
      if (attributes.devicePointer == ptr) return Status::ok();
      return invalid_argument(what +
                              " is pinned host memory that is not mapped at the same "
                              "address on the device");
    default:
      return invalid_argument(what + " is not memory the GPU can address (pageable host memory?)");
  }
}

template <int kOut>
cudaError_t launch(const unsigned char* absmax, const unsigned char* codes, uint64_t n, void* dst,
                   bool vec8, cudaStream_t stream) {
  Codebook book{};
  for (int k = 0; k < 16; ++k) book.value[k] = kNf4Codebook[k];
  const uint64_t work = vec8 ? std::max<uint64_t>(n / kElementsPerThread, 1) : n;
  const unsigned blocks =
      static_cast<unsigned>(std::min<uint64_t>((work + kThreads - 1) / kThreads, kMaxBlocks));
  if (vec8) {
    dequantize_vec8<kOut><<<blocks, kThreads, 0, stream>>>(book, absmax, codes, n, dst);
  } else {
    dequantize_elements<kOut><<<blocks, kThreads, 0, stream>>>(book, absmax, codes, n, dst);
  }
  return cudaGetLastError();
}

}  // namespace

bool nf4_kernels_built() {
  return true;
}

Status nf4_dequantize_range(const Nf4Packed& src, uint64_t first, uint64_t n, void* dst,
                            uint64_t dst_bytes, DType dst_dtype, void* stream) {
  STRATA_TRY(detail::check_dequantize_arguments("NF4 CUDA dequantize", src, first, n, dst,
                                                dst_bytes, dst_dtype));
  // The scalar kernel reads src byte by byte, but stores whole elements.
  if (!aligned(dst, dtype_size(dst_dtype))) {
    return invalid_argument("NF4 CUDA dequantize: dst is not aligned to its dtype's " +
                            std::to_string(dtype_size(dst_dtype)) + " bytes");
  }
  STRATA_TRY(check_addressable("src", src.data));
  STRATA_TRY(check_addressable("dst", dst));
  const auto* bytes = static_cast<const unsigned char*>(src.data);
  const unsigned char* absmax = bytes + kNf4AbsmaxBytes * (first / kNf4BlockElements);
  const unsigned char* codes = bytes + kNf4AbsmaxBytes * nf4_blocks(src.count) + first / 2;
  // first is a multiple of 64, so codes and absmax are 4-byte aligned whenever src is.
  const bool vec8 = aligned(src.data, 4) && aligned(dst, 16);
  const auto s = static_cast<cudaStream_t>(stream);
  cudaError_t error;
  switch (dst_dtype) {
    case DType::kFloat32:
      error = launch<0>(absmax, codes, n, dst, vec8, s);
      break;
    case DType::kBFloat16:
      error = launch<1>(absmax, codes, n, dst, vec8, s);
      break;
    default:
      error = launch<2>(absmax, codes, n, dst, vec8, s);
      break;
  }
  return cuda_status(error, "launching the kernel");
}

Status nf4_dequantize(const Nf4Packed& src, void* dst, uint64_t dst_bytes, DType dst_dtype,
                      void* stream) {
  return nf4_dequantize_range(src, 0, src.count, dst, dst_bytes, dst_dtype, stream);
}

}  // namespace strata::quant::cuda
