// NF4, the 4-bit NormalFloat format of QLoRA (Dettmers et al. 2023, "QLoRA: Efficient Finetuning
// of Quantized LLMs", section 3 and appendix E), for the frozen base weights of a QLoRA run: 4 bits
// per weight plus one fp32 scale per 64 weights (4.5 bits per weight, 3.6x smaller than bf16).
// Weights are quantized once and dequantized once per layer per forward and backward, so the
// quantizer is plain exact scalar code and the dequantizer has scalar, AVX2, AVX-512 and CUDA
// paths that all give the same bits (docs/quantization.md).
//
// FORMAT CONTRACT (the bytes as they are stored, moved and uploaded; all multi-byte values
// little-endian). A tensor of `count` elements x[0 .. count) is cut into blocks of
// kNf4BlockElements = 64 consecutive elements: block b holds x[64b .. min(64b + 64, count)), so
// only the last block may be short. With blocks = ceil(count / 64), the packed buffer is one
// contiguous run of nf4_packed_bytes(count) = 4 * blocks + ceil(count / 2) bytes:
//   [0, 4 * blocks)              absmax[b], b < blocks: IEEE binary32, the largest |x| of block b
//                                in fp32 (exact: a maximum never rounds). Finite and >= +0.
//   [4 * blocks, packed bytes)   codes: byte j holds element 2j's code in its LOW nibble (bits
//                                0-3) and element 2j+1's in its HIGH nibble (bits 4-7). When
//                                count is odd the last byte's high nibble is 0.
// Code k of an element of block b decodes to kNf4Codebook[k] * absmax[b], the fp32 product
// rounded to nearest even; a bf16 or fp16 output is that fp32 value rounded to nearest even into
// the 16-bit format (optim/half_convert.h). The buffer has no header and does not record count:
// the owner keeps it beside the buffer (it is the tensor's element count).
//
// Quantization: code(x) is the index of the codebook entry nearest to x / absmax, decided exactly
// (x is compared with the exact midpoints between neighbouring entries scaled by absmax, not with
// a rounded quotient); a tie goes to the lower index. 0 maps to code 7 (exactly 0), |x| = absmax
// to code 0 or 15 (exactly -absmax or +absmax). A block of zeros has absmax 0 and every code 7,
// decoding to +0 (the sign of a zero is not kept). NaN or infinity in the input is an error.
//
// ERROR BOUND, for every element x of a block with scale a = absmax[b], dequantized to y:
//   |x - y| <= a * E + u * |y| + eta
// with E = nf4_max_abs_error_fraction() = (kNf4Codebook[1] - kNf4Codebook[0]) / 2
// = 0.15190359950065613 (half the largest gap between neighbouring codes: the one between -1 and
// -0.696...; exact nearest-code selection keeps |x - code * a| <= a * gap / 2), and (u, eta) the
// rounding of the output (each rounding to nearest even errs by at most 2^-p of the rounded value,
// p the format's significant bits, or half the smallest subnormal):
//   fp32: u = 2^-24,          eta = 2^-150   (the one rounding of the product)
//   bf16: u = 2^-8 + 2^-23,   eta = 2^-133   (the product's fp32 rounding, then bf16's)
//   fp16: u = 2^-11 + 2^-23,  eta = 2^-24    (the same with fp16's)
// nf4_error_bound() evaluates the right-hand side. The bound is reached: an x just off the
// midpoint of -1 and kNf4Codebook[1] errs by a * E to within one ulp of x.
//
// Overflow: a 16-bit output cannot hold every fp32 scale (fp16 ends at 65504, bf16 at about
// 3.39e38), so on the CPU a block whose absmax would round to infinity in the output dtype (fp16:
// absmax >= 65520) is refused (STRATA_E_INVALID) instead of decoded to infinities; the CUDA
// kernel, which does not read the scales on the host, writes the infinities (nf4_cuda.h). With
// that, the bound holds for every element written.
//
// Thread safety: every function here is a pure function of its arguments; any thread, any number
// at once, as long as no call writes a buffer another reads.
#pragma once

#include <cstdint>
#include <optional>

#include "common/status.h"
#include "optim/simd_level.h"
#include "vocabulary/tensor_spec.h"

