// NF4 dequantization on the GPU, callable from plain C++ (no CUDA headers needed): a packed NF4
// buffer (nf4.h's format) that is already in GPU-addressable memory is decoded into fp32, bf16 or
// fp16 device memory on a stream. The kernel computes kNf4Codebook[code] * absmax with one
// round-to-nearest-even fp32 multiplication (__fmul_rn, built with --fmad=false) and narrows with
// optim/half_convert.h, so it writes the same bits as the CPU paths of nf4_dequantize.
//
// What the GPU path does not do: read the scales on the host. A buffer that is not NF4 data
// (a NaN or negative absmax) decodes to garbage, and a block whose absmax overflows a 16-bit
// output decodes to infinities where the CPU path returns STRATA_E_INVALID; run
// nf4_check_packed once on the host before uploading to rule both out.
//
// In a build without nvcc the functions exist and return STRATA_E_UNSUPPORTED;
// nf4_kernels_built() says which. Streams are cudaStream_t passed as void* (nullptr: the legacy
// default stream). Every call only enqueues work; errors of the kernel itself surface on the
// stream, as for any CUDA launch. Any thread.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "quant/nf4.h"

namespace strata::quant::cuda {

// Whether this build contains the kernel.
bool nf4_kernels_built();

// Dequantizes all of src into dst. src.data and dst must be memory of the current device, managed
// memory, or mapped pinned host memory (STRATA_E_INVALID otherwise, e.g. for pageable host
// memory); src may sit at any byte, dst must be aligned to its dtype's size (unlike on the CPU);
// dst_bytes is what the caller allocated at dst. The argument checks are
// nf4_dequantize's (detail::check_dequantize_arguments), made without reading the buffer.
// STRATA_E_DEVICE when CUDA reports an error.
Status nf4_dequantize(const Nf4Packed& src, void* dst, uint64_t dst_bytes, DType dst_dtype,
                      void* stream);

// Elements [first, first + n) into dst[0 .. n), as nf4_dequantize_range.
Status nf4_dequantize_range(const Nf4Packed& src, uint64_t first, uint64_t n, void* dst,
                            uint64_t dst_bytes, DType dst_dtype, void* stream);

}  // namespace strata::quant::cuda