namespace strata::quant {

inline constexpr uint64_t kNf4BlockElements = 64;
inline constexpr uint64_t kNf4AbsmaxBytes = 4;
// The code of 0; a block of zeros is all this code.
inline constexpr unsigned kNf4ZeroCode = 7;
// Larger counts are refused: sizes stay far from uint64_t overflow, and no tier holds a tensor
// of 2^56 elements (32 PiB packed).
inline constexpr uint64_t kNf4MaxElements = uint64_t{1} << 56;

// The NF4 code values, from the paper (section 3, "4-bit NormalFloat Quantization"): quantiles of
// the standard normal distribution N(0, 1), asymmetric so that 0 is represented exactly:
//   offset   = 1 - (1/32 + 1/30) / 2 = 0.9677083 (the paper's: it keeps the outermost quantiles
//              finite; to 7 digits, as the reference implementation writes it)
//   positive = Phi^-1(p) for the first 8 of 9 probabilities p evenly spaced from offset down to
//              0.5 (the 9th, 0.5, is 0)
//   negative = -Phi^-1(p) for the first 7 of 8 probabilities evenly spaced from offset to 0.5
//   codebook = sort(positive + {0} + negative) / max, so it spans [-1, 1] with 0 at index 7.
// The constants are the fp32 values the paper lists in appendix E. The recipe gives them bit for
// bit when the evenly spaced probabilities are fp32 numbers (as the reference implementation's
// fp32 linspace makes them), the quantiles are computed in double and rounded to fp32, and the
// division is done in fp32; computing everything in double instead moves most entries by a few
// fp32 ulps (up to 2e-7). tests/quant/nf4_codebook.py recomputes them and checks this table.
inline constexpr float kNf4Codebook[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

constexpr uint64_t nf4_blocks(uint64_t count) {
  return (count + kNf4BlockElements - 1) / kNf4BlockElements;
}

// The packed size of `count` elements (the contract above); 0 when count is 0 or above
// kNf4MaxElements, which no call accepts.
constexpr uint64_t nf4_packed_bytes(uint64_t count) {
  if (count == 0 || count > kNf4MaxElements) return 0;
  return kNf4AbsmaxBytes * nf4_blocks(count) + (count + 1) / 2;
}

// E of the error bound: half the largest gap between neighbouring codebook values, in units of
// the block's absmax.
double nf4_max_abs_error_fraction();

// The right-hand side of the error bound for an element of a block with this absmax that
// dequantized to `decoded` in `dtype` (kFloat32, kBFloat16 or kFloat16; any other: -1).
double nf4_error_bound(float absmax, float decoded, DType dtype);

// A packed NF4 buffer as the caller holds it: `bytes` must equal nf4_packed_bytes(count).
struct Nf4Packed {
  const void* data = nullptr;
  uint64_t bytes = 0;
  uint64_t count = 0;
};

// Quantizes `count` elements of src (kFloat32, kBFloat16 or kFloat16, natural alignment not
// needed) into dst, which must hold nf4_packed_bytes(count) bytes (dst_bytes may be larger; only
// that many are written). Deterministic and exact. STRATA_E_INVALID, with dst untouched, for
// count 0 or above kNf4MaxElements, a null pointer, dst_bytes too small, another dtype, or a NaN
// or infinity in src (the message names the first such element). src and dst must not overlap.
Status nf4_quantize(const void* src, DType src_dtype, uint64_t count, void* dst,
                    uint64_t dst_bytes);

// Dequantizes all of src into dst (kFloat32, kBFloat16 or kFloat16; dst_bytes at least count
// times its size). `level` forces a SIMD path (STRATA_E_UNSUPPORTED when optim::cpu_supports
// says no); without it the best one runs. Every level writes the same bits.
// STRATA_E_INVALID, with dst untouched, for bad sizes (src.bytes != nf4_packed_bytes(src.count),
// count 0, dst too small), a null pointer, another dtype, or a buffer that is not NF4 data
// (an absmax that is not a finite number >= 0, a non-zero padding nibble) or a block whose
// absmax overflows the output dtype (the overflow rule above).
Status nf4_dequantize(const Nf4Packed& src, void* dst, uint64_t dst_bytes, DType dst_dtype,
                      std::optional<optim::SimdLevel> level = std::nullopt);

// Dequantizes elements [first, first + n) of src into dst[0 .. n): first must be a multiple of
// kNf4BlockElements and the range inside src.count, n >= 1 and of any size. Splitting a tensor
// into such ranges (one per thread, or per chunk of a streamed layer) writes exactly the bits one
// whole-tensor call writes. Otherwise as nf4_dequantize; only the blocks of the range are checked.
Status nf4_dequantize_range(const Nf4Packed& src, uint64_t first, uint64_t n, void* dst,
                            uint64_t dst_bytes, DType dst_dtype,
                            std::optional<optim::SimdLevel> level = std::nullopt);

// The checks nf4_dequantize makes of src before decoding, over the whole buffer, for a caller
// that dequantizes elsewhere (the CUDA kernel does not check scales): run it once on the host
// before uploading a buffer.
Status nf4_check_packed(const Nf4Packed& src, DType dst_dtype);

namespace detail {
// The argument checks shared by the host and device dequantizers, made without reading src's
// bytes: sizes, range, pointers, dtype. `who` starts the message.
Status check_dequantize_arguments(const char* who, const Nf4Packed& src, uint64_t first, uint64_t n,
                                  const void* dst, uint64_t dst_bytes, DType dst_dtype);
}  // namespace detail

}  // namespace strata::quant
